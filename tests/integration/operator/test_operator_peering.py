"""`llmfleet operator` as a process against the API emulator: the peering resource check at start, and a
stop within the grace period on SIGTERM in every state (starting, acting, standby, standalone)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kubeemu
import pytest
import rbac_enforcer
from operator_testkit import CRDS, OPERATOR_TOKEN, Operator, eventually, isvc_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ISVC = "llmfleet.io/v1alpha1/inferenceservices"
DEPLOY = "apps/v1/deployments"


@pytest.fixture
async def bare_cluster() -> AsyncIterator[tuple[Any, str]]:
    """The llmfleet CRDs only (as after `kubectl apply -f crds/`): no kopf peering resource. The operator gets
    the chart's RBAC, as in the `cluster` fixture."""
    from llmfleet.operator.rbac import OPERATOR_RULES

    async with kubeemu.serve(CRDS) as (emu, url):
        enforcer = rbac_enforcer.enforce(emu, OPERATOR_RULES, token=OPERATOR_TOKEN)
        yield emu, url
    assert not enforcer.denied, sorted(enforcer.denied)


async def test_missing_peering_resource_exits_1_with_one_line(bare_cluster: Any, spawn: Any) -> None:
    _, url = bare_cluster
    op = await spawn(url)
    rc = await op.wait(30)
    assert rc == 1, op.lines()[-10:]
    errors = [ln for ln in op.lines() if "peering is mandatory" in ln]
    assert len(errors) == 1, op.lines()
    assert "clusterkopfpeerings" in errors[0] and "--standalone" in errors[0]
    assert not any("Traceback" in ln for ln in op.lines())


async def test_missing_namespaced_peering_resource_names_kopfpeerings(bare_cluster: Any, spawn: Any) -> None:
    _, url = bare_cluster
    op = await spawn(url, "--namespace", "ml")
    assert await op.wait(30) == 1
    assert any("kopfpeerings" in ln and "clusterkopfpeerings" not in ln for ln in op.lines())


async def test_standalone_without_peering_resource_works_and_stops_on_sigterm(bare_cluster: Any, spawn: Any) -> None:
    emu, url = bare_cluster
    op = await spawn(url, "--standalone")
    await emu.put(ISVC, isvc_manifest())
    await eventually(lambda: emu.get(DEPLOY, "ml", "chat-router"), timeout=30)
    await op.terminate_within()


async def test_sigterm_while_starting(bare_cluster: Any, spawn: Any) -> None:
    _, url = bare_cluster
    op = await spawn(url, "--standalone")
    await asyncio.sleep(0.3)  # still importing / logging in
    await op.terminate_within()


async def test_leader_and_standby_stop_on_sigterm(cluster: Any, spawn: Any) -> None:
    emu, url = cluster
    await emu.put("kopf.dev/v1/clusterkopfpeerings", {"metadata": {"name": "llmfleet"}, "status": {}})
    peering = ("kopf.dev/v1/clusterkopfpeerings", None, "llmfleet")
    leader = Operator(url, standalone=False, peering="llmfleet", priority=100, identity="leader")
    await leader.start()
    try:
        await eventually(lambda: "leader" in (emu.get(*peering).get("status") or {}))
        standby = await spawn(url, "--priority", "10")
        await eventually(lambda: len(emu.get(*peering).get("status") or {}) == 2, timeout=30)
        await asyncio.sleep(1.0)  # paused in favour of the leader
        await standby.terminate_within()
    finally:
        await leader.stop()
    acting = await spawn(url, "--priority", "10")
    await emu.put(ISVC, isvc_manifest())
    await eventually(lambda: emu.get(DEPLOY, "ml", "chat-router"), timeout=30)
    await acting.terminate_within()
