"""The autoscaler loop for the local runtime (`llmfleet up`) and the standalone `llmfleet autoscaler run`.

`run_local(isvc, actuator, replica_urls)` is the contract llmfleet.local.foreground calls: every
`spec.autoscaling.intervalSeconds` it scrapes the router and the replicas (or queries Prometheus when
`prometheus_url` is given) and runs one `controller.autoscale_step` through `actuator`. Between steps it
long-polls the router's `/admin/held` (llmfleet.router.held): when the router starts holding requests for a
pool at zero replicas, the next step runs at once and starts a replica (scale from zero); when the router sees an
arrival burst (llmfleet.router.burst) and the policy is `slo`, the next step runs as soon as WINDOW_S seconds have
passed since the last one, over the rates since that step (with Prometheus' fixed windows, over the router's burst
rate instead: controller.with_burst).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.autoscaler.actuation import Actuator
from llmfleet.autoscaler.controller import Burst, StepResult, Wake, autoscale_step, wakes_on_burst
from llmfleet.autoscaler.policy import PolicyState, PoolSignals
from llmfleet.autoscaler.scalein import lost_blocks_of_pools
from llmfleet.autoscaler.signals import PoolRef, PrometheusSignals, ScrapeSignals
from llmfleet.router.burst import WINDOW_S as BURST_WINDOW_S

log = logging.getLogger("llmfleet.autoscaler")


class Wakeup:
    """The router's wake-up long poll (held requests, arrival bursts); without a router (or when it fails) a plain
    sleep."""

    def __init__(self, router_url: str | None) -> None:
        self.router_url = router_url
        self.episode = -1

    async def wait(self, stop: asyncio.Event, timeout_s: float) -> Wake:
        """Until `stop`, a new episode at the router (requests held, or a burst), or `timeout_s` (an empty Wake)."""
        stopping = asyncio.ensure_future(stop.wait())
        polling = asyncio.ensure_future(self._poll(timeout_s))
        try:
            done, _ = await asyncio.wait({stopping, polling}, timeout=timeout_s + 5,
                                         return_when=asyncio.FIRST_COMPLETED)
            return polling.result() if polling in done else Wake()
        finally:
            for t in (stopping, polling):
                t.cancel()

    async def _poll(self, timeout_s: float) -> Wake:
        import httpx

        deadline = time.monotonic() + timeout_s
        while self.router_url is not None and (left := deadline - time.monotonic()) > 0:
            try:
                async with httpx.AsyncClient(timeout=left + 5) as client:
                    resp = await client.get(f"{self.router_url}/admin/held", params={"since": self.episode, "wait": left})
                resp.raise_for_status()
                body = resp.json()
            except (httpx.HTTPError, ValueError) as err:  # e.g. the router is (re)starting: retry shortly
                log.debug("router wake-up poll failed: %s", err)
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                continue
            first, self.episode = self.episode < 0, int(body.get("episode", self.episode))
            raw = body.get("burst")
            burst = Burst(float(raw["rate"]), float(raw["windowS"])) if isinstance(raw, dict) and not first else None
            if body.get("held") or burst is not None:
                return Wake({str(k): int(v) for k, v in (body.get("held") or {}).items()}, burst)
            # nothing before the deadline: the first poll (it learns the current episode) or a poll cut short
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))  # no router to ask
        return Wake()


class ScrapeSource:
    """Direct scraping; replica URLs from a callback (pool -> base URLs) or else the actuator's ready replicas."""

    def __init__(self, router_url: str, replica_urls: Callable[[str], list[str]] | None, actuator: Actuator) -> None:
        self.scrape = ScrapeSignals(router_url)
        self.replica_urls, self.actuator = replica_urls, actuator

    async def collect(self, pools: Sequence[PoolRef], now: float | None = None) -> list[PoolSignals]:
        urls: dict[str, list[str]] = {}
        for p in pools:
            if self.replica_urls is not None:
                urls[p.name] = self.replica_urls(p.name)
            else:
                urls[p.name] = [r.url for r in await self.actuator.list_replicas(p.name) if r.url and r.ready]
        return await self.scrape.collect(pools, urls, now)

    def lost_blocks(self, pools: Sequence[str]) -> dict[str, int]:
        """Per replica URL: hot prefix blocks only it holds (router gauge, last scrape), for cache-aware scale-in."""
        return lost_blocks_of_pools(self.scrape.last_router, pools)


async def run_local(
    isvc: InferenceService,
    actuator: Actuator,
    replica_urls: Callable[[str], list[str]] | None,
    stop: asyncio.Event | None = None,
    *,
    router_url: str | None = None,
    prometheus_url: str | None = None,
    on_step: Callable[[StepResult], None] | None = None,
    once: bool = False,
) -> PolicyState:
    """Autoscale `isvc` until `stop` is set (or after one step with `once`); returns the final state."""
    router_url = router_url or getattr(getattr(actuator, "sup", None), "url", None)
    if prometheus_url:
        source: PrometheusSignals | ScrapeSource = PrometheusSignals(
            prometheus_url, isvc.metadata.name, isvc.metadata.namespace or "default"
        )
    elif router_url:
        source = ScrapeSource(router_url, replica_urls, actuator)
    else:
        raise ValueError("no signal source: give router_url or prometheus_url")
    stop = stop or asyncio.Event()
    state = PolicyState()
    interval = isvc.spec.autoscaling.interval_seconds
    wakeup = Wakeup(router_url)
    wake = Wake()
    while not stop.is_set():
        lost = source.lost_blocks([p.name for p in isvc.pools()]) if isinstance(source, ScrapeSource) else None
        last = time.monotonic()
        result = await autoscale_step(isvc, actuator, source, state, last, replicas_from_spec=False,
                                      lost_blocks=lost or None, held=wake.held, burst=wake.burst)
        state = result.decision.state
        for name, d in result.decision.pools.items():
            if d.action != "hold":
                log.info("%s: %d -> %d (%s)", name, d.current, d.desired, "; ".join(d.reasons))
        if on_step is not None:
            on_step(result)
        if once:
            break
        wait = result.follow_up_s if result.follow_up_s is not None else interval
        deadline, wake = time.monotonic() + wait, Wake()
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            wake = await wakeup.wait(stop, left)
            if wake.burst is not None and not wakes_on_burst(isvc):
                wake = Wake(wake.held)  # the queue policy decides on its interval only
            if wake.held or wake.burst is not None:
                break
        if wake.held:
            log.info("router holds requests for %s: stepping now", wake.held)
        elif wake.burst is not None:
            log.info("router saw an arrival burst (%.1f req/s): stepping now", wake.burst.rate)
            # at least the router's detection window after the last step: its counts then hold the burst
            await asyncio.sleep(max(0.0, last + BURST_WINDOW_S - time.monotonic()))
    return state
