"""Scale-down under load loses no request: fake OpenAI replicas behind the real llmfleet router; the autoscaler
decides a scale-in, picks the replica by the router's prefix index, drains it through the router's /admin/drain,
waits for its in-flight requests (its /metrics) and only then stops it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmfleet.api import InferenceService, parse_resource
from llmfleet.autoscaler.actuation import DrainResult, ObservedReplica, scrape_in_flight, wait_drained
from llmfleet.autoscaler.controller import autoscale_step
from llmfleet.autoscaler.policy import PolicyState, PoolSignals
from llmfleet.autoscaler.scalein import lost_blocks_from_index
from llmfleet.autoscaler.signals import PoolRef
from llmfleet.router.config import LimitsConfig, PoolConfig, RouterConfig
from llmfleet.router.server import Router
from llmfleet.testing.fake_backend import FakeBackend

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class CountingBackend(FakeBackend):
    """FakeBackend whose vllm:num_requests_running gauge is its real number of requests in flight."""

    async def _serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        self.metrics["vllm:num_requests_running"] = self.metrics.get("vllm:num_requests_running", 0) + 1
        try:
            return await super()._serve(request, endpoint)
        finally:
            self.metrics["vllm:num_requests_running"] -= 1


class RouterActuator:
    """Test actuator: replicas are CountingBackends behind the router; removal = drain at the router, wait, stop."""

    def __init__(self, router_url: str, backends: dict[str, CountingBackend]) -> None:
        self.router_url, self.backends = router_url, backends
        self.removed: list[tuple[str, int, int]] = []  # (url, requests received at drain, at stop)

    async def list_replicas(self, pool: str) -> list[ObservedReplica]:
        return [ObservedReplica(pool, url.rsplit(":", 1)[1], url) for url in sorted(self.backends)]

    async def set_replicas(self, desired: Mapping[str, int], *, reason: str, state_json: str | None = None) -> None:
        return None

    async def drain_and_remove(self, replica: ObservedReplica, *, timeout_s: float) -> DrainResult:
        async with aiohttp.ClientSession() as s:
            async with s.post(self.router_url + "/admin/drain", json={"replica": replica.url, "draining": True}) as r:
                assert r.status == 200, await r.text()
        at_drain = len(self.backends[str(replica.url)].requests)
        drained, waited, last = await wait_drained(replica, scrape_in_flight, timeout_s=timeout_s, poll_s=0.05)
        fb = self.backends.pop(str(replica.url))
        await fb.stop()
        self.removed.append((str(replica.url), at_drain, len(fb.requests)))
        return DrainResult(replica, drained, True, waited, last)


class QuietSignals:
    """The load has dropped: a fresh, low arrival rate (the policy may scale in)."""

    async def collect(self, pools: Sequence[PoolRef], now: float | None = None) -> list[PoolSignals]:
        return [PoolSignals(p.name, p.role, now or 0.0, p.replicas, p.ready_replicas, arrival_rate=0.2,
                            mean_input_tokens=100, mean_output_tokens=4, queue_depth=0.0) for p in pools]


def service(replicas: int) -> InferenceService:
    obj = parse_resource({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "svc"},
        "spec": {"model": {"path": "/m", "servedName": "m"}, "replicas": replicas, "minReplicas": 1,
                 "maxReplicas": 4, "drainSeconds": 20,
                 "autoscaling": {"scaleDownStabilizationSeconds": 0, "cooldownSeconds": 0}},
    })
    assert isinstance(obj, InferenceService)
    return obj


async def test_scale_in_under_load_drops_no_request() -> None:
    backends: dict[str, CountingBackend] = {}
    for i in range(3):
        fb = CountingBackend(name=f"r{i}", delay_s=0.2, metrics={"vllm:num_requests_running": 0,
                                                                  "vllm:num_requests_waiting": 0})
        await fb.start()
        backends[fb.url] = fb
    cfg = RouterConfig(service="svc", pools=[PoolConfig(name="primary", role="primary", served_names=["m"],
                                                        endpoints=sorted(backends))],
                       # no retries: a replica stopped with requests in flight would show as failures
                       limits=LimitsConfig(scrape_interval_seconds=0.05, scrape_timeout_seconds=0.5, max_retries=0))
    router = Router(cfg)
    runner = web.AppRunner(router.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    statuses: list[int] = []
    stop = asyncio.Event()

    async def client(k: int) -> None:
        async with aiohttp.ClientSession() as s:
            i = 0
            while not stop.is_set():
                i += 1
                body: dict[str, Any] = {"model": "m", "prompt": f"tenant {k} asks question {i} " * 8, "max_tokens": 4}
                async with s.post(url + "/v1/completions", json=body) as r:
                    await r.read()
                    statuses.append(r.status)

    try:
        workers = [asyncio.create_task(client(k)) for k in range(6)]
        while len(statuses) < 30:  # load is flowing through all replicas
            await asyncio.sleep(0.05)
        actuator = RouterActuator(url, backends)
        index = router.pools["primary"].index
        lost = lost_blocks_from_index(index, await actuator.list_replicas("primary"))
        result = await autoscale_step(service(3), actuator, QuietSignals(), PolicyState(), 1000.0, lost_blocks=lost)
        assert result.decision.pools["primary"].desired == 2
        assert len(result.drained) == 1 and result.drained[0].drained
        assert result.drained[0].in_flight_at_removal == 0
        victim = result.drained[0].replica.url
        assert victim == min(lost, key=lambda u: (lost[u], u))  # the replica losing the fewest cached blocks
        served_before = len(statuses)
        while len(statuses) < served_before + 30:  # keep going on the remaining replicas
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await runner.cleanup()
        for fb in backends.values():
            await fb.stop()
    assert statuses and all(s == 200 for s in statuses), sorted(set(statuses))
    _, at_drain, at_stop = actuator.removed[0]
    assert at_drain > 0  # the victim had served traffic before its drain
    assert at_stop - at_drain <= 1  # and got nothing new once drained (one already routed at most)
