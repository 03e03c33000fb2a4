"""llmfleet's Kubernetes client (`llmfleet.kube.KubeClient`, lightkube) against the API emulator (tests/kubeemu.py):
server-side apply and the other verbs, errors, credentials from a kopf login, CRD checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import kopf
import kubeemu  # tests/conftest.py puts tests/ on sys.path
import pytest

from llmfleet.api.contracts import API_VERSION, FIELD_MANAGER
from llmfleet.kube.client import ApiError, KubeClient, start_api_timer

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = "apps/v1/deployments"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def deployment(name: str, replicas: int = 1, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ml", "labels": {"app": name, **labels}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}}}


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, KubeClient]]:
    async with kubeemu.serve(crds=ROOT / "crds") as (emu, url):
        client = KubeClient.from_connection_info(kopf.ConnectionInfo(server=url, token="secret-token"))
        try:
            yield emu, client
        finally:
            await client.close()


async def test_verbs_round_trip_plain_dicts(cluster: tuple[Any, KubeClient]) -> None:
    emu, client = cluster
    seen: list[Any] = []
    emu.faults.append(lambda req: seen.append(
        (req.headers.get("Authorization"), req.headers.get("Content-Type"), req.params.get("fieldManager"),
         req.params.get("force"))))
    applied: list[dict[str, Any]] = []
    client.on_applied = applied.append
    timer = start_api_timer()
    out = await client.apply(deployment("a", tier="web"))
    assert type(out) is dict and out["metadata"]["resourceVersion"] and applied == [out]
    # kopf's credentials; server-side apply as the operator's field manager, forced
    assert seen[-1] == ("Bearer secret-token", "application/apply-patch+yaml", FIELD_MANAGER, "true")
    assert timer.seconds > 0
    await client.apply(deployment("b"))
    assert (await client.get("apps/v1", "Deployment", "ml", "a"))["spec"]["replicas"] == 1
    assert await client.get("apps/v1", "Deployment", "ml", "nope") is None
    assert [o["metadata"]["name"] for o in await client.list("apps/v1", "Deployment", "ml", {"tier": "web"})] == ["a"]
    assert [o["metadata"]["name"] for o in await client.list("apps/v1", "Deployment", "ml", selector="tier!=web")] == ["b"]
    await client.merge_patch("apps/v1", "Deployment", "ml", "a", {"spec": {"replicas": 3}})
    assert emu.get(DEPLOY, "ml", "a")["spec"]["replicas"] == 3
    isvc = await client.create({"apiVersion": API_VERSION, "kind": "InferenceService",
                                "metadata": {"name": "chat", "namespace": "ml"}, "spec": {"model": {"path": "/m"}}})
    assert isvc["metadata"]["uid"]
    await client.merge_patch(API_VERSION, "InferenceService", "ml", "chat", {"status": {"phase": "Ready"}}, "status")
    await client.json_patch(API_VERSION, "InferenceService", "ml", "chat",
                            [{"op": "add", "path": "/spec/replicas", "value": 2}])
    got = await client.get(API_VERSION, "InferenceService", "ml", "chat")
    assert got["status"] == {"phase": "Ready"} and got["spec"]["replicas"] == 2
    assert await client.delete("apps/v1", "Deployment", "ml", "a") is True
    assert await client.delete("apps/v1", "Deployment", "ml", "a") is False
    assert emu.get(DEPLOY, "ml", "a") is None
    assert await client.get("v1", "Namespace", None, "ml") is not None  # cluster-scoped kinds too


async def test_apply_addresses_every_kind_of_object(cluster: tuple[Any, KubeClient]) -> None:
    """Core and grouped kinds, namespaced and cluster-scoped, llmfleet's CRDs, no namespace given (default)."""
    emu, client = cluster
    paths: list[str] = []
    emu.faults.append(lambda req: paths.append(req.url.path) if req.method == "PATCH" else None)
    await client.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"},
                        "data": {"k": "v"}})
    await client.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}, "data": {}})
    await client.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                        "metadata": {"name": "r", "namespace": "ignored"}, "rules": []})
    await client.apply({"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": "t", "namespace": "ml"},
                        "spec": {"model": {"layers": 2}}})
    assert paths == ["/api/v1/namespaces/ml/configmaps/c", "/api/v1/namespaces/default/configmaps/d",
                     "/apis/rbac.authorization.k8s.io/v1/clusterroles/r",
                     f"/apis/{API_VERSION}/namespaces/ml/trainingjobs/t"]
    assert emu.get("v1/configmaps", "ml", "c")["data"] == {"k": "v"}
    assert emu.get("v1/configmaps", "default", "d") is not None
    assert emu.get("rbac.authorization.k8s.io/v1/clusterroles", None, "r") is not None


async def test_errors_carry_status_reason_and_message(cluster: tuple[Any, KubeClient]) -> None:
    emu, client = cluster
    await client.create({"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": "t", "namespace": "ml"},
                         "spec": {"model": {}, "data": {"path": "/d"}}})
    with pytest.raises(ApiError) as err:  # a failed `test` op: the object changed meanwhile
        await client.json_patch(API_VERSION, "TrainingJob", "ml", "t", [{"op": "test", "path": "/spec/suspend", "value": True}])
    assert err.value.status == 422 and not err.value.transient
    emu.faults.append(lambda req: kmock.KubernetesError(status=429, reason="TooManyRequests", message="slow down"))
    with pytest.raises(ApiError) as err:
        await client.apply(deployment("x"))
    assert (err.value.status, err.value.reason, err.value.transient) == (429, "TooManyRequests", True)
    assert "slow down" in str(err.value)
    with pytest.raises(ValueError, match="unknown kind"):
        await client.get("example.com/v1", "Widget", "ml", "w")


async def test_unreachable_server_is_a_transient_503() -> None:
    client = KubeClient.for_server("http://127.0.0.1:9", token="t")
    client.timeout_seconds = 2.0
    try:
        with pytest.raises(ApiError) as err:
            await client.get("v1", "Pod", "ml", "p")
    finally:
        await client.close()
    assert (err.value.status, err.value.reason, err.value.transient) == (503, "Unreachable", True)


async def test_crd_served_reads_the_crd(cluster: tuple[Any, KubeClient]) -> None:
    emu, client = cluster
    assert await client.crd_served("llmfleet.io/v1alpha1", "inferenceservices")
    assert not await client.crd_served("llmfleet.io/v1beta9", "inferenceservices")  # no such version
    assert not await client.crd_served("monitoring.coreos.com/v1", "podmonitors")
    emu.add_crd({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                 "metadata": {"name": "podmonitors.monitoring.coreos.com"},
                 "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                          "names": {"plural": "podmonitors", "kind": "PodMonitor"},
                          "versions": [{"name": "v1", "served": True, "storage": True}]}})
    assert await client.crd_served("monitoring.coreos.com/v1", "podmonitors")
