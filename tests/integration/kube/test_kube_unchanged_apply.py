"""The client's skip of an unchanged server-side apply (llmfleet/kube/applied.py) against the API emulator: what is
skipped, and every case in which the apply must go out again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import kubeemu  # tests/conftest.py puts tests/ on sys.path
import pytest

from llmfleet.kube.client import ApiError, KubeClient

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = "apps/v1/deployments"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def deployment(name: str = "web", replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, KubeClient, list[str], Clock]]:
    """The emulator, a client that skips unchanged applies for 60 s of a fake clock, and the applies that reached
    the emulator (object names)."""
    async with kubeemu.serve(crds=ROOT / "crds") as (emu, url):
        sent: list[str] = []
        emu.faults.append(lambda req: sent.append(req.url.path.rsplit("/", 1)[-1]) if req.method == "PATCH" else None)
        client = KubeClient.for_server(url)
        client.unchanged_apply_ttl_seconds = 60.0
        clock = Clock()
        client.applied_cache().clock = clock
        try:
            yield emu, client, sent, clock
        finally:
            await client.close()


async def test_unchanged_apply_is_not_resent_a_changed_one_is(cluster: Any) -> None:
    emu, client, sent, _ = cluster
    first = await client.apply(deployment(), generation=1)
    again = await client.apply(deployment(), generation=1)
    assert sent == ["web"] and client.requests == 1
    assert again == first and again is not first  # the last answer, as a copy the caller may edit
    again["spec"]["replicas"] = 7
    assert (await client.apply(deployment(), generation=1))["spec"]["replicas"] == 1
    await client.apply(deployment(replicas=2), generation=1)  # changed manifest
    assert sent == ["web", "web"] and emu.get(DEPLOY, "ml", "web")["spec"]["replicas"] == 2
    await client.apply(deployment(replicas=2), generation=2)  # same manifest, new owner generation
    assert sent == ["web"] * 3
    await client.apply(deployment("other", replicas=2), generation=2)  # another object
    assert sent == ["web"] * 3 + ["other"]


async def test_resent_after_the_ttl_and_after_forget(cluster: Any) -> None:
    emu, client, sent, clock = cluster
    await client.apply(deployment(), generation=1)
    clock.now += 59
    await client.apply(deployment(), generation=1)
    assert sent == ["web"]
    clock.now += 2  # 61 s after the apply: a change nobody signalled is repaired
    await client.apply(deployment(), generation=1)
    assert sent == ["web"] * 2
    await client.apply(deployment(), generation=1)
    assert sent == ["web"] * 2
    # Someone else deleted it (the operator forgets on the watch event): the next apply recreates it.
    await emu.remove(DEPLOY, "ml", "web")
    client.forget("Deployment", "ml", "web")
    await client.apply(deployment(), generation=1)
    assert sent == ["web"] * 3 and emu.get(DEPLOY, "ml", "web") is not None


async def test_resent_after_an_error_a_patch_or_a_delete_through_the_client(cluster: Any) -> None:
    emu, client, sent, _ = cluster
    await client.apply(deployment(), generation=1)
    failures = [kmock.KubernetesError(status=500, reason="InternalError", message="etcd")]
    emu.faults.insert(0, lambda req: failures.pop() if failures and req.method == "PATCH" else None)
    with pytest.raises(ApiError):
        await client.apply(deployment(replicas=3), generation=1)
    # The failed apply may or may not have landed: the next one goes out even though it equals the first.
    await client.apply(deployment(), generation=1)
    assert sent == ["web"] * 2  # (the fault answered the failed one before the counting hook saw it)
    await client.merge_patch("apps/v1", "Deployment", "ml", "web", {"spec": {"replicas": 5}})
    assert (await client.apply(deployment(), generation=1))["spec"]["replicas"] == 1  # not the cached answer
    assert await client.delete("apps/v1", "Deployment", "ml", "web")
    await client.apply(deployment(), generation=1)
    assert emu.get(DEPLOY, "ml", "web") is not None


async def test_off_by_default(cluster: Any) -> None:
    _, _, sent, _ = cluster
    async with kubeemu.serve(crds=ROOT / "crds") as (emu, url):
        client = KubeClient.for_server(url)
        try:
            await client.apply(deployment())
            await client.apply(deployment())
        finally:
            await client.close()
        assert client.requests == 2 and len(client.applied_cache()) == 0
