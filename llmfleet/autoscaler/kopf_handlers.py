"""kopf timer per InferenceService: the autoscaler inside the operator. Registered on import.

The operator imports this module from its entry point (`llmfleet.operator.run.run_async`).
The handler is thin: it keeps per-service memory in kopf's memo, builds the signal source and the
Kubernetes actuator, and calls `controller.autoscale_step` (pure policy inside); the actuator and GPU
arbitration use the operator's own Kubernetes client (`share_client`). Configuration by environment:

- `LLMFLEET_PROMETHEUS_URL`: query Prometheus; otherwise scrape the router (`http://<isvc>-router.<ns>:8080`)
  and the replicas directly.
- `LLMFLEET_AUTOSCALER_TICK`: seconds between timer calls (default 5); each service is decided every
  `spec.autoscaling.intervalSeconds`, and at the next tick when its router holds requests for a pool at zero
  replicas (a daemon per service long-polls the router's /admin/held: scale from zero).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf

from llmfleet.api.contracts import (
    AUTOSCALER_STATE_ANNOTATION,
    GROUP,
    INFERENCESERVICE_PLURAL,
    ROUTER_PORT,
    SERVING_PRIORITY_ANNOTATION,
    VERSION,
    child_name,
    now_iso,
)
from llmfleet.api.inferenceservice import InferenceService
from llmfleet.api.loader import ManifestError, parse_resource
from llmfleet.autoscaler.actuation import Actuator
from llmfleet.autoscaler.arbitration import serving_need, serving_priority
from llmfleet.autoscaler.controller import Burst, autoscale_step, wakes_on_burst, wall_clock_offset
from llmfleet.autoscaler.kube import KubernetesActuator, apply_arbitration, pending_gpus
from llmfleet.autoscaler.live_metrics import live_metrics
from llmfleet.autoscaler.policy import PolicyState, PoolSignals
from llmfleet.autoscaler.signals import PoolRef, PrometheusSignals, ScrapeSignals
from llmfleet.kube.client import ApiError, KubeClient, NoClusterConfig
from llmfleet.router.burst import WINDOW_S as BURST_WINDOW_S
from llmfleet.util.prom_text import parse_samples

TICK = float(os.environ.get("LLMFLEET_AUTOSCALER_TICK") or 5.0)
log = logging.getLogger("llmfleet.autoscaler")


@dataclass
class _Memory:
    state: PolicyState
    last_run: float = 0.0
    scrape: ScrapeSignals | None = None
    held: dict[str, int] = field(default_factory=dict)  # the router's wake-up: pool -> requests held
    burst: Burst | None = None  # the router's burst wake-up (slo policy): decide at the next tick
    follow_up_at: float | None = None  # a woken decision measured a diluted burst: decide again then (follow_up_s)
    bad_priority: str | None = None  # the malformed priority annotation already reported (one Event per value)


@dataclass
class _Memo:
    services: dict[str, _Memory] = field(default_factory=dict)
    # The operator's client when it runs these timers (`share_client`), else one from the environment.
    client: KubeClient | None = None
    client_factory: Callable[[], KubeClient] | None = None
    # Set when the operator stops: a timer kopf spawns during shutdown then returns at once instead of
    # scraping (a slow DNS lookup of the router would hold the exit for seconds).
    stopping: bool = False


class _ScrapeSource:
    """ScrapeSignals with replica URLs from the actuator (no Prometheus configured)."""

    def __init__(self, scrape: ScrapeSignals, actuator: Actuator) -> None:
        self.scrape, self.actuator = scrape, actuator

    async def collect(self, pools: Sequence[PoolRef], now: float | None = None) -> list[PoolSignals]:
        urls = {}
        for p in pools:
            urls[p.name] = [r.url for r in await self.actuator.list_replicas(p.name) if r.url and r.ready]
        return await self.scrape.collect(pools, urls, now)


def _memo(memo: Any) -> _Memo:
    got = getattr(memo, "llmfleet_autoscaler", None)
    if not isinstance(got, _Memo):
        got = _Memo()
        memo.llmfleet_autoscaler = got
    return got


def share_client(memo: Any, client: Callable[[], KubeClient]) -> None:
    """Run the autoscaler's API calls on the operator's client (`client()` is called at each tick: the operator
    creates its client once logged in)."""
    _memo(memo).client_factory = client


def _client(m: _Memo) -> KubeClient:
    if m.client_factory is not None:
        return m.client_factory()
    if m.client is None:
        try:
            m.client = KubeClient.from_env()
        except NoClusterConfig as err:
            raise kopf.TemporaryError(f"autoscaler: {err}", delay=60) from err
    return m.client


async def _lost_blocks(router_url: str, pool_names: Sequence[str]) -> dict[str, int] | None:
    """Exclusive prefix blocks per replica from the router's /metrics (None when unreachable)."""
    import httpx

    from llmfleet.autoscaler.scalein import lost_blocks_of_pools

    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            resp = await client.get(router_url + "/metrics")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return lost_blocks_of_pools(parse_samples(resp.text), pool_names)


