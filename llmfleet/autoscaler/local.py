"""The autoscaler loop for the local runtime (`llmfleet up`) and the standalone `llmfleet autoscaler run`.

`run_local(isvc, actuator, replica_urls)` is the contract llmfleet.local.foreground calls: every
`spec.autoscaling.intervalSeconds` it scrapes the router and the replicas (or queries Prometheus when
`prometheus_url` is given) and runs one `controller.autoscale_step` through `actuator`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.autoscaler.actuation import Actuator
from llmfleet.autoscaler.controller import StepResult, autoscale_step
from llmfleet.autoscaler.policy import PolicyState, PoolSignals
from llmfleet.autoscaler.scalein import lost_blocks_of_pools
from llmfleet.autoscaler.signals import PoolRef, PrometheusSignals, ScrapeSignals

log = logging.getLogger("llmfleet.autoscaler")


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
    while not stop.is_set():
        lost = source.lost_blocks([p.name for p in isvc.pools()]) if isinstance(source, ScrapeSource) else None
        result = await autoscale_step(isvc, actuator, source, state, time.monotonic(), replicas_from_spec=False,
                                      lost_blocks=lost or None)
        state = result.decision.state
        for name, d in result.decision.pools.items():
            if d.action != "hold":
                log.info("%s: %d -> %d (%s)", name, d.current, d.desired, "; ".join(d.reasons))
        if on_step is not None:
            on_step(result)
        if once:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
    return state
