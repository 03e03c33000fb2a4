"""Hindsight replica schedules: roughly how few GPU-seconds any autoscaler could spend on a workload.

An autoscaler is judged against static fleets, but what it could save at best depends on the workload: on a
flat trace the right-sized static fleet is already close to the floor. This module estimates that floor.
It searches for a replica count per time window (default 60 s) that keeps the TTFT attainment target over
the whole workload with the fewest GPU-seconds, replaying the workload in the simulator: the schedule is
chosen knowing every request to come, so it starts replicas a cold start before they are needed (paying
for them from then), which no real policy can do. `instant=True` also removes the cold start, for a
looser estimate.

The search is a descent, not an exhaustive one: start from a static schedule that meets the target (the
caller's static-at-peak size), then lower one window at a time by one replica, highest windows first
(or in time order, forward or backward), and keep each change after which the whole run still meets the
target and costs less; repeat until no window can be lowered. Different orders end in different local
optima, so the search can run several and keep the cheapest.
The result is the best schedule found. It is an estimate of what is achievable, not a proof of a bound:
a cleverer search may find a cheaper one (e.g. raising one window to lower two).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from llmfleet.sim.engine import simulate
from llmfleet.sim.types import PoolSpec, SimConfig, SimResult, SimRouter
from llmfleet.sim.workload import Workload

Order = Literal["highest", "forward", "backward"]


@dataclass(frozen=True)
class HindsightSchedule:
    """The cheapest schedule found, with the run that checked it."""

    replicas: tuple[int, ...]  # replicas running or starting per window, from the first arrival
    window_s: float
    instant: bool  # replicas were ready at once (no cold start)
    attainment: float
    gpu_seconds: float
    simulations: int  # how many full replays the search cost


def attainment(res: SimResult, ttft_slo_s: float) -> float:
    """Share of the servable requests whose first token came within the SLO: unfinished ones count as misses;
    requests longer than the model's context do not count (every engine rejects them, whatever the fleet)."""
    servable = [r for r in res.records if r.get("rejected") != "context"]
    ok = sum(1 for r in servable if r["ttft"] is not None and r["ttft"] <= ttft_slo_s)
    return ok / max(len(servable), 1)


def fewest_static(run: Callable[[int, float | None], SimResult], ttft_slo_s: float, *, target: float = 0.99,
                  upper: int = 64) -> tuple[int, SimResult]:
    """Fewest static replicas whose run (`run(n, stop_below)`) meets `target` TTFT attainment, and that run;
    `upper` if none up to it does (its run then says by how much it misses). Attainment grows with replicas, so a
    galloping search (1, 2, 4, ... until one meets the target, then bisection below it): small fleets simulate much
    faster than the upper bound, so this is cheaper than bisecting [1, upper].

    `stop_below` is for SimConfig.stop_below_attainment: the search passes the target (a run that meets it never
    stops early, and one that cannot is only asked whether it does), and None for the run at `upper`, which it may
    return whole though it misses."""
    if upper < 1:
        raise ValueError(f"the upper bound must be >= 1 replica, got {upper}")
    if not 0 < target <= 1:
        raise ValueError(f"the target must be within (0, 1], got {target:g}")
    # A trial's run is dropped before the next one starts: at most the best run and the trial's are held at once
    # (a run's per-request records are gigabytes on a week-long trace).
    lo, hi = 1, 1
    while True:
        trial = run(hi, None if hi >= upper else target)
        if attainment(trial, ttft_slo_s) >= target or hi >= upper:
            best = trial
            break
        del trial
        lo, hi = hi + 1, min(2 * hi, upper)
    while lo < hi:
        mid = (lo + hi) // 2
        trial = run(mid, target)
        if attainment(trial, ttft_slo_s) >= target:
            hi, best = mid, trial
        else:
            lo = mid + 1
        del trial
    return hi, best


