"""Supervisor + LocalActuator with stand-in processes (no vLLM): restart on crash, scaling, drain, stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llmfleet.api import InferenceService
from llmfleet.autoscaler.actuation import Actuator, ObservedReplica
from llmfleet.local.actuator import LocalActuator
from llmfleet.local.run_state import pid_alive, read_state
from llmfleet.local.runtime import Supervisor

SLEEPER = [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
           "time.sleep(120)"]


def isvc(**spec: Any) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "sup"},
        "spec": {"model": {"path": "/m"}, "vllm": {"blockSize": 32}, "replicas": 1, "minReplicas": 1,
                 "maxReplicas": 3, "drainSeconds": 1,
                 "fallback": {"pools": [{"name": "student", "model": {"path": "/s"}, "replicas": 0, "maxReplicas": 1}]},
                 **spec},
    })


class FakeSupervisor(Supervisor):
    def replica_command(self, r: Any) -> list[str]:
        return SLEEPER

    def start_router(self) -> None:
        self.router = self._spawn(SLEEPER, str(self.run_dir / "logs" / "router.log"))


def wait_for(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise TimeoutError


@pytest.mark.timeout(60)
async def test_restart_scale_drain_stop(tmp_path: Path) -> None:
    sup = FakeSupervisor(isvc(), tmp_path, prometheus=False)
    assert [len(sup.slots[p]) for p in ("primary", "student")] == [3, 1]
    ports = {r.port for r in sup.replicas()} | {sup.router_port}
    assert len(ports) == 5  # every slot has its own port, fixed for the run
    sup.start()
    try:
        running = [r for r in sup.replicas() if r.proc is not None]
        assert [r.name for r in running] == ["primary-0"]
        state = read_state(tmp_path)
        assert state is not None and state["desired"] == {"primary": 1, "student": 0}

        # A crash is noticed, reported and restarted.
        victim = running[0]
        old = victim.pid
        os.kill(victim.pid or 0, signal.SIGKILL)
        wait_for(lambda: victim.proc is not None and victim.proc.poll() is not None)
        sup.reconcile()
        assert victim.restarts == 1 and victim.pid not in (None, old)
        assert any("primary-0 crashed" in m for _, m in sup.events)

        act = LocalActuator(sup, probe=_zero_in_flight)
        assert isinstance(act, Actuator)
        await act.set_replicas({"primary": 3, "student": 1}, reason="test")
        assert sorted(r.name for r in await act.list_replicas("primary")) == ["primary-0", "primary-1", "primary-2"]
        assert len(await act.list_replicas("student")) == 1
        with pytest.raises(KeyError):
            await act.set_replicas({"nope": 1}, reason="test")

        # Drain-and-remove stops exactly the chosen slot, not the last one.
        mid = next(r for r in sup.replicas("primary") if r.slot == 1)
        mid_proc = mid.proc
        mid.ready = True  # a ready replica is drained by watching its in-flight gauge (the probe)
        PROBED.clear()
        res = await act.drain_and_remove(ObservedReplica(pool="primary", name="primary-1", url=mid.url), timeout_s=2)
        assert res.removed and res.drained and sup.desired["primary"] == 2
        assert PROBED == ["primary-1"]
        assert mid_proc is not None and mid_proc.wait(timeout=10) == 0
        sup.reconcile()
        assert sorted(r.name for r in await act.list_replicas("primary")) == ["primary-0", "primary-2"]
        assert mid.restarts == 0  # a drained replica is not a crash
        await act.set_replicas({"primary": 1}, reason="test")
        alive = [r for r in sup.replicas("primary") if r.proc is not None and not r.stopping]
        assert len(alive) == 1
    finally:
        pids = [r.pid for r in sup.replicas() if r.pid] + [sup.router.pid if sup.router else 0]
        await sup.stop(grace_s=5)
    await asyncio.sleep(0.1)
    assert not [p for p in pids if pid_alive(p)]
    final = read_state(tmp_path)
    assert final is not None and all(not r["running"] for r in final["replicas"])


PROBED: list[str] = []


async def _zero_in_flight(replica: ObservedReplica) -> float | None:
    PROBED.append(replica.name)
    return 0.0


def test_prometheus_config_labels_every_slot(tmp_path: Path) -> None:
    import yaml

    sup = FakeSupervisor(isvc(), tmp_path, prometheus=False)
    cfg = yaml.safe_load(sup.write_prometheus_config().read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    router = jobs["llmfleet-router"]["static_configs"][0]
    assert router["targets"] == [f"127.0.0.1:{sup.router_port}"]
    groups = {g["labels"]["llmfleet_io_pool"]: g for g in jobs["llmfleet-replicas"]["static_configs"]}
    assert sorted(groups) == ["primary", "student"]
    assert len(groups["primary"]["targets"]) == 3
    assert groups["student"]["labels"]["llmfleet_io_inferenceservice"] == "sup"


class EnvEchoSupervisor(Supervisor):
    """Replicas that print the engine setting they were started with."""

    def replica_command(self, r: Any) -> list[str]:
        return [sys.executable, "-c", "import os; e = os.environ.get; "
                "print('MP=' + e('VLLM_ENABLE_V1_MULTIPROCESSING', 'unset') + ' OMP=' + e('OMP_WAIT_POLICY', 'unset'))"]


def _started_with(sup: Supervisor, pool: str) -> str:
    r = sup.slots[pool][0]
    sup.start_replica(r)
    assert r.proc is not None
    r.proc.wait(timeout=30)
    return Path(r.log).read_text().strip().splitlines()[-1]


@pytest.mark.timeout(60)
async def test_cpu_replicas_start_without_spinning_engines_unless_the_caller_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU pools get vLLM's uniprocess executor (no busy-polling worker process beside each engine core) and OpenMP
    threads that sleep when idle; GPU pools keep vLLM's defaults; the caller's environment wins over the default."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    student_gpu = {"fallback": {"pools": [{"name": "student", "model": {"path": "/s"}, "replicas": 0, "maxReplicas": 1,
                                           "resources": {"gpus": 1}}]}}
    sup = EnvEchoSupervisor(isvc(**student_gpu), tmp_path / "a", prometheus=False)
    try:
        assert _started_with(sup, "primary") == "MP=0 OMP=PASSIVE"
        assert _started_with(sup, "student") == "MP=unset OMP=unset"
    finally:
        await sup.stop(grace_s=0)
    mine = EnvEchoSupervisor(isvc(), tmp_path / "b", prometheus=False, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    try:
        assert _started_with(mine, "primary") == "MP=1 OMP=PASSIVE"
    finally:
        await mine.stop(grace_s=0)


def test_each_local_replica_publishes_kv_events_on_its_own_port(tmp_path: Path) -> None:
    """Replicas share the host, so each gets its own event port, and the router's config names each endpoint."""
    from llmfleet.router.config import RouterConfig

    sup = Supervisor(isvc(), tmp_path, prometheus=False)
    primary = sup.slots["primary"]
    ports = [r.kv_events_port for r in sup.replicas()]
    assert None not in ports and len(set(ports)) == len(ports)
    cmd = sup.replica_command(primary[1])
    assert json.loads(cmd[cmd.index("--kv-events-config") + 1])["endpoint"] == f"tcp://*:{primary[1].kv_events_port}"
    pools = {p.name: p for p in RouterConfig.from_yaml(sup.write_router_config().read_text()).pools}
    assert pools["primary"].kv_events_port is None
    assert pools["primary"].kv_events_endpoints == {r.url: f"tcp://127.0.0.1:{r.kv_events_port}" for r in primary}
    sup_off = Supervisor(isvc(router={"kvEvents": False}), tmp_path / "off", prometheus=False)
    assert "--kv-events-config" not in sup_off.replica_command(sup_off.slots["primary"][0])
    assert all(p.kv_events_endpoints is None and p.kv_events_port is None
               for p in RouterConfig.from_yaml(sup_off.write_router_config().read_text()).pools)


