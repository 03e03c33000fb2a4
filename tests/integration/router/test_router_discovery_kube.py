"""Against the Kubernetes API emulator (tests/kubeemu.py, kmock): the router's EndpointSlice discovery through
llmfleet's Kubernetes client."""

from __future__ import annotations

import kmock
import kubeemu  # tests/conftest.py puts tests/ on sys.path
import pytest
import rbac_enforcer

from llmfleet.kube.client import KubeClient
from llmfleet.router.config import DISCOVERY_RULES, KubernetesDiscovery, LimitsConfig, PoolConfig
from llmfleet.router.replicas import PoolReplicas

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _slice(addrs: list[str], ready: bool = True, terminating: bool = False, port: int = 8000) -> dict:
    return {"ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": addrs, "conditions": {"ready": ready, "terminating": terminating}}]}


async def test_discover_once_lists_endpoint_slices_through_the_kube_client() -> None:
    """Against the API emulator: the pool's selector picks its slices; an API error keeps the last replicas.
    The client has only the router's RBAC (the Role the operator grants it): anything else is answered 403."""
    d = KubernetesDiscovery(namespace="ml", selector="llmfleet.io/inferenceservice=s,llmfleet.io/pool=primary")
    labels = {"llmfleet.io/inferenceservice": "s", "llmfleet.io/pool": "primary"}
    pool = PoolReplicas(PoolConfig(name="primary", role="primary", served_names=["m"], discovery=d), LimitsConfig())
    async with kubeemu.serve() as (emu, url):
        for name, body, lbl in (("a", _slice(["10.0.0.1", "10.0.0.2"]), labels),
                                ("b", _slice(["10.0.0.3"], terminating=True), labels),
                                ("other", _slice(["10.9.9.9"]), {**labels, "llmfleet.io/pool": "student"})):
            await emu.put("discovery.k8s.io/v1/endpointslices", {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": name, "namespace": "ml", "labels": lbl}, **body})
        enforcer = rbac_enforcer.enforce(emu, DISCOVERY_RULES, token="router")
        client = KubeClient.for_server(url, token="router")
        try:
            await pool.discover_once(client)
            enforcer.assert_clean()
            assert sorted(r.id for r in pool.routable()) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
            assert pool.replicas["http://10.0.0.3:8000"].draining and pool.discovery_error is None
            emu.faults.append(lambda _req: kmock.KubernetesError(status=500, reason="boom", message="boom"))
            await pool.discover_once(client)  # keeps the last known replicas
        finally:
            await client.close()
    assert len(pool.replicas) == 3 and pool.discovery_error is not None and "boom" in pool.discovery_error
