"""`llmfleet operator` as a process against the API emulator: the peering resource check at start, and a
stop within the grace period on SIGTERM in every state (starting, acting, standby, standalone)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubeemu
import pytest
import yaml
from operator_testkit import CRDS, Operator, eventually, isvc_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ISVC = "llmfleet.io/v1alpha1/inferenceservices"
DEPLOY = "apps/v1/deployments"
# The chart's terminationGracePeriodSeconds is 30. The operator usually exits within a second; a timer kopf
# spawned during shutdown costs kopf's 5 s wait for stragglers, a handler blocked in a DNS lookup (here: the
# autoscaler resolving <service>-router.<ns>, which the emulator's host cannot) until that returns, and
# whatever still hangs at 20 s is killed by kopf (SHUTDOWN_DEADLINE_SECONDS).
GRACE_S = 25.0


class OperatorProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    async def wait(self, timeout: float) -> int | None:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            return None

    async def terminate_within(self, grace: float = GRACE_S) -> float:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = await self.wait(grace)
        took = time.monotonic() - t0
        assert rc is not None, f"no exit within {grace}s of SIGTERM; log tail: {self.lines()[-10:]}"
        print(f"exit {rc} {took:.1f} s after SIGTERM")
        return took

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@pytest.fixture
async def bare_cluster() -> AsyncIterator[tuple[Any, str]]:
    """The llmfleet CRDs only (as after `kubectl apply -f crds/`): no kopf peering resource."""
    async with kubeemu.serve(CRDS) as (emu, url):
        yield emu, url


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Any]:
    started: list[OperatorProcess] = []

    async def start(url: str, *args: str) -> OperatorProcess:
        cfg = tmp_path / f"kubeconfig-{len(started)}"
        cfg.write_text(yaml.safe_dump(kubeemu.kubeconfig(url)))
        log = tmp_path / f"operator-{len(started)}.log"
        env = {**os.environ, "KUBECONFIG": str(cfg), "LLMFLEET_RECONCILE_INTERVAL": "1",
               "KUBERNETES_SERVICE_HOST": ""}
        with log.open("wb") as fh:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llmfleet.cli", "operator", "--metrics-port", "0", "--liveness-port", "0",
                "--log-format", "text", *args, stdout=fh, stderr=fh, env=env)
        op = OperatorProcess(proc, log)
        started.append(op)
        return op

    yield start
    for op in started:
        await op.kill()


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
