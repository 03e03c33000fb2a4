"""The router against fake OpenAI replicas, continued: what it tells the autoscaler and the estimated-TTFT scorer
(prefill released, arrival bursts, scale from zero, streamed requests counted as queued)."""

from __future__ import annotations

import asyncio

import pytest

from .conftest import config, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


async def test_estimated_ttft_gets_prefix_keys_and_prefill_is_released(fakes, routers, http) -> None:
    """estimated-ttft alone makes the router compute prefix keys; the prefill charged at routing is released
    on the first streamed byte (while the stream goes on) and at the end of a non-streaming request."""
    a = await fakes(name="a", tokens=50, token_delay_s=0.02)
    r = await routers(config({"primary": ("m", [a.url])}, scorers={"estimated-ttft": 1.0}))
    pool = r.router.pools["primary"]
    rep = pool.replicas.replicas[a.url]
    prompt = "shared system prompt " * 40
    resp = await http.post(r.url + "/v1/completions", json={"model": "m", "prompt": prompt, "stream": True})
    await resp.content.readline()  # first event through: the replica is past this prompt's prefill
    assert rep.in_flight == 1 and rep.prefill_tokens == 0.0
    await resp.read()
    resp.close()
    assert len(pool.index) > 0  # keys were computed and the index learned the prompt
    a.token_delay_s = 0.0
    async with http.post(r.url + "/v1/completions", json={"model": "m", "prompt": prompt}) as resp2:
        assert resp2.status == 200
    await wait_for(lambda: rep.in_flight == 0)
    assert rep.prefill_tokens == 0.0
    text = await (await http.get(r.url + "/metrics")).text()
    assert 'llmfleet_router_prefix_affinity_hits_total{pool="primary"} 1.0' in text  # the second one matched


async def test_an_arrival_burst_wakes_the_autoscaler_with_the_rate_it_was_seen_at(fakes, routers, http) -> None:
    """Every request the router routes is counted by its burst detector (llmfleet.router.burst); an episode it opens
    returns the autoscaler's long poll at once with the measured rate, and only once."""
    from llmfleet.autoscaler.controller import Burst
    from llmfleet.autoscaler.local import Wakeup

    replica = await fakes()
    r = await routers(config({"primary": ("m", [replica.url])}))

    class OpensOnThird:  # the detector's contract: observe(now) -> True when an episode opens; rate, window_s
        rate, window_s, seen = 42.0, 3, 0

        def observe(self, now: float) -> bool:
            self.seen += 1
            return self.seen == 3

    r.router.burst = OpensOnThird()  # type: ignore[assignment]
    wakeup = Wakeup(r.url)
    assert (await wakeup.wait(asyncio.Event(), 0.2)).burst is None  # learns the episode; nothing yet
    poll = asyncio.create_task(wakeup.wait(asyncio.Event(), 30))
    for _ in range(4):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
    woke = await asyncio.wait_for(poll, 5)
    assert woke.burst == Burst(42.0, 3.0) and woke.held == {}
    assert (await wakeup.wait(asyncio.Event(), 0.2)).burst is None  # the same episode does not wake it again


