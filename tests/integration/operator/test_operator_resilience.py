"""Operator restarts mid-reconcile, two replicas with kopf peering, and training -> serving promotion."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kmock
import pytest
from operator_testkit import OPERATOR_TOKEN, eventually, isvc_manifest, tj_manifest

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
    await eventually(lambda: standby.runtime.applied_rv)  # stored before the applying client records its answer


async def _service_and_promoting_job(emu: Any, operators: Any, pool: str) -> None:
    """An operator, the InferenceService `chat` (pools primary, student) and a running TrainingJob `train`
    that promotes pvc://models/distilled-v2 into `pool`."""
    await operators()
    await emu.put(ISVC, isvc_manifest())
    await eventually(lambda: emu.get(DEPLOY, "ml", "chat-student"))
    promote = {"path": "pvc://models/distilled-v2", "promoteTo": {"inferenceService": "chat", "pool": pool}}
    await emu.put(TJ, tj_manifest(output=promote))
    await eventually(lambda: emu.get(JOBS, "ml", "train-r0"))  # training is not held up by the promotion


async def test_promotion_rolls_out_then_rolls_back(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await _service_and_promoting_job(emu, operators, "student")
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
    # kopf posts Events in the background, after the patches they follow: poll for them.
    def reasons() -> set[str]:
        return {e["reason"] for e in emu.list("v1/events", "ml")}

    await eventually(lambda: {"PromotionStarted", "PromotionSucceeded"} <= reasons())

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


async def test_promotion_into_a_missing_pool_is_a_condition_and_an_event(cluster: Any, operators: Any) -> None:
    """A TrainingJob promoting into a pool (or InferenceService) that does not exist keeps training; it gets
    PromotionTarget=False and one Warning Event, not a crash loop, and recovers once the target exists."""
    emu, _ = cluster
    await _service_and_promoting_job(emu, operators, "studnet")

    def target_condition() -> Any:
        conds = emu.get(TJ, "ml", "train")["status"].get("conditions") or []
        return next((c for c in conds if c["type"] == "PromotionTarget"), None)

    cond = await eventually(target_condition)
    assert cond["status"] == "False" and cond["reason"] == "PoolNotFound"
    assert "'studnet'" in cond["message"] and "student" in cond["message"]

    # The job succeeds while the pool is still missing: the promotion waits, nothing is patched.
    await emu.patch(JOBS, "ml", "train-r0", {"status": {"succeeded": 2}}, "status")
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"].get("phase") == "Succeeded")
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"].get("promotion", {}).get("state") == "Pending")
    rv = emu.get(TJ, "ml", "train")["metadata"]["resourceVersion"]
    await asyncio.sleep(2.5)  # a few timer ticks (1 s): no status churn, no Event storm
    assert emu.get(TJ, "ml", "train")["metadata"]["resourceVersion"] == rv
    warnings = [e for e in emu.list("v1/events", "ml") if e["reason"] == "PromotionTargetMissing"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert warnings[0]["involvedObject"]["kind"] == "TrainingJob"
    assert emu.get(ISVC, "ml", "chat")["spec"]["fallback"]["pools"][0]["model"]["path"] == "/models/small"

    # Fixing the TrainingJob's target starts the promotion.
    await emu.patch(TJ, "ml", "train", {"spec": {"output": {"promoteTo": {"pool": "student"}}}})
    await eventually(lambda: target_condition()["status"] == "True")
    await eventually(
        lambda: emu.get(ISVC, "ml", "chat")["spec"]["fallback"]["pools"][0]["model"]["path"] == "pvc://models/distilled-v2")
    await eventually(lambda: {"PromotionTargetFound", "PromotionStarted"} <= {e["reason"] for e in emu.list("v1/events", "ml")})


async def test_promotion_into_a_missing_inferenceservice(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    promote = {"path": "pvc://models/x", "promoteTo": {"inferenceService": "nope"}}
    await emu.put(TJ, tj_manifest(output=promote))

    def reason() -> Any:
        conds = emu.get(TJ, "ml", "train")["status"].get("conditions") or []
        return next((c["reason"] for c in conds if c["type"] == "PromotionTarget"), None)

    assert await eventually(reason) == "InferenceServiceNotFound"
    await emu.put(ISVC, isvc_manifest(name="nope"))
    await eventually(lambda: reason() == "Found")



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


async def test_two_replicas_of_equal_priority_one_acts(cluster: Any, operators: Any,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """kopf pauses every peer of equal priority; the operator orders equal --priority values by identity, so
    exactly one replica acts, and the other takes over when it stops."""
    caplog.set_level(logging.INFO, logger="kopf")
    emu, _ = cluster
    await emu.put("kopf.dev/v1/clusterkopfpeerings", {"metadata": {"name": "llmfleet"}, "status": {}})
    peering = ("kopf.dev/v1/clusterkopfpeerings", None, "llmfleet")
    ops = {name: await operators(standalone=False, peering="llmfleet", priority=0, identity=name)
           for name in ("replica-a", "replica-b")}
    await eventually(lambda: len(emu.get(*peering).get("status") or {}) == 2)
    priorities = {k: v["priority"] for k, v in emu.get(*peering)["status"].items()}
    top = max(priorities, key=priorities.__getitem__)
    # Peering is eventually consistent: both records being stored is not the lower replica having read its
    # peer's. Until kopf there pauses, it acts as the highest it knows (a start-up race, not a second leader).
    await eventually(lambda: any(r.getMessage().startswith("Pausing operations in favour of") and top in r.getMessage()
                                 for r in caplog.records), timeout=20)

    await emu.put(ISVC, isvc_manifest(name="one"))
    await eventually(lambda: emu.get(DEPLOY, "ml", "one-router"), timeout=20)
    # the object is stored before the applying client records its answer
    await eventually(lambda: any(op.runtime.applied_rv for op in ops.values()))
    acting = [name for name, op in ops.items() if op.runtime.applied_rv]
    assert acting == [top], acting

    await ops[acting[0]].stop()
    standby = next(op for name, op in ops.items() if name != acting[0])
    await emu.put(ISVC, isvc_manifest(name="two"))
    await eventually(lambda: emu.get(DEPLOY, "ml", "two-router"), timeout=20)
    await eventually(lambda: standby.runtime.applied_rv)  # stored before the applying client records its answer


async def test_a_live_peer_with_the_same_kopf_priority_is_refused_at_start(cluster: Any) -> None:
    """Only a hash collision of two identities can tie now: the operator refuses to start (one error line in
    `llmfleet operator`, exit 1) instead of pausing with its peer."""
    import datetime

    import kopf

    from llmfleet.operator.run import PeeringConflict, RunOptions, kopf_priority, run_async

    emu, url = cluster
    now = datetime.datetime.now(datetime.UTC).isoformat()
    taken = {"priority": kopf_priority(0, "me"), "lifetime": 60, "lastseen": now}
    await emu.put("kopf.dev/v1/clusterkopfpeerings",
                  {"metadata": {"name": "llmfleet"}, "status": {"someone-else": taken}})
    opts = RunOptions(peering="llmfleet", priority=0, identity="me", metrics_port=None, liveness_port=None,
                      autoscaler=False, connection=kopf.ConnectionInfo(server=url, token=OPERATOR_TOKEN))
    with pytest.raises(PeeringConflict, match="live peer 'someone-else' has the same kopf priority"):
        await asyncio.wait_for(run_async(opts), 20)
