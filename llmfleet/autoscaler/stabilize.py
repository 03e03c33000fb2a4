"""Stabilization of the scaling policies' raw recommendations: windows, steps, cooldown (HPA behaviour).

Split out of `policy.py` (which calls `stabilize` for the `slo` and `queue` policies); pure, mutates only the
pool's state it is given.
"""

from __future__ import annotations

import math

from llmfleet.autoscaler.state import Action, PoolState
from llmfleet.autoscaler.types import PolicyConfig, PoolBounds, PoolSignals
from llmfleet.router.burst import BURST_RATIO

# The cold start assumed for a pool whose spec names none before one was measured.
DEFAULT_COLD_START_S = 60.0


def cold_start_seconds(cfg: PolicyConfig, pool: PoolBounds, st: PoolState) -> float:
    """Configured cold start, else the measured one, else a default."""
    return pool.cold_start_s or cfg.cold_start_s or st.cold_start_s or DEFAULT_COLD_START_S


def idle_horizon(cfg: PolicyConfig, cold_s: float) -> float:
    """Two cold starts (at least four intervals): the horizon within which the forecast, planning one cold start
    ahead, must have seen demand coming back before capacity is called clearly idle (`stabilize`)."""
    return max(2 * cold_s, 4 * cfg.interval_s)