@kopf.on.cleanup()
async def _stop_autoscaling(memo: kopf.Memo, **_: Any) -> None:
    m = _memo(memo)
    m.stopping = True
    if m.client is not None:  # its own, not the operator's
        await m.client.close()


def _due(mem: _Memory, interval_s: float, now: float) -> bool:
    """Whether this tick decides: an interval since the last decision, requests held at the router, an arrival
    burst once the router's detection window has passed since the last decision (its counts then hold the burst), or
    the follow-up a woken decision that measured a diluted burst asked for."""
    since = now - mem.last_run
    return (since >= interval_s or bool(mem.held) or (mem.burst is not None and since >= BURST_WINDOW_S)
            or (mem.follow_up_at is not None and now >= mem.follow_up_at))


@kopf.timer(GROUP, VERSION, INFERENCESERVICE_PLURAL, interval=TICK, initial_delay=TICK)
async def autoscale_inferenceservice(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
    if _memo(memo).stopping:
        return
    try:
        isvc = parse_resource(dict(body))
    except ManifestError:
        return  # the operator reports invalid specs
    if not isinstance(isvc, InferenceService) or isvc.spec.autoscaling.policy == "static":
        return
    mem = _service_memory(_memo(memo), isvc)
    m = _memo(memo)
    now = time.monotonic()
    if not _due(mem, isvc.spec.autoscaling.interval_seconds, now):
        return
    mem.last_run, mem.follow_up_at = now, None
    held, mem.held = mem.held, {}
    burst, mem.burst = mem.burst, None
    ns = isvc.metadata.namespace or "default"
    actuator = KubernetesActuator(isvc.metadata.name, ns, _client(m))
    router_url = _router_url(isvc)
    prom = os.environ.get("LLMFLEET_PROMETHEUS_URL")
    if prom:
        source: Any = PrometheusSignals(prom, isvc.metadata.name, ns)
    else:
        mem.scrape = mem.scrape or ScrapeSignals(router_url)
        source = _ScrapeSource(mem.scrape, actuator)
    lost = await _lost_blocks(router_url, [p.name for p in isvc.pools()])
    try:
        result = await autoscale_step(isvc, actuator, source, mem.state, now, lost_blocks=lost, held=held,
                                      burst=burst)
    except ApiError as err:
        raise kopf.TemporaryError(f"autoscaler: Kubernetes API call failed: {err}", delay=30) from err
    mem.state = result.decision.state
    mem.follow_up_at = now + result.follow_up_s if result.follow_up_s is not None else None
    if (metrics := live_metrics(result.signals, now_iso())) is not None:
        patch.setdefault("status", {})["metrics"] = metrics
    for name, d in result.decision.pools.items():
        if d.action != "hold":
            kopf.info(body, reason="Scaled", message=f"{name}: {d.current} -> {d.desired}: {'; '.join(d.reasons)}"[:1000])
    await _arbitrate(isvc, dict(body), actuator, result, mem)


def _router_url(isvc: InferenceService) -> str:
    return f"http://{child_name(isvc.metadata.name, 'router')}.{isvc.metadata.namespace or 'default'}:{ROUTER_PORT}"


def _service_memory(m: _Memo, isvc: InferenceService) -> _Memory:
    uid = isvc.metadata.uid or isvc.metadata.name
    mem = m.services.get(uid)
    if mem is None:
        # the annotation's times are Unix seconds; this process decides on its own monotonic clock
        mem = m.services[uid] = _Memory(PolicyState.from_json(isvc.metadata.annotations.get(AUTOSCALER_STATE_ANNOTATION),
                                                              wall_offset=wall_clock_offset(), now=time.monotonic()))
    return mem


@kopf.daemon(GROUP, VERSION, "inferenceservices", cancellation_timeout=5.0)
async def wake_from_zero(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Long-poll the service's router for requests held at a pool with zero replicas and (policy `slo`) for arrival
    bursts; the timer then decides at its next tick (seconds) instead of at the next autoscaling interval."""
    import asyncio

    from llmfleet.autoscaler.local import Wakeup

    try:
        isvc = parse_resource(dict(body))
    except ManifestError:
        return
    if not isinstance(isvc, InferenceService) or isvc.spec.autoscaling.policy == "static":
        return
    ns = isvc.metadata.namespace or "default"
    wakeup = Wakeup(_router_url(isvc))
    never = asyncio.Event()  # kopf cancels this task when the daemon stops
    while not stopped:
        wake = await wakeup.wait(never, 30.0)
        mem = _service_memory(_memo(memo), isvc)
        if wake.held:
            log.info("%s/%s: router holds requests for %s; deciding at the next tick", ns, isvc.metadata.name, wake.held)
            mem.held = wake.held
        if wake.burst is not None and wakes_on_burst(isvc):
            log.info("%s/%s: arrival burst at the router (%.1f req/s); deciding at the next tick", ns,
                     isvc.metadata.name, wake.burst.rate)
            mem.burst = wake.burst


def _burning(isvc: InferenceService, signals: Sequence[PoolSignals]) -> bool:
    """The primary misses its latency SLO on fresh data (p95 over the objective)."""
    slo = isvc.spec.slo
    for s in signals:
        if s.role == "primary" and not s.stale:
            return (s.ttft_p95_ms or 0.0) > slo.ttft_p95_ms or (s.tpot_p95_ms or 0.0) > slo.tpot_p95_ms
    return False


async def _arbitrate(
    isvc: InferenceService, body: dict[str, Any], actuator: KubernetesActuator, result: Any, mem: _Memory
) -> None:
    decision = result.decision
    primary = decision.pools.get("primary")
    desired_gpus = sum(
        decision.pools[p.name].desired * p.resources.whole_gpus for p in isvc.pools() if p.name in decision.pools
    )
    try:
        pending = await pending_gpus(actuator.client, isvc)
    except ApiError as err:
        log.warning("cannot list pods of %s for GPU arbitration: %s", isvc.metadata.name, err)
        return
    try:
        priority = serving_priority(isvc.metadata.annotations)
    except ValueError as err:
        # This service's own mistake: a Warning Event on it (once per value), and no arbitration for it.
        raw_priority = isvc.metadata.annotations.get(SERVING_PRIORITY_ANNOTATION)
        if mem.bad_priority != raw_priority:
            mem.bad_priority = raw_priority
            kopf.warn(body, reason="InvalidAnnotation",  # type: ignore[arg-type]
                      message=f"{err}; GPU arbitration skipped for this service")
        return
    mem.bad_priority = None
    need = serving_need(
        isvc.metadata.name, priority,
        gpu_budget=isvc.spec.autoscaling.gpu_budget, desired_gpus=desired_gpus, pending_gpus=pending,
        burning=_burning(isvc, result.signals) or (primary is not None and primary.desired > primary.current and pending > 0),
    )
    try:
        await apply_arbitration(actuator.client, body, need)
    except ApiError as err:
        log.warning("GPU arbitration for %s failed: %s", isvc.metadata.name, err)
