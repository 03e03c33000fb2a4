"""One autoscaling step: signals -> decide -> actuate (scale-out directly, scale-in by drain-then-remove).

Shared by the kopf timer (llmfleet.autoscaler.kopf_handlers), the standalone `llmfleet autoscaler` command
and the local runtime. Only the wiring lives here; every decision is in policy.py / scalein.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.autoscaler.actuation import Actuator, DrainResult
from llmfleet.autoscaler.capacity import CapacitySeed
from llmfleet.autoscaler.policy import PolicyConfig, PolicyState, PoolSignals, ScalingDecision, decide
from llmfleet.autoscaler.scalein import choose_victims
from llmfleet.autoscaler.seeds import known_shapes, remember_shapes, seeds_for_service
from llmfleet.autoscaler.signals import PoolRef
from llmfleet.router.burst import follow_up_after

log = logging.getLogger("llmfleet.autoscaler")


def wall_clock_offset() -> float:
    """Unix seconds minus `time.monotonic()`: converts the times of a state decided on the monotonic clock (the
    operator's and the local runtime's `now`) to times another process can read (`PolicyState.to_json`)."""
    return time.time() - time.monotonic()


@dataclass(frozen=True)
class Burst:
    """The router's burst wake-up (llmfleet.router.burst): the arrival rate it measured over its window."""

    rate: float
    window_s: float


@dataclass(frozen=True)
class Wake:
    """Why the router woke the autoscaler: requests held per pool at zero replicas, and/or an arrival burst."""

    held: dict[str, int] = field(default_factory=dict)
    burst: Burst | None = None


def wakes_on_burst(isvc: InferenceService) -> bool:
    """Whether an arrival burst brings the next decision forward: for `slo` only. `queue` is the KEDA/HPA-style
    baseline and decides on its interval, as those do."""
    return isvc.spec.autoscaling.policy == "slo"


def with_burst(signals: Sequence[PoolSignals], burst: Burst | None) -> list[PoolSignals]:
    """The primary's signals at a decision a burst brought forward. Rates measured since the last decision (scrapes:
    `window_s` set) already hold the burst's seconds and are kept. Rates over a fixed window (Prometheus' one
    minute: `window_s` None) dilute a burst seconds old below the policy's burst test: there the router's arrival
    rate over its detection window replaces the primary's where it is higher, with that window as `window_s`."""
    if burst is None:
        return list(signals)
    return [replace(s, arrival_rate=burst.rate, window_s=burst.window_s)
            if s.role == "primary" and s.window_s is None and s.arrival_rate is not None and burst.rate > s.arrival_rate
            else s for s in signals]


class SignalSource(Protocol):
    async def collect(self, pools: Sequence[PoolRef], now: float | None = None) -> list[PoolSignals]: ...


LostBlocks = Mapping[str, int]


@dataclass
class StepResult:
    decision: ScalingDecision
    signals: list[PoolSignals] = field(default_factory=list)
    scaled_out: dict[str, int] = field(default_factory=dict)
    drained: list[DrainResult] = field(default_factory=list)
    # Seconds until the next decision when a burst wake-up's decision measured a diluted burst (follow_up_s); None:
    # the regular interval.
    follow_up_s: float | None = None


async def autoscale_step(
    isvc: InferenceService,
    actuator: Actuator,
    signals: SignalSource,
    state: PolicyState,
    now: float,
    *,
    seeds: Mapping[str, CapacitySeed] | None = None,
    lost_blocks: LostBlocks | None = None,
    drain_timeout_s: float | None = None,
    replicas_from_spec: bool = True,
    held: Mapping[str, int] | None = None,
    burst: Burst | None = None,
) -> StepResult:
    """Run the policy once for `isvc` and apply its decision through `actuator`. `now`: `time.monotonic()` (the
    persisted state's times are converted to Unix seconds).

    The current size of a pool is its spec replicas (Kubernetes: the body is fresh each tick), or with
    `replicas_from_spec=False` the replicas the actuator lists (local runtime: the spec is never rewritten).
    """
    refs = []
    replicas_by_pool = {}
    for view in isvc.pools():
        reps = await actuator.list_replicas(view.name)
        replicas_by_pool[view.name] = reps
        current = view.replicas if replicas_from_spec else len(reps)
        refs.append(PoolRef(view.name, view.role, replicas=current, ready_replicas=sum(r.ready for r in reps)))
    sigs = await signals.collect(refs, now)
    if held:  # the router's wake-up call carries the count before any scrape or Prometheus sees it
        sigs = [replace(s, held_requests=max(s.held_requests or 0, held[s.pool])) if held.get(s.pool) else s
                for s in sigs]
    sigs = with_burst(sigs, burst)
    if seeds is None:  # after the signals: a pool no preset names is seeded from the shape its replicas report
        seeds = seeds_for_service(isvc, known_shapes(sigs, state))
    decision = decide(PolicyConfig.from_service(isvc, seeds=seeds), sigs, state)
    remember_shapes(decision.state, sigs)
    follow = follow_up_after(sigs, burst.rate) if burst is not None else None
    result = StepResult(decision=decision, signals=sigs, follow_up_s=follow)
    ups = {n: d.desired for n, d in decision.pools.items() if d.desired > d.current}
    if ups:
        await actuator.set_replicas(ups, reason="scale out", state_json=decision.state.to_json(wall_clock_offset()))
        result.scaled_out = ups
    timeout = float(drain_timeout_s if drain_timeout_s is not None else isvc.spec.drain_seconds)
    for name, d in decision.pools.items():
        if d.desired >= d.current:
            continue
        victims = choose_victims(replicas_by_pool.get(name, []), d.current - d.desired, lost_blocks)
        for victim in victims:
            log.info("scale-in of %s/%s: %s", name, victim.name, "; ".join(d.reasons))
            result.drained.append(await actuator.drain_and_remove(victim, timeout_s=timeout))
        missing = d.current - d.desired - len(victims)
        if missing > 0:  # replicas the runtime has not created yet: lower the count directly
            await actuator.set_replicas({name: d.current - missing - len(victims)}, reason="scale in")
    if not ups and any(d.action != "hold" for d in decision.pools.values()):
        await actuator.set_replicas({}, reason="state", state_json=decision.state.to_json(wall_clock_offset()))
    return result