def replay_schedule(workload: Workload, pool: PoolSpec, schedule: tuple[int, ...], ttft_slo_s: float,
                    window_s: float, router: Callable[[], SimRouter], instant: bool = False,
                    stop_below: float | None = None) -> SimResult:
    """Replay `workload` with `pool` held at schedule[i] replicas (ready or starting) in window i.

    The schedule is applied through the simulator's autoscaler hook, so a scale-up pays the pool's cold start
    and a scale-in drains replicas (finishing what they run) exactly as under a real policy; `instant` makes
    new replicas ready at once. Knowing the future, the search starts replicas one cold start early itself.
    `stop_below`: SimConfig.stop_below_attainment (the descent's trials only ask whether they meet the target).
    """
    if not schedule or min(schedule) < 1:
        raise ValueError("a schedule needs at least one window and at least one replica in every window")
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s:g}")
    t0 = workload.requests[0].arrival if workload.requests else 0.0
    spec = replace(pool, replicas=schedule[0], min_replicas=1, max_replicas=max(schedule),
                   cold_start_s=0.0 if instant else pool.cold_start_s)

    def at(t: float) -> int:
        return schedule[min(len(schedule) - 1, max(0, int((t - t0) // window_s)))]

    def hook(now: float, _signals: object) -> dict[str, int]:
        return {spec.name: at(now)}

    # Ticks every 15 s or at the window, whichever is finer, so every window boundary is acted on.
    cfg = SimConfig(pools=[spec], ttft_slo_s=ttft_slo_s, autoscale_interval_s=min(15.0, window_s),
                    stop_below_attainment=stop_below)
    return simulate(workload, cfg, router=router(), autoscaler=hook)


def hindsight_schedule(workload: Workload, pool: PoolSpec, ttft_slo_s: float, start_replicas: int, *,
                       router: Callable[[], SimRouter], target: float = 0.99, window_s: float = 60.0,
                       instant: bool = False, orders: tuple[Order, ...] = ("highest",)) -> HindsightSchedule:
    """Descend from `start_replicas` in every window (which must meet `target`) to the cheapest schedule found.

    `orders`: the order in which each pass visits the windows ("highest" count first, "forward" or "backward"
    in time); with several, one descent per order, and the cheapest result (each descent is a local search
    and different orders end in different schedules; `simulations` counts them all).
    """
    found = [_descend(workload, pool, ttft_slo_s, start_replicas, router, target, window_s, instant, o) for o in orders]
    best = min(found, key=lambda f: f.gpu_seconds)
    return replace(best, simulations=sum(f.simulations for f in found))


def _order(schedule: list[int], order: Order) -> list[int]:
    idx = list(range(len(schedule)))
    if order == "highest":
        return sorted(idx, key=lambda k: (-schedule[k], k))
    return idx if order == "forward" else idx[::-1]


def _descend(workload: Workload, pool: PoolSpec, ttft_slo_s: float, start_replicas: int,
             router: Callable[[], SimRouter], target: float, window_s: float, instant: bool,
             order: Order) -> HindsightSchedule:
    if not workload.requests:
        raise ValueError("the workload has no requests")
    windows = int(workload.duration // window_s) + 1
    schedule = [start_replicas] * windows
    runs = 1
    first = replay_schedule(workload, pool, tuple(schedule), ttft_slo_s, window_s, router, instant)
    best_att, best_gpu = attainment(first, ttft_slo_s), float(first.summary["gpuSeconds"])
    if best_att < target:
        raise ValueError(f"the start schedule ({start_replicas} replicas throughout) meets {best_att:.4f} "
                         f"of the SLO, below the target {target}: start higher")
    lowered = True
    while lowered:
        lowered = False
        for i in _order(schedule, order):
            if schedule[i] <= 1:
                continue
            # One replica at a time, every window in turn: lowering one window all the way first (bisecting
            # it) was tried and ends in worse schedules, since it takes margin the neighbouring windows need.
            trial = schedule.copy()
            trial[i] -= 1
            res = replay_schedule(workload, pool, tuple(trial), ttft_slo_s, window_s, router, instant, stop_below=target)
            runs += 1
            att, gpu = attainment(res, ttft_slo_s), float(res.summary["gpuSeconds"])
            # Strictly cheaper only: a drain that outlasts its window can make a lowering change nothing.
            if att >= target and gpu < best_gpu:
                schedule, best_att, best_gpu, lowered = trial, att, gpu, True
    return HindsightSchedule(tuple(schedule), window_s, instant, best_att, best_gpu, runs)
