"""Fixtures: the extended kmock emulator (tests/kubeemu.py) and the real kopf operator in the test's loop."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kubeemu  # tests/conftest.py puts tests/ on sys.path
import pytest
import rbac_enforcer
import yaml

# Fast timers for tests; read when llmfleet.operator.handlers is first imported (kopf fixes timer intervals).
os.environ.setdefault("LLMFLEET_RECONCILE_INTERVAL", "1")
os.environ.setdefault("LLMFLEET_RETRY_DELAY", "0.5")
os.environ.setdefault("LLMFLEET_AUTOSCALER_TICK", "1")

ROOT = pathlib.Path(__file__).resolve().parents[3]
CRDS = ROOT / "crds"
# The operator's bearer token: the emulator authorizes its requests against the chart's rules (OPERATOR_RULES).
OPERATOR_TOKEN = "llmfleet-operator"



KOPF_PEERING_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }
    for kind, plural, scope in (
        ("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        ("KopfPeering", "kopfpeerings", "Namespaced"),
    )
]


async def eventually(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll `check` (sync or async) until it returns a truthy value; fail with its last value/error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if asyncio.iscoroutine(last):
                last = await last
            if last:
                return last
        except (AssertionError, KeyError, IndexError, TypeError) as err:
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s; last: {last!r}")
        await asyncio.sleep(interval)


class Operator:
    """One kopf operator in its own thread and event loop (as in production: kopf stops every task that
    started after it, so two operators must not share a loop with each other or with the emulator)."""

    def __init__(self, url: str, **options: Any) -> None:
        import kopf

        from llmfleet.operator.config import OperatorConfig
        from llmfleet.operator.handlers import Runtime
        from llmfleet.operator.run import RunOptions

        config = options.pop("config", None) or OperatorConfig(timer_interval_seconds=1.0)
        self.runtime = Runtime(config=config, connection=kopf.ConnectionInfo(server=url, token=OPERATOR_TOKEN))
        defaults: dict[str, Any] = {"metrics_port": None, "liveness_port": None, "standalone": True, "autoscaler": False}
        self.options = RunOptions(runtime=self.runtime, **{**defaults, **options})
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _main(self) -> None:
        from llmfleet.operator.run import run_async

        try:
            asyncio.run(run_async(self.options, stop_flag=self.stop_flag, ready_flag=self.ready_flag))
        except (asyncio.CancelledError, Exception) as err:  # noqa: BLE001 - reported to the test
            self.error = err

    async def start(self) -> Operator:
        self.thread = threading.Thread(target=self._main, name="operator", daemon=True)
        self.thread.start()
        ready = await asyncio.to_thread(self.ready_flag.wait, 20)
        if not ready:
            raise AssertionError(f"operator did not start: {self.error!r}")
        return self

    async def stop(self) -> None:
        if self.thread is None:
            return
        self.stop_flag.set()
        await asyncio.to_thread(self.thread.join, 20)
        alive = self.thread.is_alive()
        self.thread = None
        if alive:
            raise AssertionError("operator did not stop within 20 s")


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, str]]:
    """The emulator with llmfleet's and kopf's CRDs. Operators started by the fixtures below get exactly the
    chart's RBAC (OPERATOR_RULES): a request outside it is answered 403 and fails the test at teardown."""
    from llmfleet.operator.rbac import OPERATOR_RULES

    async with kubeemu.serve(CRDS) as (emu, url):
        for crd in KOPF_PEERING_CRDS:
            emu.add_crd(crd)
        enforcer = rbac_enforcer.enforce(emu, OPERATOR_RULES, token=OPERATOR_TOKEN)
        yield emu, url
    assert not enforcer.denied, (
        "the operator made requests its RBAC (llmfleet/operator/rbac.py) does not grant: " + repr(sorted(enforcer.denied))
    )


@pytest.fixture
async def operators(cluster: tuple[Any, str]) -> AsyncIterator[Callable[..., Awaitable[Operator]]]:
    """Factory: `op = await operators(**RunOptions fields)`; every operator is stopped at teardown."""
    _, url = cluster
    started: list[Operator] = []

    async def start(**options: Any) -> Operator:
        op = Operator(url, **options)
        started.append(op)
        return await op.start()

    yield start
    for op in reversed(started):
        await op.stop()


# The chart's terminationGracePeriodSeconds is 30. The operator usually exits within a second; a timer kopf
# spawned during shutdown costs kopf's 5 s wait for stragglers, a handler blocked in a DNS lookup (here: the
# autoscaler resolving <service>-router.<ns>, which the emulator's host cannot) until that returns, and
# whatever still hangs at 20 s is killed by kopf (SHUTDOWN_DEADLINE_SECONDS).
GRACE_S = 25.0


class OperatorProcess:
    """`llmfleet operator` as a process (its own kopf registry: the autoscaler's handlers it imports stay there)."""

    def __init__(self, proc: asyncio.subprocess.Process, log: pathlib.Path) -> None:
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
async def spawn(tmp_path: pathlib.Path) -> AsyncIterator[Any]:
    """Factory: `op = await spawn(url, *cli_args)` starts `llmfleet operator` against `url`; killed at teardown."""
    started: list[OperatorProcess] = []

    async def start(url: str, *args: str) -> OperatorProcess:
        cfg = tmp_path / f"kubeconfig-{len(started)}"
        cfg.write_text(yaml.safe_dump(kubeemu.kubeconfig(url, token=OPERATOR_TOKEN)))
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


def isvc_manifest(name: str = "chat", namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    """An InferenceService on GPUs (valid vLLM arguments) with one student pool."""
    base: dict[str, Any] = {
        "model": {"path": "/models/llama", "servedName": "llama"},
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 4,
        "resources": {"gpus": 1, "gpuType": "H200", "cpu": "4", "memory": "32Gi"},
        "vllm": {"maxNumSeqs": 128},
        "fallback": {"pools": [{"name": "student", "model": {"path": "/models/small"}, "replicas": 1,
                                "resources": {"gpus": 1, "cpu": "2", "memory": "16Gi"}}]},
    }
    base.update(spec)
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace}, "spec": base}


def tj_manifest(name: str = "train", namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"layers": 2, "hidden": 64, "heads": 4},
        "data": {"path": "/data/tokens"},
        "optimization": {"globalBatchTokens": 512, "microBatch": 1, "steps": 10},
        "model_seq": None,
        "workers": {"count": 2, "gpusPerWorker": 0},
        "checkpoint": {"uri": "/ckpt", "interval": 5},
        "maxRestarts": 2,
    }
    base.pop("model_seq")
    base["model"]["seqLen"] = 256
    base.update(spec)
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": base}


# Test modules import the helpers above as `from operator_testkit import ...` (pytest runs with
# --import-mode=importlib, where `conftest` itself is not importable by name).
sys.modules.setdefault("operator_testkit", sys.modules[__name__])