async def test_scale_from_zero_holds_requests_and_wakes_the_autoscaler(fakes, routers, http) -> None:
    """A pool that scales from zero and has no routable replica: requests wait (bounded, with a deadline)
    instead of 503, `/admin/held` wakes a long-polling autoscaler at once, and the requests go through as soon
    as a replica is healthy."""
    from llmfleet.router.config import PoolConfig, RouterConfig

    replica = await fakes(healthy=False)

    def cfg(**limits: object) -> RouterConfig:
        base = config({"primary": ("m", [replica.url])}, limits={"scrape_interval_seconds": 0.05, **limits})
        return base.model_copy(update={"pools": [PoolConfig(**{**base.pools[0].model_dump(), "scales_from_zero": True})]})

    r = await routers(cfg(max_held_requests=2, hold_timeout_seconds=30))
    await asyncio.sleep(0.2)  # a few health checks: the replica is down
    async with http.get(r.url + "/health") as resp:  # still ready: it must take the requests that wake us
        assert resp.status == 200 and (await resp.json())["status"] == "scaling from zero"
    # The autoscaler's side (the local loop and the Kubernetes daemon both use it): a long poll that returns
    # as soon as requests are held, not at its next interval.
    from llmfleet.autoscaler.controller import Wake
    from llmfleet.autoscaler.local import Wakeup

    wakeup = Wakeup(r.url)
    assert await wakeup.wait(asyncio.Event(), 0.3) == Wake()  # nothing held: it waits out its timeout
    poll = asyncio.create_task(wakeup.wait(asyncio.Event(), 30))
    await asyncio.sleep(0.1)
    sends = [asyncio.create_task(http.post(r.url + "/v1/chat/completions", json=CHAT)) for _ in range(3)]
    woke = await asyncio.wait_for(poll, 5)
    assert woke.held["primary"] >= 1 and woke.burst is None
    await wait_for(lambda: r.router.held.total() == 2)
    metrics = await (await http.get(r.url + "/metrics")).text()
    assert 'llmfleet_router_held_requests{pool="primary"} 2.0' in metrics
    replica.healthy = True  # the autoscaler's replica is up
    statuses = sorted([(await asyncio.wait_for(s, 10)).status for s in sends])
    assert statuses == [200, 200, 503]  # the queue holds two; the third is told to retry (Retry-After)
    assert r.router.held.total() == 0
    # The same cold start does not wake it again; a new one (after the pool emptied) does.
    assert await wakeup.wait(asyncio.Event(), 0.3) == Wake()
    replica.healthy = False
    await wait_for(lambda: not r.router.pools["primary"].replicas.routable())
    again = asyncio.create_task(http.post(r.url + "/v1/chat/completions", json=CHAT))
    assert (await asyncio.wait_for(wakeup.wait(asyncio.Event(), 30), 5)).held == {"primary": 1}
    replica.healthy = True
    assert (await asyncio.wait_for(again, 10)).status == 200

    # The deadline: no replica in time -> 503 with Retry-After, nothing hangs.
    replica.healthy = False
    late = await routers(cfg(hold_timeout_seconds=0.3))
    await wait_for(lambda: not late.router.pools["primary"].replicas.routable())  # its first health check
    async with http.post(late.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 503 and "became ready within" in (await resp.json())["error"]["message"]
        assert resp.headers["Retry-After"]


async def test_streamed_requests_count_as_queued_until_their_first_byte(fakes, routers, http) -> None:
    """A streamed request counts in its replica's `awaiting_first_byte` (and so as queued in the fallback's signals)
    from the moment it is sent until its first byte; a non-streamed one never (its first byte is the answer)."""
    a = await fakes(name="a", tokens=50, delay_s=0.3, token_delay_s=0.02)
    r = await routers(config({"primary": ("m", [a.url])}))
    pool = r.router.pools["primary"]
    rep = pool.replicas.replicas[a.url]
    task = asyncio.ensure_future(http.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": True}))
    await wait_for(lambda: rep.in_flight == 1)
    assert rep.awaiting_first_byte == 1 and rep.queued == 1.0
    assert r.router._signals(pool, 0.0).waiting == 1.0
    resp = await task
    await resp.content.readline()  # the first event: past the prefill, generating
    assert rep.in_flight == 1 and rep.awaiting_first_byte == 0
    await resp.read()
    resp.close()
    plain = asyncio.ensure_future(http.post(r.url + "/v1/chat/completions", json=CHAT))
    await wait_for(lambda: rep.in_flight == 1)
    assert rep.awaiting_first_byte == 0
    (await plain).close()
    await wait_for(lambda: rep.in_flight == 0)
    assert rep.awaiting_first_byte == 0


async def test_a_diluted_burst_wake_up_brings_the_local_loops_next_step_forward(fakes, routers, http) -> None:
    """End to end through the real router and `run_local`: the router's burst episode wakes the loop, whose woken
    step measured the burst diluted by the seconds before it (four requests over more than a detection window,
    against the detector's 42 req/s), so the loop steps once more a detection window later, over the burst's own
    seconds (`follow_up_s`), and then waits out its interval."""
    import time

    from llmfleet.api import InferenceService, parse_resource
    from llmfleet.autoscaler.actuation import ObservedReplica
    from llmfleet.autoscaler.controller import StepResult
    from llmfleet.autoscaler.local import run_local
    from llmfleet.router.burst import WINDOW_S

    replica = await fakes()
    r = await routers(config({"primary": ("m", [replica.url])}))

    class OpensOnFourth:  # the detector's contract, as above
        rate, window_s, seen = 42.0, 3, 0

        def observe(self, now: float) -> bool:
            self.seen += 1
            return self.seen == 4

    r.router.burst = OpensOnFourth()  # type: ignore[assignment]

    class OneReplica:  # a fixed fleet: the test is about when the loop steps, not what it asks for
        async def list_replicas(self, pool: str) -> list[ObservedReplica]:
            return [ObservedReplica(pool, "a", replica.url)]

        async def set_replicas(self, desired: object, *, reason: str, state_json: str | None = None) -> None:
            return None

        async def drain_and_remove(self, replica: ObservedReplica, *, timeout_s: float) -> object:
            raise AssertionError("no scale-in expected")

    isvc = parse_resource({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "svc"},
        "spec": {"model": {"path": "/m", "servedName": "m"}, "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                 "autoscaling": {"policy": "slo", "intervalSeconds": 60}},
    })
    assert isinstance(isvc, InferenceService)
    steps: list[tuple[float, StepResult]] = []
    stop = asyncio.Event()
    loop = asyncio.create_task(run_local(isvc, OneReplica(), lambda pool: [replica.url], stop,  # type: ignore[arg-type]
                                         router_url=r.url, on_step=lambda res: steps.append((time.monotonic(), res))))
    try:
        await wait_for(lambda: len(steps) == 1, timeout=10)
        # the burst comes more than a detection window after that step: the woken step's rates span those seconds
        await asyncio.sleep(WINDOW_S + 1.0)
        for _ in range(4):
            async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
        await wait_for(lambda: len(steps) == 3, timeout=15)
        (woke_at, woken), (next_at, follow) = steps[1], steps[2]
        assert next((s.window_s for s in woken.signals if s.role == "primary"), 0.0) > WINDOW_S
        assert woken.follow_up_s == WINDOW_S and follow.follow_up_s is None
        assert WINDOW_S - 0.5 <= next_at - woke_at <= WINDOW_S + 2.0
        await asyncio.sleep(2.0)  # then the interval (60 s): no step in the next seconds
        assert len(steps) == 3
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)


async def test_the_fallback_signals_read_each_pools_prefill_queue_at_its_speed(fakes, routers) -> None:
    """The server's fallback signals: the least-loaded replica's prefill wait at the pool's price, over the pool's
    prefill_speedup from the router config (a small student on the primary's GPU)."""
    from llmfleet.router.plugins import RequestInfo
    from llmfleet.router.plugins.base import charge_prefill

    a, b, s = await fakes(name="a"), await fakes(name="b"), await fakes(name="s")
    cfg = config({"primary": ("m", [a.url, b.url]), "small": ("s", [s.url])})
    cfg = cfg.model_copy(update={"pools": [cfg.pools[0], cfg.pools[1].model_copy(update={"prefill_speedup": 4.0})]})
    r = await routers(cfg)
    primary, small = r.router.pools["primary"], r.router.pools["small"]
    await wait_for(lambda: len(primary.replicas.routable()) == 2 and len(small.replicas.routable()) == 1)
    for rep, tokens in ((primary.replicas.replicas[a.url], 3000.0), (primary.replicas.replicas[b.url], 2000.0),
                        (small.replicas.replicas[s.url], 2000.0)):
        charge_prefill(RequestInfo(model="m", now=0.0), rep, tokens, 1000.0)
    assert r.router._signals(primary, 0.0).prefill_wait_ms == pytest.approx(2000.0)  # the least-loaded replica's
    assert r.router._signals(small, 0.0).prefill_wait_ms == pytest.approx(500.0)
