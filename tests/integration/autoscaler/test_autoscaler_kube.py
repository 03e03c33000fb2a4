"""Against the Kubernetes API emulator (tests/kubeemu.py, kmock): GPU arbitration suspends a lower-priority
TrainingJob with Events on both objects and later resumes it; the Kubernetes actuator patches pool replicas,
lists a pool's pods and drains one; pending GPUs count unschedulable pods."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubeemu  # tests/conftest.py puts tests/ on sys.path
import pytest
import rbac_enforcer

from llmfleet.api.contracts import (
    AUTOSCALER_STATE_ANNOTATION,
    DELETION_COST_ANNOTATION,
    DRAINING_LABEL,
    SERVING_LABEL,
    SUSPENDED_BY_ANNOTATION,
)
from llmfleet.api.loader import parse_resource
from llmfleet.autoscaler.actuation import ObservedReplica
from llmfleet.autoscaler.arbitration import ServingNeed
from llmfleet.autoscaler.kube import KubernetesActuator, apply_arbitration, pending_gpus
from llmfleet.kube.client import ApiError, KubeClient
from llmfleet.operator.rbac import OPERATOR_RULES

ROOT = Path(__file__).resolve().parents[3]
TJ, IS = "llmfleet.io/v1alpha1/trainingjobs", "llmfleet.io/v1alpha1/inferenceservices"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


TOKEN = "llmfleet-operator"


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, KubeClient]]:
    """The emulator with llmfleet's CRDs, and a client of it with the operator's RBAC (the autoscaler runs in
    the operator process): a request the chart does not grant is answered 403 and fails the test. The tests
    set objects up directly in the emulator (`emu.put`), as a cluster admin would."""
    async with kubeemu.serve(crds=ROOT / "crds") as (emu, url):
        enforcer = rbac_enforcer.enforce(emu, OPERATOR_RULES, token=TOKEN)
        client = KubeClient.for_server(url, token=TOKEN)
        try:
            yield emu, client
        finally:
            await client.close()
        enforcer.assert_clean()


ISVC = {
    "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
    "metadata": {"name": "chat", "namespace": "default"},
    "spec": {"model": {"path": "/m"}, "replicas": 2, "maxReplicas": 8, "resources": {"gpus": 1},
             "autoscaling": {"gpuBudget": 2},
             "fallback": {"pools": [{"name": "small", "model": {"path": "/s"}, "replicas": 0}]}},
}


def job(name: str, priority: int) -> dict[str, Any]:
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name, "namespace": "default"},
            "spec": {"model": {"preset": "tiny"}, "workers": {"count": 2, "gpusPerWorker": 2},
                     "scheduling": {"priority": priority}}}


def events_for(emu: Any, name: str) -> list[str]:
    return [e["reason"] for e in emu.list("v1/events", "default") if e["involvedObject"]["name"] == name]


async def test_arbitration_suspends_then_resumes_lower_priority_job(cluster: tuple[Any, KubeClient]) -> None:
    emu, client = cluster
    isvc = await emu.put(IS, ISVC)
    for name, prio in (("low", -10), ("high", 100)):
        await emu.put(TJ, job(name, prio))
    burning = ServingNeed("chat", priority=0, burning=True, gpus_missing=3, gpus_surplus=0)
    actions = await apply_arbitration(client, isvc, burning)
    assert [(a.job, a.action) for a in actions] == [("low", "suspend")]
    low = emu.get(TJ, "default", "low")
    assert low["spec"]["suspend"] is True
    assert low["metadata"]["annotations"][SUSPENDED_BY_ANNOTATION] == "chat"
    assert emu.get(TJ, "default", "high")["spec"].get("suspend", False) is False
    assert "SuspendedForServing" in events_for(emu, "low")
    assert "SuspendedForServing" in events_for(emu, "chat")
    # still burning: nothing more to do (the job is already suspended), no resume
    assert await apply_arbitration(client, isvc, burning) == []
    # back within budget with room for the job's 4 GPUs: resumed, annotation gone, Events again
    healthy = ServingNeed("chat", priority=0, burning=False, gpus_missing=0, gpus_surplus=4)
    actions = await apply_arbitration(client, isvc, healthy)
    assert [(a.job, a.action) for a in actions] == [("low", "resume")]
    low = emu.get(TJ, "default", "low")
    assert low["spec"]["suspend"] is False
    assert SUSPENDED_BY_ANNOTATION not in (low["metadata"].get("annotations") or {})
    assert "ResumedAfterServing" in events_for(emu, "low")
    assert "ResumedAfterServing" in events_for(emu, "chat")


def pod(name: str, pool: str, *, ready: bool = True, ip: str | None = "10.0.0.1", phase: str = "Running",
        unschedulable: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if ip:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "status": status,
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"llmfleet.io/inferenceservice": "chat", "llmfleet.io/pool": pool}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}


async def test_kubernetes_actuator_patches_pool_replicas_and_state_annotation(cluster: tuple[Any, KubeClient]) -> None:
    emu, client = cluster
    await emu.put(IS, ISVC)
    act = KubernetesActuator("chat", "default", client)
    await act.set_replicas({"primary": 5, "small": 2}, reason="test", state_json='{"primary":{}}')
    obj = emu.get(IS, "default", "chat")
    assert obj["spec"]["replicas"] == 5
    assert obj["spec"]["fallback"]["pools"][0]["replicas"] == 2
    assert obj["metadata"]["annotations"][AUTOSCALER_STATE_ANNOTATION] == '{"primary":{}}'
    with pytest.raises(KeyError, match="nope"):
        await act.set_replicas({"nope": 1}, reason="test")
    gone = KubernetesActuator("gone", "default", client)
    with pytest.raises(ApiError) as err:
        await gone.set_replicas({"primary": 1}, reason="test")
    assert err.value.status == 404


async def test_kubernetes_actuator_lists_and_drains_pods(cluster: tuple[Any, KubeClient]) -> None:
    emu, client = cluster
    await emu.put(IS, ISVC)
    for p in (pod("chat-b", "primary", ip="10.0.0.2"), pod("chat-a", "primary", ready=False),
              pod("chat-s", "small", ip=None)):
        await emu.put("v1/pods", p)
    act = KubernetesActuator("chat", "default", client, probe=_idle)
    assert await act.list_replicas("primary") == [
        ObservedReplica("primary", "chat-a", "http://10.0.0.1:8000", ready=False),
        ObservedReplica("primary", "chat-b", "http://10.0.0.2:8000", ready=True),
    ]
    assert await act.list_replicas("small") == [ObservedReplica("small", "chat-s", None, ready=True)]
    result = await act.drain_and_remove(ObservedReplica("primary", "chat-b", "http://10.0.0.2:8000"), timeout_s=1)
    assert result.drained and result.removed
    meta = emu.get("v1/pods", "default", "chat-b")["metadata"]
    assert meta["labels"][DRAINING_LABEL] == "true" and meta["labels"][SERVING_LABEL] == "false"
    assert meta["annotations"][DELETION_COST_ANNOTATION] == "-2147483647"
    assert emu.get(IS, "default", "chat")["spec"]["replicas"] == 1


async def test_pending_gpus_counts_unschedulable_pods(cluster: tuple[Any, KubeClient]) -> None:
    emu, client = cluster
    for p in (pod("p1", "primary", phase="Pending", unschedulable=True),
              pod("p2", "primary", phase="Pending"),  # pending, but scheduled (pulling the image)
              pod("p3", "primary"),
              pod("s1", "small", phase="Pending", unschedulable=True)):
        await emu.put("v1/pods", p)
    isvc = parse_resource({**ISVC, "spec": {**ISVC["spec"], "fallback": {"pools": [
        {"name": "small", "model": {"path": "/s"}, "replicas": 0, "resources": {"gpus": 2}}]}}})
    assert await pending_gpus(client, isvc) == 1 + 2
    # a pool on MIG instances: its Pending pods need no GPU that suspending training would free
    sliced = parse_resource({**ISVC, "spec": {**ISVC["spec"], "fallback": {"pools": [
        {"name": "small", "model": {"path": "/s"}, "replicas": 0,
         "resources": {"gpus": 1, "gpuType": "H200", "migProfile": "3g.71gb"}}]}}})
    assert await pending_gpus(client, sliced) == 1


async def _idle(_replica: ObservedReplica) -> float:
    return 0.0


async def test_a_missing_grant_is_refused_and_reported(cluster: tuple[Any, KubeClient]) -> None:
    """The emulator's RBAC bites: without `patch` on pods the drain is answered 403 and the denial is named
    (what the fixture's check reports when the code outgrows OPERATOR_RULES)."""
    emu, operator_client = cluster
    await emu.put(IS, ISVC)
    await emu.put("v1/pods", pod("chat-b", "primary", ip="10.0.0.2"))
    without = [{**r, "verbs": [v for v in r["verbs"] if v != "patch"]} if "pods" in r["resources"] else r
               for r in OPERATOR_RULES]
    enforcer = rbac_enforcer.enforce(emu, without, token="no-pod-patch")
    client = KubeClient.for_server(operator_client.config.cluster.server, token="no-pod-patch")
    try:
        granted = KubernetesActuator("chat", "default", operator_client)
        assert [r.name for r in await granted.list_replicas("primary")] == ["chat-b"]
        act = KubernetesActuator("chat", "default", client, probe=_idle)
        assert [r.name for r in await act.list_replicas("primary")] == ["chat-b"]  # list is still granted
        with pytest.raises(ApiError) as err:
            await act.drain_and_remove(ObservedReplica("primary", "chat-b", "http://10.0.0.2:8000"), timeout_s=1)
    finally:
        await client.close()
    assert err.value.status == 403
    assert enforcer.denied == {("patch", "", "pods")}


async def test_server_side_apply_that_creates_needs_create(cluster: tuple[Any, KubeClient]) -> None:
    """As the API server authorizes it: an apply that creates its object needs `create` besides `patch`; once
    the object exists, `patch` alone lets the same apply through."""
    emu, operator_client = cluster
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]
    enforcer = rbac_enforcer.enforce(emu, rules, token="patch-only")
    client = KubeClient.for_server(operator_client.config.cluster.server, token="patch-only")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"},
          "data": {"a": "1"}}
    try:
        with pytest.raises(ApiError) as err:
            await client.apply(cm)
        assert err.value.status == 403
        assert enforcer.denied == {("create", "", "configmaps")}
        assert emu.get("v1/configmaps", "default", "cfg") is None  # nothing was created
        await emu.put("v1/configmaps", {**cm, "data": {"a": "0"}})
        enforcer.denied.clear()
        await client.apply(cm)
    finally:
        await client.close()
    assert not enforcer.denied
    assert (emu.get("v1/configmaps", "default", "cfg") or {}).get("data") == {"a": "1"}
    # the fixture checks that its operator-token client was used within its grants
    assert await operator_client.get("llmfleet.io/v1alpha1", "InferenceService", "default", "chat") is None