def test_a_store_url_from_a_secret_stays_out_of_the_local_router_config(tmp_path: Path) -> None:
    """With featureStore.urlSecretRef the local runtime takes the URL from LLMFLEET_STORE_URL in its environment
    (which the router inherits) and never writes it into router.yaml; a plain URL is written as before."""
    from llmfleet.api.contracts import STORE_URL_ENV
    from llmfleet.router.config import RouterConfig

    db = tmp_path / "secret-store.db"
    url = f"sqlite:///{db}"
    sup = Supervisor(isvc(featureStore={"urlSecretRef": {"name": "s", "key": "url"}}), tmp_path / "ref",
                     prometheus=False, env={STORE_URL_ENV: url})
    text = sup.write_router_config().read_text()
    cfg = RouterConfig.from_yaml(text)
    assert str(db) not in text and cfg.feature_store.url is None and cfg.feature_store.url_env == STORE_URL_ENV
    assert cfg.feature_store.resolved_url(sup.env) == url and db.exists()  # the schema was created there
    plain = Supervisor(isvc(featureStore={"url": f"sqlite:///{tmp_path / 'plain.db'}"}), tmp_path / "plain",
                       prometheus=False)
    assert RouterConfig.from_yaml(plain.write_router_config().read_text()).feature_store.url.endswith("plain.db")


