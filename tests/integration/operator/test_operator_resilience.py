"""Operator restarts mid-reconcile, two replicas with kopf peering, and training -> serving promotion."""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from operator_testkit import eventually, isvc_manifest, tj_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ISVC = "llmfleet.io/v1alpha1/inferenceservices"
TJ = "llmfleet.io/v1alpha1/trainingjobs"
JOBS = "batch/v1/jobs"
DEPLOY = "apps/v1/deployments"


async def test_restart_mid_reconcile_converges_without_duplicates(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    failures: list[str] = []

    def job_apply_fails(request: Any) -> Any:
        if request.method == "PATCH" and request.resource is not None and request.resource.plural == "jobs":
            failures.append(str(request.url))
            return kmock.KubernetesError(status=500, reason="InternalError", message="injected")
        return None

    emu.faults.append(job_apply_fails)
    first = await operators()
    await emu.put(TJ, tj_manifest())
    await emu.put(ISVC, isvc_manifest())
    # The first operator got as far as the ConfigMap, then the Job apply failed: stop it there.
    await eventually(lambda: failures and emu.get("v1/configmaps", "ml", "train-spec"))
    await eventually(lambda: emu.get(DEPLOY, "ml", "chat-router"))
    await first.stop()
    assert emu.get(JOBS, "ml", "train-r0") is None
    degraded = [c for c in emu.get(TJ, "ml", "train")["status"]["conditions"] if c["type"] == "Degraded"]
    assert degraded and degraded[0]["reason"] == "ApplyFailed"

    emu.faults.clear()
    await operators()  # a fresh operator resumes the objects
    await eventually(lambda: emu.get(JOBS, "ml", "train-r0"))
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"].get("phase") == "Pending")
    assert [j["metadata"]["name"] for j in emu.list(JOBS, "ml")] == ["train-r0"]
    names = sorted(d["metadata"]["name"] for d in emu.list(DEPLOY, "ml"))
    assert names == ["chat-primary", "chat-router", "chat-student"]
    assert emu.get(TJ, "ml", "train")["status"]["restarts"] == 0


async def test_two_replicas_only_the_leader_acts(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await emu.put("kopf.dev/v1/clusterkopfpeerings", {"metadata": {"name": "llmfleet"}, "status": {}})
    peering = ("kopf.dev/v1/clusterkopfpeerings", None, "llmfleet")
    leader = await operators(standalone=False, peering="llmfleet", priority=100, identity="leader")
    # The standby starts paused and stays paused when it finds a higher-priority peer already registered.
    await eventually(lambda: "leader" in (emu.get(*peering).get("status") or {}))
    standby = await operators(standalone=False, peering="llmfleet", priority=10, identity="standby")
    await eventually(lambda: "standby" in (emu.get(*peering).get("status") or {}))

    await emu.put(ISVC, isvc_manifest(name="one"))
    await eventually(lambda: emu.get(DEPLOY, "ml", "one-router"))
    await eventually(lambda: emu.get(ISVC, "ml", "one").get("status"))
    assert leader.runtime.applied_rv and not standby.runtime.applied_rv

    await leader.stop()  # the standby takes over
    await emu.put(ISVC, isvc_manifest(name="two"))
    await eventually(lambda: emu.get(DEPLOY, "ml", "two-router"), timeout=20)
    assert standby.runtime.applied_rv


async def test_promotion_rolls_out_then_rolls_back(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    await emu.put(ISVC, isvc_manifest())
    await eventually(lambda: emu.get(DEPLOY, "ml", "chat-student"))
    promote = {"path": "pvc://models/distilled-v2", "promoteTo": {"inferenceService": "chat", "pool": "student"}}
    await emu.put(TJ, tj_manifest(output=promote))
    await eventually(lambda: emu.get(JOBS, "ml", "train-r0"))
    await emu.patch(JOBS, "ml", "train-r0", {"status": {"succeeded": 2}}, "status")

    # The student pool's model becomes the exported one; its Deployment rolls (maxSurge 1, maxUnavailable 0).
    def rolled_spec() -> Any:
        dep = emu.get(DEPLOY, "ml", "chat-student")
        return dep["metadata"]["annotations"]["llmfleet.io/model"] == "pvc://models/distilled-v2" and dep

    dep = await eventually(rolled_spec)
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert emu.get(ISVC, "ml", "chat")["spec"]["fallback"]["pools"][0]["model"]["path"] == "pvc://models/distilled-v2"
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"].get("promotion", {}).get("state") == "RollingOut")
    gen = dep["metadata"]["generation"]
    await emu.patch(DEPLOY, "ml", "chat-student", {"status": {"observedGeneration": gen, "replicas": 1,
                                                                "updatedReplicas": 1, "readyReplicas": 1}}, "status")
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"]["promotion"]["state"] == "Succeeded")
    reasons = {e["reason"] for e in emu.list("v1/events", "ml")}
    assert {"PromotionStarted", "PromotionSucceeded"} <= reasons

    # A second promotion to the primary pool degrades TTFT during the rollout: rolled back.
    promote2 = {"path": "s3://models/bad", "promoteTo": {"inferenceService": "chat", "pool": "primary"}}
    await emu.put(TJ, tj_manifest(name="train2", output=promote2))
    await eventually(lambda: emu.get(JOBS, "ml", "train2-r0"))
    await emu.patch(ISVC, "ml", "chat", {"status": {"metrics": {"ttftP95Ms": 300.0, "stale": False}}}, "status")
    await emu.patch(JOBS, "ml", "train2-r0", {"status": {"succeeded": 2}}, "status")
    await eventually(lambda: emu.get(ISVC, "ml", "chat")["spec"]["model"]["path"] == "s3://models/bad")
    await emu.patch(ISVC, "ml", "chat", {"status": {"metrics": {"ttftP95Ms": 5000.0, "stale": False}}}, "status")
    await eventually(lambda: emu.get(ISVC, "ml", "chat")["spec"]["model"]["path"] == "/models/llama")
    await eventually(lambda: emu.get(TJ, "ml", "train2")["status"]["promotion"]["state"] == "RolledBack")
    assert "PromotionRolledBack" in {e["reason"] for e in emu.list("v1/events", "ml")}


async def test_lora_training_promotion_adds_the_adapter_without_touching_the_replicas(cluster: Any,
                                                                                   operators: Any) -> None:
    emu, _ = cluster
    await operators()
    await emu.put(ISVC, isvc_manifest(lora={"maxLoras": 2}, adapters=[{"name": "old", "uri": "/adapters/old"}]))
    dep = await eventually(lambda: emu.get(DEPLOY, "ml", "chat-primary"))
    promote = {"path": "/adapters/sql-v2", "promoteTo": {"inferenceService": "chat", "adapterName": "sql"}}
    await emu.put(TJ, tj_manifest(method="lora", lora={"baseModel": "/models/llama"}, output=promote))
    await eventually(lambda: emu.get(JOBS, "ml", "train-r0"))
    await emu.patch(JOBS, "ml", "train-r0", {"status": {"succeeded": 2}}, "status")
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"].get("promotion", {}).get("state") == "Succeeded")
    assert emu.get(ISVC, "ml", "chat")["spec"]["adapters"] == [{"name": "old", "uri": "/adapters/old"},
                                                                {"name": "sql", "uri": "/adapters/sql-v2"}]
    # the router's config lists the adapter; the replicas' Deployment keeps its template (no restart)
    await eventually(lambda: "sql-v2" in emu.get("v1/configmaps", "ml", "chat-router")["data"]["router.yaml"])
    after = emu.get(DEPLOY, "ml", "chat-primary")
    assert after["spec"]["template"] == dep["spec"]["template"]
    assert "AdapterAdded" in {e["reason"] for e in emu.list("v1/events", "ml")}
