"""The scaling policy: signals + state in, desired replicas per pool (with reasons) + new state out.

Pure and deterministic (no clock, no I/O, the input state is never mutated), so the operator, the
local runtime and the simulator run the same code. Policies, selected by `spec.autoscaling.policy`:

- `slo` (default): per-replica capacity (seeded by the planner's roofline, learned online) and an
  Erlang-C estimate of TTFT p95 (the wait for the prefills ahead; capacity.py) at the arrival rate
  forecast one cold start ahead; feedback from the
  observed TTFT/TPOT p95 when the model is too optimistic. Student pools are sized for the overflow
  the primary cannot absorb while it scales (cold start) or when it is at maxReplicas.
- `queue`: KEDA/HPA-style, `ceil(waiting / targetQueueDepth)` with a 10 % tolerance (the baseline).
- `static`: the replicas written in the spec.

Then, for `slo` and `queue`, the HPA's behaviour: scale up to the lowest recommendation of the
up-window at most `maxScaleUpStep` at once (no cooldown: spec replicas already count replicas that
are still starting), scale down to the highest recommendation of the down-window, at most
`maxScaleDownStep` at once, not within `cooldownSeconds` of the last action. For `slo`'s primary, while
ready student replicas can stand in for its replicas, both windows shrink to one cold start (stabilize.py).
Missing or stale signals hold the current size and block scale-down for a whole down-window.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

from llmfleet.autoscaler.capacity import (
    LEVEL_NOISE,
    learn_efficiency,
    replicas_for_ttft,
    service_seconds,
    wait_p95_seconds,
    work_per_replica,
)
from llmfleet.autoscaler.pricing import (
    planned_replica_rps,
    replica_rps,
    request_cost,
    seed_at_mix,
    track_prefill_spread,
    ttft_wait_budget,
    window_seconds,
)
from llmfleet.autoscaler.stabilize import cold_start_seconds, idle_horizon, stabilize
from llmfleet.autoscaler.state import Action, PolicyState, PoolState
from llmfleet.autoscaler.students import covered_by_students, insured_from_start, size_students
from llmfleet.autoscaler.types import (
    PolicyConfig,
    PolicyName,
    PoolBounds,
    PoolDecision,
    PoolSignals,
    Role,
    ScalingDecision,
)
from llmfleet.router.burst import BURST_RATIO

__all__ = ["Action", "ScalingDecision", "PolicyConfig", "PolicyName", "PolicyState", "PoolBounds", "PoolDecision",
           "PoolSignals", "PoolState", "Role", "decide"]

# A rate jump is a burst only beyond this many Poisson standard deviations of the interval's expected count: the
# three-sigma convention, a property of counting noise, not of any workload (docs/autoscaler.md).
BURST_SIGMAS = 3.0
# A scale-down must also hold at this much more than the planned rate (the HPA's 10 % tolerance): at a replica
# boundary the recommendation otherwise follows the smoothed rate's noise across it.
DOWN_TOLERANCE = 0.1


def _clamp(n: int, cfg: PoolBounds) -> int:
    return min(max(n, cfg.min_replicas), cfg.max_replicas)


def _track_cold_start(st: PoolState, sig: PoolSignals) -> bool:
    """Measure how long a scale-up takes to become ready (EWMA over scale-ups). True when one became ready now."""
    if st.pending is None:
        return False
    since, target = st.pending
    if sig.ready_replicas >= min(target, sig.replicas):
        sample = sig.now - since
        if sample > 0:
            st.cold_start_s = sample if st.cold_start_s is None else 0.5 * st.cold_start_s + 0.5 * sample
        st.pending = None
        return True
    return False


def _saturated(st: PoolState, sig: PoolSignals) -> bool:
    """Every replica ready for the whole interval had requests waiting all along, and none joined or left: the work
    they did is their capacity. A queue seen at one tick is not enough (one request arriving mid-step meets it)."""
    return (sig.min_queue_depth is not None and sig.min_queue_depth >= 1 and sig.ready_replicas > 0
            and st.prev_ready == sig.ready_replicas)


def _within_noise(gap: float, rate: float, window_s: float) -> bool:
    """A gap between demand and the ready capacity smaller than one standard deviation of the smoothed rate it
    comes from (LEVEL_NOISE of the Poisson count over `window_s`): not evidence of overflow. At full capacity
    every noisy interval would otherwise warm a student, whose stand-in then releases a primary replica."""
    return gap * window_s < LEVEL_NOISE * math.sqrt(max(rate * window_s, 1.0))


def _arrived_late(cfg: PolicyConfig, pool: PoolBounds, st: PoolState, sig: PoolSignals, mu: float) -> bool:
    """A scale-up that just became ready arrived after the demand it was asked for had gone: the replicas ready
    before it meet the TTFT plan at the rate measured now (with the scale-down tolerance)."""
    rate = float(sig.arrival_rate or 0.0) * (1 + DOWN_TOLERANCE)
    need = replicas_for_ttft(rate, request_cost(pool, st, sig, mu), ttft_wait_budget(cfg, pool, st, sig), cfg.max_utilization,
                             pool.max_replicas)
    return need <= st.pending_ready


def _learn(cfg: PolicyConfig, pool: PoolBounds, st: PoolState, sig: PoolSignals) -> None:
    """Update the pool's capacity estimate from the interval's token-level work (capacity.learn_efficiency)."""
    saturated = _saturated(st, sig)
    headroom = sig.ttft_p95_ms is not None and sig.ttft_p95_ms <= cfg.ttft_target_fraction * cfg.ttft_slo_ms
    st.prev_ready = sig.ready_replicas
    work = work_per_replica(sig.prefill_tokens_per_s, sig.decode_tokens_per_s, sig.ready_replicas, seed_at_mix(pool, sig))
    st.efficiency = learn_efficiency(st.efficiency, work, saturated=saturated, headroom=headroom,
                                     interval_s=window_seconds(cfg, sig))


def _slo_primary(
    cfg: PolicyConfig, pool: PoolBounds, st: PoolState, sig: PoolSignals
) -> tuple[int, list[str], float, float]:
    """Raw recommendation of the slo policy for a primary pool.

    Returns (replicas, reasons, planned rate, burst rate): the burst rate is what student pools are sized
    for while the primary cold-starts: within a detected level shift the demand one cold start ahead at the
    last jump's slope, otherwise the planned rate.
    """
    reasons: list[str] = []
    rate = float(sig.arrival_rate or 0.0)
    _learn(cfg, pool, st, sig)
    cold = cold_start_seconds(cfg, pool, st)
    # a decision brought forward (the router's wake-up) measured over part of an interval: it weighs that much
    st.arrival.update(sig.now, rate, weight=window_seconds(cfg, sig) / cfg.interval_s)
    level = st.arrival.level if st.arrival.level is not None else rate
    # Smoothed level (noise), except a jump well above it is a burst: a level shift, taken at once. "Well above":
    # BURST_RATIO (1.5x) the level while the rate is still rising (after a drop the smoothed level's trend undershoots a rate
    # that merely stays; a ramp outpacing the level still counts), by more requests than Poisson noise explains
    # (BURST_SIGMAS standard deviations of the interval's expected count): at a few requests per interval a 1.5x
    # jump happens by chance alone, and each one would keep a student warm and plan the primary for a burst that
    # is not there.
    rising = st.prev_rate is None or rate > st.prev_rate
    window = window_seconds(cfg, sig)
    expected = max(level, 0.0) * window
    if (rate > BURST_RATIO * level and rising
            and (rate - level) * window >= BURST_SIGMAS * math.sqrt(max(expected, 1.0))):
        st.arrival.level, st.arrival.trend, level = rate, 0.0, rate
        st.burst_until = sig.now + cold
        st.last_burst_at = sig.now
        # the level shift this one ends: did its burst go past the ready replicas only as extrapolated? (decide)
        if st.shift_measured_past:
            st.extrapolation_unconfirmed = False
        elif st.shift_extrapolated_past:
            st.extrapolation_unconfirmed = True
        st.shift_extrapolated_past = st.shift_measured_past = False
    base = level
    jump = max(rate - (st.prev_rate if st.prev_rate is not None else rate), 0.0) / max(window, 1e-6)
    st.prev_rate = rate
    burst = min(rate + jump * cold, cfg.burst_forecast_cap * rate)
    forecast = st.arrival.forecast(cold + cfg.interval_s) or base
    # A trend extrapolated over a cold start overshoots after a step: plan for at most +25 % of the base.
    planned = max(base, min(forecast, 1.25 * base))
    in_burst = st.burst_until is not None and sig.now <= st.burst_until
    # Requests already queued on a replica stay there (engines do not hand them over): new replicas only
    # help by taking the new arrivals, so the backlog is planned to clear over several cold starts.
    backlog = max(sig.queue_depth or 0.0, 0.0) / max(4 * cold, 4 * cfg.interval_s)
    seed = seed_at_mix(pool, sig)
    if sig.mean_input_tokens is not None and sig.mean_output_tokens is not None:
        sample = service_seconds(seed, 1.0, sig.mean_input_tokens, sig.mean_output_tokens, sig.prefix_hit_rate or 0.0)
        weight = window_seconds(cfg, sig) / cfg.interval_s
        st.service.update(sig.now, sample, weight=weight)
        # the same cost averaged over the down-window (its time constant), for releases (below)
        slow_alpha = 1.0 - math.exp(-cfg.interval_s / cfg.down_window_s) if cfg.down_window_s > 0 else 1.0
        st.service_slow.update(sig.now, sample, alpha=slow_alpha, beta=0.0, weight=weight)
    track_prefill_spread(cfg, pool, st, sig)
    mu = planned_replica_rps(pool, st, sig)
    # During a ramp that started with a level shift, the smoothed forecast lags by a cold start: plan for
    # the burst rate (the jump's slope kept over one cold start, at most burst_forecast_cap x the rate), once the
    # measured rate already exceeds what the ready replicas carry. A level shift they still absorb is planned at its
    # measured rate; if it keeps rising past them, the next decision extrapolates (students, which start fast, are
    # sized for the burst rate either way: decide).
    if in_burst and rate > sig.ready_replicas * mu * cfg.max_utilization:
        planned = max(planned, burst)
    cost = request_cost(pool, st, sig, mu)
    budget = ttft_wait_budget(cfg, pool, st, sig)
    n = replicas_for_ttft(planned + backlog, cost, budget, cfg.max_utilization, pool.max_replicas)
    if n < sig.replicas:
        # A release is judged at the heavier of the last minute's mix and the down-window's: a replica released for a
        # few light minutes of a heavy-tailed prompt mix takes a cold start to come back when the long prompts
        # return (the Mooncake conversation trace at 1.5x its rate: 76 misses in two minutes). Scale-ups follow the
        # last minute alone.
        mu_down = planned_replica_rps(pool, st, sig, release=True)
        n = min(sig.replicas, replicas_for_ttft((planned + backlog) * (1 + DOWN_TOLERANCE),
                                                request_cost(pool, st, sig, mu_down), budget,
                                                cfg.max_utilization, pool.max_replicas))
    reasons.append(
        f"rate {rate:.2f}/s forecast {planned:.2f}/s backlog {backlog:.2f}/s, {mu:.2f} req/s per replica "
        f"(efficiency {st.efficiency:.2f}), TTFT budget {budget * 1000:.0f} ms -> {n}"
    )
    # Feedback: the SLO is violated with every requested replica ready and the model says "enough". A TTFT miss
    # is a capacity error where queueing made it: not where the TTFT p95 less the engine's queue-time p95 still
    # misses, which is the prompts' own prefill (long prompts) that no replica shortens. A TPOT miss only when
    # requests were waiting all interval (full batches: more replicas mean smaller ones). Without a standing queue,
    # TPOT misses come from long prefills sharing steps with decodes, which the engine's token budget (chunked
    # prefill) or routing answers, not more replicas. The capacity estimate itself is learned from saturation only
    # (_learn), never lowered here: a latency miss has other causes.
    violated = []
    if sig.ttft_p95_ms is not None and sig.ttft_p95_ms > cfg.ttft_slo_ms:
        queued = sig.queue_time_p95_ms
        if queued is not None and sig.ttft_p95_ms - queued > cfg.ttft_slo_ms:
            reasons.append(f"TTFT p95 {sig.ttft_p95_ms:.0f} ms > {cfg.ttft_slo_ms:.0f} with a queue-time p95 of "
                           f"{queued:.0f} ms: the prompts' own prefill, no replica added")
        else:
            violated.append(f"TTFT p95 {sig.ttft_p95_ms:.0f} ms > {cfg.ttft_slo_ms:.0f}")
    if sig.tpot_p95_ms is not None and sig.tpot_p95_ms > cfg.tpot_slo_ms:
        if (sig.min_queue_depth or 0.0) >= 1:
            violated.append(f"TPOT p95 {sig.tpot_p95_ms:.0f} ms > {cfg.tpot_slo_ms:.0f} with requests waiting")
        else:
            reasons.append(f"TPOT p95 {sig.tpot_p95_ms:.0f} ms > {cfg.tpot_slo_ms:.0f} with no standing queue: "
                           "prefills sharing steps with decodes (token budget / routing), no replica added")
    # Only once the last action has had time to show (a cold start and two intervals): right after a
    # scale-up the old replicas still drain the backlog that caused it, which is not a capacity error.
    settled = st.last_action_at is None or sig.now - st.last_action_at >= cold + 2 * cfg.interval_s
    # A p95 over one short interval is noisy (a few long prompts are the p95 of ~60 requests): the
    # violation must persist for two consecutive intervals to count as a capacity error.
    persistent, st.violated_before = bool(violated) and st.violated_before, bool(violated)
    if persistent and settled and sig.ready_replicas >= sig.replicas and n <= sig.ready_replicas and rate > 0:
        n = sig.ready_replicas + 1
        reasons.append("; ".join(violated) + " with all replicas ready: +1")
        st.feedback_floor = (planned, n)
        # held for a down-window, twice as long each time the miss comes back after the model released it: a replica
        # the traffic keeps needing soon stays, one early episode does not set the fleet for the rest of a long run
        # (at most 2^8 down-windows: 21 h at 300 s, a bound on the exponent, not a tuned hold)
        st.feedback_floor_until = sig.now + cfg.down_window_s * 2 ** min(st.feedback_floors, 8)
        st.feedback_floors += 1
    elif st.feedback_floor is not None:
        # The feedback's replica is measured evidence that the model is optimistic at this rate (it said "enough" and
        # the TTFT missed; heavy-tailed prompts queue worse than its estimate). Judged by the model again, the
        # replica would go as soon as the measured TTFT recovered, and the misses would come back: it is kept while
        # the planned rate is within the scale-down tolerance of the rate of the miss, until its hold ends, and
        # forgotten once the pool is below it (the rate fell away and the normal down-window released it). It only
        # holds: it never buys.
        f_rate, f_n = st.feedback_floor
        if sig.replicas < f_n:  # released while held: the rate fell away, and a later miss starts a new count
            st.feedback_floor, st.feedback_floor_until, st.feedback_floors = None, None, 0
        elif st.feedback_floor_until is not None and sig.now > st.feedback_floor_until:
            st.feedback_floor, st.feedback_floor_until = None, None
            reasons.append(f"the feedback's hold at {f_n} ended: judged by the model again")
        elif n < f_n and planned * (1 + DOWN_TOLERANCE) >= f_rate:
            n = f_n
            reasons.append(f"kept at {f_n}: the TTFT missed with {f_n - 1} ready at {f_rate:.2f}/s")
    # Outside a detected level shift the rise since the last interval is noise the significance test rejected:
    # extrapolating its slope over a cold start would warm students for a burst that is not there.
    return n, reasons, planned, max(planned, burst) if in_burst else planned


def _queue_rec(cfg: PolicyConfig, sig: PoolSignals) -> tuple[int, list[str]]:
    if sig.stale or sig.queue_depth is None:
        return sig.replicas, ["metrics stale or missing: hold"]
    current = max(sig.ready_replicas, 1)
    ratio = sig.queue_depth / (current * cfg.target_queue_depth)
    if abs(ratio - 1.0) <= 0.1:
        return sig.replicas, [f"queue {sig.queue_depth:.1f} within 10% of target"]
    n = math.ceil(sig.queue_depth / cfg.target_queue_depth)
    return n, [f"queue {sig.queue_depth:.1f} / target {cfg.target_queue_depth:g} per replica -> {n}"]


def decide(cfg: PolicyConfig, signals: Sequence[PoolSignals], state: PolicyState) -> ScalingDecision:
    """Desired replicas for every configured pool. `state` is not modified; use `ScalingDecision.state` next time."""
    state = copy.deepcopy(state)
    by_name = {s.pool: s for s in signals}
    missing = [p.name for p in cfg.pools if p.name not in by_name]
    if missing:
        raise ValueError(f"no signals for pool(s) {', '.join(missing)}")
    now = max(s.now for s in signals)
    raw: dict[str, tuple[int, list[str]]] = {}
    predicted: dict[str, float | None] = {}
    capacity: dict[str, float | None] = {}
    ready_carry: dict[str, bool] = {}  # the slo primary: its ready replicas carry the demand (TTFT and backlog in plan)
    recent_burst = False  # slo: a level shift's horizon, within a down-window of a burst past the ready primaries
    overflow_seen = False  # slo: demand beyond the ready primaries this interval

    primary = next((p for p in cfg.pools if p.role == "primary"), None)
    students = [p for p in cfg.pools if p.role == "student"]
    # A service's first decision (no state at all: a restart restores it) knows nothing of how its traffic bursts, and
    # the router's burst detector has no baseline for a minute: a burst in those seconds meets the starting fleet
    # alone, a student cold start away. The first student is warmed as insurance for the idle horizon (two primary
    # cold starts: by then the forecast, the detector and a primary started on the first decision's evidence are in
    # place); it stands in for no primary meanwhile (the starting size is the planner's, not yet measured).
    new_service = cfg.policy == "slo" and not state.pools
    fresh = new_service and primary is not None and bool(students)
    arrived = {pool.name: _track_cold_start(state.pool(pool.name), by_name[pool.name]) for pool in cfg.pools}
    for pool in cfg.pools if new_service else ():
        state.pool(pool.name).new_service = True

    if cfg.policy == "static":
        for pool in cfg.pools:
            raw[pool.name] = (pool.static_replicas, ["static policy"])
    elif cfg.policy == "queue":
        for pool in cfg.pools:
            raw[pool.name] = _queue_rec(cfg, by_name[pool.name])
    else:
        overflow = 0.0
        headroom = False
        if primary is not None:
            sig, st = by_name[primary.name], state.pool(primary.name)
            if sig.usable:
                n, reasons, planned, burst = _slo_primary(cfg, primary, st, sig)
                raw[primary.name] = (n, reasons)
                mu = planned_replica_rps(primary, st, sig)
                capacity[primary.name] = mu
                if st.pending is not None or arrived[primary.name]:
                    st.pending_peak = max(st.pending_peak, float(sig.arrival_rate or 0.0))
                if arrived[primary.name]:
                    # a rise shorter than a cold start: the replicas it bought go at break-even (stabilize.py)
                    st.late = _arrived_late(cfg, primary, st, sig, mu)
                    st.short_rise = st.pending_peak if st.late else 0.0
                wait_budget = ttft_wait_budget(cfg, primary, st, sig)
                backlog_past = (sig.queue_depth or 0.0) > sig.ready_replicas * mu * wait_budget
                ready_carry[primary.name] = (
                    sig.ttft_p95_ms is not None and sig.ttft_p95_ms <= cfg.ttft_target_fraction * cfg.ttft_slo_ms
                    and not backlog_past)
                # Overflow the ready primary replicas cannot absorb until new ones are up (or ever, at max).
                ready_cap = sig.ready_replicas * mu * cfg.max_utilization
                reachable = min(n, primary.max_replicas)
                if sig.ready_replicas < reachable or n > primary.max_replicas or sig.replicas > sig.ready_replicas:
                    overflow = max(burst - ready_cap, 0.0)
                elif (sig.degraded_fraction or 0.0) > 0:
                    overflow = max(planned - ready_cap, 0.0)
                if _within_noise(overflow, planned, window_seconds(cfg, sig)):
                    overflow = 0.0
                overflow_seen = overflow > 0
                headroom = overflow == 0.0 and sig.ready_replicas >= sig.replicas and ready_cap >= planned
                # the clearly-idle horizon (two cold starts, stabilize.py): as long as the forecast must have seen
                # demand coming back before capacity is called idle
                last, horizon = st.last_burst_at, idle_horizon(cfg, cold_start_seconds(cfg, primary, st))
                within = last is not None and sig.now - last <= horizon
                # Only bursts of a kind the ready replicas did not absorb warm a student after them: one whose burst
                # rate (the jump's slope over a cold start, which a student taking the burst cannot hide and which
                # sees a burst shorter than the interval whose mean hides it) exceeded their capacity beyond noise
                # (at the lighter of the last minute's mix and the down-window's, as a release is judged at the
                # heavier: at a few requests a minute one long request sets the minute's mean, and a clump of short
                # ones then reads as past a replica at 30 % load; a burst of long requests that is past them shows in
                # the measured TTFT, backlog or overflow), or
                # that overflowed, or left their backlog past the plan or their measured TTFT p95 past the SLO. The
                # SLO, not the plan: a p95 between the two used the margin the plan keeps for noise, which is what it
                # is for (heavy-tailed prompts arriving in the same second on a replica at 15 % load: 760 ms against
                # a 700 ms plan and a 1 s SLO). And only where requests waited past the plan's wait budget (the
                # engine's queue-time p95, where measured): a miss whose wait stayed within it is the prompts' own
                # prefill, which no replica shortens (a 3 s clump of 13 requests on a replica at 30 % load: TTFT p95
                # 1.1 s, queue-time p95 0.2 s against a 0.67 s budget). An interval without a TTFT sample is no
                # evidence either way (its requests may have arrived a moment ago); waiting requests show in the
                # backlog.
                # Remembered for a down-window (the insurance's own memory): traffic that burst past them bursts
                # again, and a level shift that looks small when detected may be the start of the next one. On/off
                # traffic within one replica: no student.
                beyond = st.burst_beyond_ready_at
                remembered = beyond is not None and sig.now - beyond <= max(cfg.down_window_s, horizon)
                silent = (sig.arrival_rate or 0.0) <= 0.0 and sig.ttft_p95_ms is None
                missed = (sig.ttft_p95_ms is not None and sig.ttft_p95_ms > cfg.ttft_slo_ms
                          and (sig.queue_time_p95_ms is None or sig.queue_time_p95_ms > 1000.0 * wait_budget))
                ready_cap_light = sig.ready_replicas * planned_replica_rps(primary, st, sig, evidence=True) * cfg.max_utilization
                window = window_seconds(cfg, sig)
                measured = (overflow_seen or backlog_past or missed or not _within_noise(
                    max(float(sig.arrival_rate or 0.0) - ready_cap_light, 0.0), planned, window))
                extrapolated = not _within_noise(max(burst - ready_cap_light, 0.0), planned, window)
                if within:
                    st.shift_measured_past = st.shift_measured_past or measured
                    st.shift_extrapolated_past = st.shift_extrapolated_past or extrapolated
                # The extrapolation is a forecast: a clump of a few seconds (API traffic whose gaps vary threefold) has a
                # burst's rate over the seconds a woken decision measures, and its slope kept over a cold start is past
                # a replica it never strains. A level shift that went past the ready replicas only as extrapolated, with
                # nothing measured past them over its horizon, was such a clump: the extrapolation alone records nothing
                # after one until a level shift shows measured evidence again (then it is trusted again: the Azure code
                # trace's first burst is recorded only by its extrapolation, and its next, 30 s later, measured).
                strained = measured or (extrapolated and not st.extrapolation_unconfirmed)
                # A remembered burst past the ready replicas is renewed by a level shift that falls silent within its
                # horizon: traffic that comes in bursts out of silence and has burst past them before (the Azure
                # code trace: one request to 450 in 15 s, minutes of nothing between) is bursting again, however
                # small this one was, and its quiet gaps outlast a down-window (measured without the renewal: that
                # trace 99.91 % -> 95.96 %, at half its rate 99.27 % -> 95.48 %: its biggest bursts met no student).
                # Bursts out of silence that never went past the ready replicas renew nothing.
                if within and (strained or (silent and remembered)):
                    st.burst_beyond_ready_at, remembered = sig.now, True
                recent_burst = within and remembered
            else:
                raw[primary.name] = (sig.replicas, ["metrics stale or missing: hold"])
        primary_sig = by_name[primary.name] if primary is not None else None
        ahead = None
        if primary is not None and primary_sig is not None and primary_sig.usable:
            pst, mu_p = state.pool(primary.name), capacity.get(primary.name) or 0.0
            ready_cap_p = primary_sig.ready_replicas * mu_p * cfg.max_utilization

            def ahead(horizon: float) -> float:
                # the smoothed forecast, capped like the primary's plan (+25 % over its level): a student warms up
                # only when the primary's ready replicas will not absorb the demand a student cold start ahead
                level = pst.arrival.level or 0.0
                fc = pst.arrival.forecast(horizon) or level
                gap = max(min(fc, 1.25 * level) - ready_cap_p, 0.0)
                return 0.0 if _within_noise(gap, level, cfg.interval_s) else gap

        if fresh and primary is not None:
            state.pool(students[0].name).startup_until = now + idle_horizon(
                cfg, cold_start_seconds(cfg, primary, state.pool(primary.name)))
        for name, item in size_students(cfg, students, by_name, state, overflow, primary_sig, ahead,
                                        headroom, "from the start: no history of how the traffic bursts yet" if fresh
                                        else "after a level shift: the traffic has burst past the ready primaries"
                                        if recent_burst else None).items():
            raw[name] = item

    covered: dict[str, int] = {}
    if cfg.policy == "slo" and primary is not None and capacity.get(primary.name):
        covered[primary.name] = covered_by_students(cfg, primary, students, by_name, state, capacity[primary.name] or 0.0,
                                                     {name: rec for name, (rec, _) in raw.items()})
    decisions: dict[str, PoolDecision] = {}
    for pool in cfg.pools:
        sig, st = by_name[pool.name], state.pool(pool.name)
        rec, reasons = raw[pool.name]
        rec = _clamp(rec, pool)
        action: Action
        if cfg.policy == "static":
            desired = rec
            action = "up" if rec > sig.replicas else "down" if rec < sig.replicas else "hold"
        else:
            insured = False
            if pool.role == "student":
                # burst insurance (stabilize.py): bought by a scale-up inside a detected burst (or at the start, above),
                # gone at zero, and held for a down-window after the student last served overflow, only while the
                # bursts are ones the student serves: since the latest level shift began it has had traffic while
                # demand exceeded the ready primaries. A level shift the primaries absorb renews none.
                st.burst_insured = sig.replicas > 0 and st.burst_insured
                st.startup_until = st.startup_until if sig.replicas > 0 or fresh else None
                if sig.usable and (sig.arrival_rate or 0.0) > 0 and overflow_seen:
                    st.last_served_at = sig.now
                last = state.pool(primary.name).last_burst_at if primary is not None else None
                served = st.last_served_at
                insured = st.burst_insured and (
                    (served is not None and (last is None or served >= last) and now - served <= cfg.down_window_s)
                    or insured_from_start(st, now))
            desired, action = stabilize(cfg, pool, st, sig, rec, reasons, cold_start_seconds(cfg, pool, st),
                                        covered.get(pool.name, 0), insured, ready_carry.get(pool.name, False))
        if sig.replicas == 0 and (sig.held_requests or 0) > 0 and desired < 1 <= pool.max_replicas:
            # Scale from zero: requests wait at the router for this pool; start a replica now, whatever the
            # stabilization windows say (there is nothing to keep stable at zero).
            desired, action = 1, "up"
            reasons = [*reasons, f"scale from zero: {sig.held_requests:g} request(s) held at the router"]
        if desired == sig.replicas:
            action = "hold"
        if action != "hold":
            st.last_action_at, st.last_action = sig.now, action
        if action == "up" and pool.role == "student" and (recent_burst or fresh):
            st.burst_insured = True
        if action == "up" or (action == "down" and desired <= st.pending_ready):
            st.late = False  # a new scale-up is judged when it is ready; a late one is over once released
        if action == "up" and st.pending is None:
            # Measure from this scale-up until its replicas are ready (later steps wait for the next sample).
            st.pending = (sig.now, desired)
            st.pending_ready, st.pending_peak = sig.ready_replicas, float(sig.arrival_rate or 0.0)
        elif action == "down" and st.pending is not None:
            st.pending = (st.pending[0], desired) if desired > sig.ready_replicas else None
        pred: float | None = None
        cap = capacity.get(pool.name)
        if cap is None and sig.usable:
            cap = replica_rps(pool, st, sig)
        if cap is not None and sig.arrival_rate is not None:
            wait = wait_p95_seconds(desired, sig.arrival_rate, request_cost(pool, st, sig, cap))
            pred = (wait + request_cost(pool, st, sig, math.inf).prefill_s) * 1000.0 if math.isfinite(wait) else None
        predicted[pool.name] = pred
        decisions[pool.name] = PoolDecision(
            pool=pool.name,
            current=sig.replicas,
            desired=desired,
            recommended=rec,
            action=action,
            reasons=tuple(reasons),
            predicted_ttft_ms=pred,
            capacity_rps=cap,
        )
    return ScalingDecision(now=now, policy=cfg.policy, pools=decisions, state=state)