def test_llmfleet_up_router_config_carries_outlier_ejection(tmp_path: Path) -> None:
    """`llmfleet up` writes the same spec.router.outliers into its router.yaml as the operator's ConfigMap."""
    from llmfleet.router.config import RouterConfig

    sup = Supervisor(isvc(router={"outliers": {"consecutiveFailures": 7, "enabled": False}}), tmp_path, prometheus=False)
    cfg = RouterConfig.from_yaml(sup.write_router_config().read_text())
    assert cfg.outliers.consecutive_failures == 7 and cfg.outliers.enabled is False


@pytest.mark.timeout(60)
async def test_ready_waits_for_the_router_to_see_each_wanted_pool(tmp_path: Path) -> None:
    """A replica's own /health passing is not enough: until the router has health-checked it, a request for its
    pool would fall back to a student (or fail), so `up -d` must not say ready yet."""
    from aiohttp import web

    sup = FakeSupervisor(isvc(), tmp_path, prometheus=False)
    seen: dict[str, int] = {"primary": 0, "student": 0}

    async def router_health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok" if any(seen.values()) else "no routable replica", "routable": seen},
                                 status=200 if any(seen.values()) else 503)

    async def replica_health(request: web.Request) -> web.Response:
        return web.json_response({})

    runners = []
    for port, handler in ((sup.router_port, router_health), (sup.slots["primary"][0].port, replica_health)):
        app = web.Application()
        app.router.add_get("/health", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    sup.start()
    try:
        await sup.refresh_ready()
        assert sup.slots["primary"][0].ready and not sup.router_ready and not sup.is_ready()
        seen["student"] = 1  # the router answers, but has not seen the primary replica yet
        await sup.refresh_ready()
        assert sup.router_ready and sup.router_routable == {"primary": 0, "student": 1} and not sup.is_ready()
        seen["primary"] = 1
        await sup.refresh_ready()
        assert sup.is_ready()  # the student pool wants no replicas, so only the primary is waited for
    finally:
        await sup.stop(grace_s=5)
        for runner in runners:
            await runner.cleanup()


def test_a_pools_engine_env_wins_over_the_callers_and_the_defaults(tmp_path: Path) -> None:
    """vllm.env: what the replica container gets on Kubernetes, `llmfleet up` gives the replica process, over its
    own environment and the CPU engine defaults."""
    sup = Supervisor(isvc(vllm={"blockSize": 32, "env": {"OMP_WAIT_POLICY": "ACTIVE", "VLLM_LOGGING_LEVEL": "DEBUG"}}),
                     tmp_path, prometheus=False, env={"VLLM_LOGGING_LEVEL": "INFO", "MINE": "1"})
    env = sup.replica_env(sup.slots["primary"][0])
    assert env["OMP_WAIT_POLICY"] == "ACTIVE" and env["VLLM_LOGGING_LEVEL"] == "DEBUG" and env["MINE"] == "1"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the CPU default the spec left alone