def stabilize(
    cfg: PolicyConfig, pool: PoolBounds, st: PoolState, sig: PoolSignals, rec: int, reasons: list[str], cold_s: float,
    covered: int = 0, insured: bool = False, ready_carry: bool = False,
) -> tuple[int, Action]:
    """HPA-style windows, steps and cooldown; returns (desired, action).

    `covered`: how many of this pool's replicas the ready replicas of its student pools can stand in for right now
    (the slo policy's primary; 0 otherwise). The down-window exists because a replica released too early takes a
    cold start to come back, during which its traffic waits; while warm students can take that traffic (the
    router's fallback sends it there), a replica no recommendation of the last cold start needed is released
    without waiting for the whole down-window: up to `covered` replicas at once, once per cooldown, while the
    measured TTFT of that cold start stayed within the planned fraction of the SLO. `insured`: a student pool whose
    first replica is burst insurance now (policy.decide; held as the comment below says). `ready_carry`: the slo
    primary's ready replicas carry the interval's demand (policy.decide); after a late scale-up a rise then waits.

    One exception to "down to the highest recommendation of the down-window, maxScaleDownStep at a
    time": capacity that is clearly idle (the highest recommendation over a short window of two cold
    starts is at most `idle_fraction` of the current size) is released by half the excess per cooldown.
    A burst that ended leaves most of its replicas idle; holding them for the whole down-window and then
    shedding one per cooldown costs more GPU time than the burst itself. Two cold starts is the horizon
    within which the forecast has to see demand coming back (it plans one cold start ahead).
    """
    now, current = sig.now, sig.replicas
    if st.first_seen is None:
        st.first_seen = now
    st.history.append((now, rec))
    # A student pool's down-window is rent-or-buy's break-even (its cold start, at least two intervals) for all but
    # one replica: the first is the insurance for a burst coming back and stays for a down-window after the student
    # last served overflow (on the Azure trace bursts recur within it; released, each burst found no student);
    # the others are capacity for the size of the burst that is over, idle once the primaries it bridged are ready.
    # Counted from the last overflow served, not the last recommendation: a forecast overflow the ready primaries
    # took (a primary ramp after a step) reached no student and is no burst coming back. Insurance (`insured`,
    # policy.decide) only where a burst was seen and the student was needed for it: a student warmed on a slow rise
    # (no level shift since the pool was last at zero) bridged a primary's cold start, and traffic that rises slowly
    # gives the forecast time to warm it again; after a level shift the ready primaries absorbed, no overflow
    # reached it.
    # A primary's scale-up that became ready after the demand it was asked for had gone (`late`, policy.decide: the
    # replicas ready before it meet the TTFT plan at the rate measured then) bought capacity for a rise shorter than a
    # cold start, which only a forecast could have served; holding it for the whole down-window waits for the next
    # such rise, which it would again meet late. It goes at the break-even as well, while the measured TTFT of the
    # whole down-window stayed within the plan (below).
    hold = max(cold_s, 2 * cfg.interval_s)  # rent-or-buy's break-even; see the covered release below
    window = cfg.down_window_s
    if cfg.policy == "slo" and (pool.role == "student" or st.late):
        window = min(window, hold)
    keep = max(cfg.up_window_s, cfg.down_window_s)
    st.history = [(t, r) for t, r in st.history if t >= now - keep]
    if sig.ttft_p95_ms is not None and not sig.stale:
        st.ttft_history.append((now, sig.ttft_p95_ms))
    st.ttft_history = [(t, p) for t, p in st.ttft_history if t >= now - cfg.down_window_s]
    up = min(r for t, r in st.history if t >= now - cfg.up_window_s)
    down = max(r for t, r in st.history if t >= now - window)
    if window < cfg.down_window_s and insured:
        down = max(down, 1)
    if current < pool.min_replicas or current > pool.max_replicas:
        reasons.append(f"outside [{pool.min_replicas}, {pool.max_replicas}]")
        return min(max(current, pool.min_replicas), pool.max_replicas), ("up" if current < pool.min_replicas else "down")
    planned_ms = cfg.ttft_target_fraction * cfg.ttft_slo_ms
    carried = sig.ttft_p95_ms is None or sig.ttft_p95_ms <= planned_ms
    # A rise after one whose scale-up arrived late (`st.short_rise`, policy.decide): rises here have been shorter than
    # a cold start, so a replica bought now would arrive after this one too. It waits while the ready replicas carry
    # the demand (`ready_carry`, policy.decide: the measured TTFT p95 within the plan and the waiting requests
    # drained within the TTFT budget) and buys at once when they do not; the next scale-up judged on arrival renews
    # or ends the evidence (measured in docs/benchmarks/autoscale_eval.md, "Synthetic shapes"). Also while a scale-up
    # is still starting: replicas added on top of it would arrive after it too. The evidence covers rises to the
    # highest rate measured during that short one (`st.short_rise`): a rate BURST_RATIO past it is a rise of another
    # size, which the evidence says nothing about, and the ready replicas' TTFT and backlog show it only a step late
    # (a 10x step after a short rise of a few requests a second: docs/benchmarks/autoscale_phase.md).
    if (cfg.hold_after_short_rise and cfg.policy == "slo" and up > current and ready_carry and not sig.stale
            and 0 < float(sig.arrival_rate or 0.0) <= BURST_RATIO * st.short_rise):
        reasons.append(f"the last scale-up arrived after its rise and the ready replicas carry this one "
                       f"(TTFT p95 {sig.ttft_p95_ms:.0f} ms within the plan, backlog within the budget): scale-up to "
                       f"{up} waits")
        return current, "hold"
    if up > current and covered > 0 and carried and not sig.stale:
        # Covered by warm students (they carry the overflow with room to spare, and the pool's measured TTFT shows
        # it), a scale-up waits like a release: a primary started for an overflow that ends at once costs a cold
        # start and a hold for nothing, so it is bought only once the recommendation has asked for it for a whole
        # hold (rent-or-buy again). A TTFT above the plan says the students do not carry it: no wait.
        sustained = min(r for t, r in st.history if t >= now - hold)
        if sustained <= current:
            reasons.append(f"ready students carry the overflow: scale-up to {up} waits until {hold:g} s ask for it")
            return current, "hold"
        up = sustained
    if up > current:
        desired = min(up, current + cfg.max_up_step)
        if desired < up:
            reasons.append(f"step limited to +{cfg.max_up_step}")
        return desired, "up"
    # Covered by warm students, a replica released too early costs one cold start of GPU time to come back (its
    # traffic meanwhile goes to the students). Holding an idle replica for as long as that cost and then releasing
    # it is the break-even rule of rent-or-buy: whatever the gap until the replica is needed again, it spends at most
    # twice the GPU time of the better choice made with hindsight. At least two intervals: one noisy interval's
    # recommendation is no evidence.
    needed = max(r for t, r in st.history if t >= now - hold)
    if covered > 0 and needed < current and not sig.stale and now - st.first_seen >= hold:
        worst = max((p for t, p in st.ttft_history if t >= now - hold), default=None)
        cooled = st.last_action_at is None or now - st.last_action_at >= cfg.cooldown_s
        if cooled and (worst is None or worst <= planned_ms):
            desired = max(needed, current - covered)
            reasons.append(f"highest recommendation over {hold:g} s is {needed}, ready students stand in for "
                           f"{covered} replica(s) during a cold start: -{current - desired}")
            return desired, "down"
    # Clearly idle capacity (below) is released even while the down-window still holds the recommendation of a burst
    # that has ended, once the last burst (the slo policy's level-shift detection) began more than a down-window
    # ago: traffic whose bursts recur within the window would find the capacity gone when the next one arrives,
    # faster than a replica starts. A burst that ended keeps its replicas no longer than the idle horizon after that:
    # once it ended, every replica above the highest recommendation over that horizon is idle capacity, not only
    # `idle_fraction` of the pool (traffic that falls off gradually, as sessions begun in the burst finish, never
    # reaches half), provided the measured TTFT p95 of the whole down-window stayed within the plan (the guard of
    # the marginal step below). Pools that saw no burst (students; steady traffic) keep the plain rule.
    ended = st.last_burst_at is not None and now - st.last_burst_at > cfg.down_window_s
    if down < current or (cfg.policy == "slo" and ended):
        if sig.stale:
            reasons.append("stale metrics never scale down")
            return current, "hold"
        short = idle_horizon(cfg, cold_s)
        idle = max(r for t, r in st.history if t >= now - short)
        worst_window = max((p for t, p in st.ttft_history), default=None)  # the whole down-window's (kept that long)
        if (
            cfg.idle_fraction > 0
            and idle < current
            and (idle <= cfg.idle_fraction * current
                 or (cfg.policy == "slo" and ended and (worst_window is None or worst_window <= planned_ms)))
            and now - st.first_seen >= short
            and (st.last_action_at is None or now - st.last_action_at >= cfg.cooldown_s)
        ):
            step = max(cfg.max_down_step, math.ceil((current - idle) / 2))
            why = "clearly idle" if idle <= cfg.idle_fraction * current else "the last burst ended"
            reasons.append(f"{why}: highest recommendation over {short:g} s is {idle}: -{step}")
            return max(idle, current - step), "down"
    if down < current:
        # The window holds the highest recommendation of its seconds; before it has a full window of them it holds the
        # size the pool had when they began. A new service's starting size is the planner's or the spec's, which no
        # recommendation asked for: its first scale-down waits the idle horizon (two cold starts, at least four
        # intervals; the start-up insurance's) and then steps as any other (the TTFT guard, the cooldown, one
        # maxScaleDownStep), down to the highest recommendation seen. A restarted controller (its state restored from
        # the annotation, not new) still waits a full window: its fleet was sized on history it no longer has.
        first = min(window, idle_horizon(cfg, cold_s)) if st.new_service else window
        if now - st.first_seen < first:
            reasons.append(f"scale-down waits for {first:g} s of history (a new service's start: the idle horizon)"
                           if first < window else f"scale-down waits for a full {window:g} s window of history")
            return current, "hold"
        # The model's headroom must show in the measured latency. It plans TTFT at ttft_target_fraction of the
        # SLO; an interval of the window that measured more says the model is optimistic at this size (it
        # counts on the prefix hit rate of the current fleet, which falls when a replica's cache goes, and
        # heavy-tailed prompts make queueing worse than its estimate), so one replica fewer would spend margin
        # that is not there. Clearly idle capacity (above) is released regardless.
        planned_ms = cfg.ttft_target_fraction * cfg.ttft_slo_ms
        look = cfg.down_window_s if st.late else window
        worst = max((p for t, p in st.ttft_history if t >= now - look), default=None)
        if cfg.policy == "slo" and worst is not None and worst > planned_ms:
            reasons.append(f"TTFT p95 reached {worst:.0f} ms in the last {look:g} s, above the "
                           f"planned {planned_ms:.0f} ms: no scale-down")
            return current, "hold"
        if st.last_action_at is not None and now - st.last_action_at < cfg.cooldown_s:
            reasons.append(f"cooldown: last action {now - st.last_action_at:.0f} s ago")
            return current, "hold"
        desired = max(down, current - cfg.max_down_step)
        reasons.append(f"highest recommendation over {window:g} s is {down}"
                       + (" (a scale-up that arrived after the rise it was asked for)" if st.late else ""))
        return desired, "down"
    return current, "hold"
