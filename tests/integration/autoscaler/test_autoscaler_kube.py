"""Against the Kubernetes API emulator (tests/kubeemu.py, kmock): GPU arbitration suspends a lower-priority
TrainingJob with Events on both objects and later resumes it; the Kubernetes actuator patches pool replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubeemu  # tests/conftest.py puts tests/ on sys.path
import pytest

from llmfleet.api.contracts import AUTOSCALER_STATE_ANNOTATION, SUSPENDED_BY_ANNOTATION
from llmfleet.autoscaler.actuation import KubernetesActuator
from llmfleet.autoscaler.arbitration import ServingNeed
from llmfleet.autoscaler.kube import apply_arbitration
from llmfleet.kube.client import KubeClient

ROOT = Path(__file__).resolve().parents[3]
TJ, IS = "llmfleet.io/v1alpha1/trainingjobs", "llmfleet.io/v1alpha1/inferenceservices"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


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


async def test_arbitration_suspends_then_resumes_lower_priority_job() -> None:
    async with kubeemu.serve(crds=ROOT / "crds") as (emu, url):
        client = KubeClient(server=url, headers={})
        try:
            isvc = await client.request("POST", "/apis/llmfleet.io/v1alpha1/namespaces/default/inferenceservices", body=ISVC)
            for name, prio in (("low", -10), ("high", 100)):
                await client.request("POST", "/apis/llmfleet.io/v1alpha1/namespaces/default/trainingjobs",
                                     body=job(name, prio))
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
        finally:
            await client.close()


async def test_kubernetes_actuator_patches_pool_replicas_and_state_annotation() -> None:
    from kubernetes import client as k8s

    async with kubeemu.serve(crds=ROOT / "crds") as (emu, url):
        kc = KubeClient(server=url, headers={})
        try:
            await kc.request("POST", "/apis/llmfleet.io/v1alpha1/namespaces/default/inferenceservices", body=ISVC)
        finally:
            await kc.close()
        conf = k8s.Configuration()
        conf.host = url
        api = k8s.ApiClient(conf)
        try:
            act = KubernetesActuator("chat", "default", api)
            await act.set_replicas({"primary": 5, "small": 2}, reason="test", state_json='{"primary":{}}')
            obj = emu.get(IS, "default", "chat")
            assert obj["spec"]["replicas"] == 5
            assert obj["spec"]["fallback"]["pools"][0]["replicas"] == 2
            assert obj["metadata"]["annotations"][AUTOSCALER_STATE_ANNOTATION] == '{"primary":{}}'
            with pytest.raises(KeyError, match="nope"):
                await act.set_replicas({"nope": 1}, reason="test")
        finally:
            api.close()
