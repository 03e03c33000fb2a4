"""Table-driven tests of the pure scaling policy, continued: burst capacity, capacity learning from true saturation,
late scale-ups, idle scale-down, students, the measured request mix."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.autoscaler.capacity import CapacitySeed
from llmfleet.autoscaler.policy import (
    PolicyConfig,
    PolicyState,
    PoolBounds,
    PoolSignals,
    decide,
)
from llmfleet.autoscaler.types import MAX_UTILIZATION
from llmfleet.router.burst import BURST_RATIO

from .test_autoscaler_policy import (
    MEAN_IN,
    MEAN_OUT,
    MU,
    SEED,
    World,
    _sig,
    config,
    needed,
    primary_only,
    running,
)

# --- burst capacity, unbiased capacity learning, idle scale-down ---------------------------------------------

@pytest.mark.parametrize(
    "ready_before,ready_now,min_queue,expect_lowered",
    [
        (4, 4, 3.0, True),  # every replica had requests waiting all interval, same replicas: work is capacity
        (2, 4, 3.0, False),  # replicas joined during the interval: not all of them were busy all along
        (4, 4, 0.0, False),  # a queue at the tick (40 waiting) but one that emptied during the interval
        (4, 4, None, False),  # no measurement of the interval's queue: never saturation
    ],
)
def test_capacity_learns_down_only_from_true_saturation(
    ready_before: int, ready_now: int, min_queue: float | None, expect_lowered: bool
) -> None:
    cfg = config()
    low = dict(prefill_tokens_per_s=0.3 * SEED.prefill_tokens_per_s * ready_now,
               decode_tokens_per_s=0.3 * SEED.decode_tokens_per_s * ready_now)
    small = _sig("small", 0.0, 0, 0, 0.0)
    d = decide(cfg, [_sig("primary", 0.0, ready_now, ready_before, 5.0, queue_depth=40.0), small], PolicyState())
    d = decide(cfg, [_sig("primary", 15.0, ready_now, ready_now, 5.0, queue_depth=40.0, min_queue_depth=min_queue,
                          **low), replace(small, now=15.0)], d.state)
    eff = d.state.pools["primary"].efficiency
    assert (eff < 1.0) == expect_lowered, eff


@pytest.mark.parametrize(
    "jump_to,expect_primary_at_least,expect_students_at_least",
    [
        (2.8, 0, 0),  # below the level-shift threshold (1.5x): no burst planning, nothing for students
        (10.0, 6, 1),  # 5x jump: primary plans for the jump's slope (step-limited), students cover the gap
        (20.0, 6, 2),  # 10x: more student capacity for the overflow until the primary is ready
    ],
)
def test_level_shift_plans_for_the_ramp_and_sizes_students_for_the_overflow(
    jump_to: float, expect_primary_at_least: int, expect_students_at_least: int
) -> None:
    w = World(config())
    for i in range(10):
        w.tick(15.0 * i, 2.0)
    d = w.tick(150.0, jump_to)
    prim, small = d.pools["primary"], d.pools["small"]
    if expect_primary_at_least == 0:
        assert prim.desired <= needed(jump_to) + 1 and small.desired == 0
        return
    # the burst rate: the jump's slope kept over one cold start, capped at 2x the rate
    assert prim.desired >= min(expect_primary_at_least, 2 + w.cfg.max_up_step)
    assert prim.recommended >= needed(min(2.0 * jump_to, jump_to + (jump_to - 2.0) / 15.0 * 60.0)) - 1
    assert small.desired >= expect_students_at_least
    # the burst plan lasts one cold start: afterwards the smoothed forecast (capped at +25 %) rules again
    for i in range(1, 12):
        d = w.tick(150.0 + 15.0 * i, jump_to)
    assert d.pools["primary"].recommended <= needed(1.25 * jump_to) + 2


def test_a_level_shift_the_ready_primaries_absorb_is_planned_at_its_measured_rate() -> None:
    """2 -> 5 req/s on 3 ready primaries (~7.8 req/s at full utilization) is a level shift, but the ready replicas
    carry it: the primary plans for the measured rate, not the jump's slope kept over a cold start (10 req/s, which
    would start primaries that arrive after it). A jump past the ready replicas still plans the burst rate (above)."""
    w = World(config(), replicas={"primary": 3, "small": 0}, state=running())  # a running service's three
    for i in range(10):
        w.tick(15.0 * i, 2.0)
    assert w.ready["primary"] == 3 and 3 * MU * MAX_UTILIZATION > 5.0
    d = w.tick(150.0, 5.0)
    assert w.state.pool("primary").last_burst_at == 150.0  # detected as a level shift
    prim = d.pools["primary"]
    assert prim.recommended <= 3 < needed(10.0)  # the ready replicas carry it; not the burst rate
    assert prim.desired <= 3


def _no_students() -> PolicyConfig:
    """The slo policy without students (none can stand in for a released primary)."""
    return config(pools=(PoolBounds("primary", "primary", 1, 30, 2, seed=SEED),
                         PoolBounds("small", "student", 0, 0, 0, seed=CapacitySeed(40000.0, 6000.0))))


def test_a_scale_up_that_arrives_after_a_short_rise_goes_at_break_even() -> None:
    """A 30 s rise asks for a third primary, which is ready after the rise is over (the two ready before it meet the
    plan at the rate measured then): it goes one cold start after, not after the 300 s down-window, where it would
    wait for the next short rise, which it would again meet late. A rise that lasts past the cold start keeps it
    longer: for the idle horizon (two cold starts) after the rise, which began a down-window before it ended."""
    for ends, released_by in ((330.0, 450.0), (600.0, None)):
        w = World(_no_students())
        w.run(lambda t, ends=ends: 4.0 if 300.0 <= t < ends else 1.5, 1000)  # noqa: B023
        ups = [t for t, _, d in w.log if d.pools["primary"].action == "up"]
        downs = [t for t, _, d in w.log if d.pools["primary"].action == "down"]
        assert ups == [300.0] and downs, (ups, downs)
        if released_by is not None:
            assert downs[0] <= released_by
            d = next(d for t, _, d in w.log if t == downs[0])
            assert "arrived after the rise" in " ".join(d.pools["primary"].reasons)
        else:
            assert downs[0] >= ends + 2 * w.cold_start - 15.0  # the idle horizon after the last high recommendation
            d = next(d for t, _, d in w.log if t == downs[0])
            assert "the last burst ended" in " ".join(d.pools["primary"].reasons)


def test_after_a_late_scale_up_the_next_rise_waits_while_the_ready_replicas_meet_the_ttft_plan() -> None:
    """Once a scale-up arrived after its rise, the next rise buys no replica while the ready ones measurably carry it
    (TTFT p95 within the plan): it would arrive late again. When the measured TTFT passes the plan it buys at once,
    and a scale-up that then arrives while the demand is still there ends the waiting."""
    w = World(_no_students())

    def rate(t: float) -> float:
        return 4.0 if 300.0 <= t < 330.0 or 900.0 <= t < 945.0 or t >= 1500.0 else 1.5

    for i in range(150):
        t = 15.0 * i
        busy = 900.0 <= t < 945.0 or t >= 1530.0
        w.tick(t, rate(t), ttft=1500.0 if busy else 300.0)
    ups = [t for t, _, d in w.log if d.pools["primary"].action == "up"]
    assert ups[0] == 300.0  # the first rise: no history, bought at once (arrived late)
    waited = [d for t, _, d in w.log if 900.0 <= t < 945.0 or 1500.0 <= t < 1530.0]
    assert ups[1:] == [900.0, 1530.0], ups  # the TTFT above the plan buys at once (900 s), within plan it waits
    assert any("arrived after its rise" in " ".join(d.pools["primary"].reasons) for d in waited)
    assert not w.state.pool("primary").short_rise  # the last one arrived while the demand was still there
    # the same rises with requests piling up beyond what the ready replicas drain within the TTFT budget: no wait
    w = World(_no_students())
    for i in range(150):
        t = 15.0 * i
        w.tick(t, rate(t), ttft=300.0, queue=50.0 if rate(t) > 2 else 0.0)
    assert [t for t, _, d in w.log if d.pools["primary"].action == "up"][:3] == [300.0, 900.0, 1500.0]


def test_after_a_late_scale_up_a_rise_during_a_cold_start_waits_while_the_ready_replicas_carry_it() -> None:
    """The wait after a late scale-up also holds while another scale-up is still starting: a rise whose TTFT passed the
    plan bought a replica (900 s); a larger one right after (915 s), which the two ready replicas measurably carry,
    buys none on top of it: those would arrive after it too. It is no larger than BURST_RATIO times the short rise's
    highest rate (4 req/s at 300 s)."""
    w = World(_no_students())

    def rate(t: float) -> float:
        return 4.0 if 300.0 <= t < 330.0 or t == 900.0 else 5.5 if 915.0 <= t < 945.0 else 1.5

    for i in range(70):
        t = 15.0 * i
        w.tick(t, rate(t), ttft=1500.0 if t == 900.0 else 300.0)
    ups = [t for t, _, d in w.log if d.pools["primary"].action == "up"]
    assert ups == [300.0, 900.0], ups
    asked = [d.pools["primary"] for t, _, d in w.log if 915.0 <= t < 945.0 and d.pools["primary"].recommended
             > d.pools["primary"].current]
    assert asked and all(p.current == p.desired and "arrived after its rise" in " ".join(p.reasons)
                         for p in asked), [(p.recommended, p.desired, p.reasons) for p in asked]


def test_a_rise_past_the_short_one_by_the_burst_ratio_buys_at_once() -> None:
    """The evidence of a short rise covers rises of its size: after one to 4 req/s was met late (300 s), a rise to
    8 req/s (900 s), more than BURST_RATIO times that, buys at once although the ready replica's TTFT is still within
    the plan; one to 5.5 req/s waits (the test above)."""
    def ups_and_holds(peak: float) -> tuple[list[float], list[str]]:
        w = World(_no_students())
        for i in range(70):
            t = 15.0 * i
            w.tick(t, 4.0 if 300.0 <= t < 330.0 else peak if 900.0 <= t < 1200.0 else 1.5, ttft=300.0)
        ups = [t for t, _, d in w.log if d.pools["primary"].action == "up"]
        held = [t for t, _, d in w.log if "arrived after its rise" in " ".join(d.pools["primary"].reasons)]
        return ups, held

    assert BURST_RATIO * 4.0 < 8.0
    ups, held = ups_and_holds(8.0)
    assert ups[:2] == [300.0, 900.0] and not held, (ups, held)
    ups, held = ups_and_holds(5.5)
    assert 900.0 in held and 900.0 not in ups, (ups, held)


@pytest.mark.parametrize("restart_at", [315.0, 375.0])
def test_a_restart_keeps_the_judgement_of_a_scale_up_in_flight_or_late(restart_at: float) -> None:
    """The annotation carries a scale-up in flight (since when, to what, how many were ready before it) and the late
    flag: an operator restarted during the third primary's cold start (315 s) still judges it late when it is ready,
    and one restarted after that (375 s) still releases it at the break-even, not after the whole down-window."""
    w = World(_no_students())
    for i in range(70):
        t = 15.0 * i
        if t == restart_at:
            w.state = PolicyState.from_json(w.state.to_json(wall_offset=1e9), wall_offset=1e9, now=t)
            p = w.state.pool("primary")
            assert (p.pending == (300.0, 3) and p.pending_peak == 4.0) if t < 360.0 else (p.late and p.short_rise == 4.0)
        w.tick(t, 4.0 if 300.0 <= t < 330.0 else 1.5)
    downs = [t for t, _, d in w.log if d.pools["primary"].action == "down"]
    assert downs and downs[0] <= 480.0, downs


def test_a_late_scale_up_is_kept_while_the_down_window_measured_ttft_above_the_plan() -> None:
    """The break-even release of a late scale-up still needs the latency of the whole down-window within the plan."""
    w = World(_no_students())
    for i in range(70):
        t = 15.0 * i
        w.tick(t, 4.0 if 300.0 <= t < 330.0 else 1.5, ttft=1500.0 if 300.0 <= t < 345.0 else 300.0)
    downs = [t for t, _, d in w.log if d.pools["primary"].action == "down"]
    assert downs and downs[0] > 345.0 + 300.0 - 15.0
    held = [d for t, _, d in w.log if 400.0 <= t <= 600.0]
    assert any("TTFT p95 reached 1500 ms in the last 300 s" in " ".join(d.pools["primary"].reasons) for d in held)


def test_students_cost_the_overflow_at_the_primary_mix() -> None:
    """A student with no traffic of its own has no mix; the overflow is primary traffic (long prompts here)."""
    cfg = config()
    sigs = [_sig("primary", 0.0, 2, 2, 10.0, queue_depth=0.0),
            PoolSignals("small", "student", 0.0, 1, 1, arrival_rate=0.0)]
    state = PolicyState()
    for i in range(10):
        state = decide(cfg, [replace(s, now=15.0 * i, arrival_rate=2.0 if s.pool == "primary" else 0.0)
                             for s in sigs], state).state
    d = decide(cfg, [replace(s, now=150.0) for s in sigs], state)
    student_mu_at_primary_mix = 1.0 / (MEAN_IN / 40000.0 + MEAN_OUT / 6000.0)
    assert f"at {student_mu_at_primary_mix:.2f} req/s per replica" in d.pools["small"].reasons[0]
    assert d.pools["small"].desired >= 1  # the jump to 10 req/s overflows 2 ready primaries


@pytest.mark.parametrize(
    "current,after_rate,idle_fraction,expect_first_down_by,expect_step_gt_1",
    [
        (12, 2.0, 0.5, 150.0, True),  # clearly idle: released by half the excess after two cold starts
        (12, 2.0, 0.0, None, False),  # disabled: the full down-window first, one replica per cooldown
        (4, 5.0, 0.5, None, False),  # not clearly idle (need 3 of 4): the ordinary, slow path
    ],
)
def test_clearly_idle_capacity_is_released_fast(
    current: int, after_rate: float, idle_fraction: float, expect_first_down_by: float | None, expect_step_gt_1: bool
) -> None:
    # a running service (its state restored): a new one's first scale-down is tested below
    w = World(config(idle_fraction=idle_fraction), replicas={"primary": current, "small": 0}, state=running())
    w.run(lambda t: after_rate, 900)
    downs = [(t, d.pools["primary"]) for t, _, d in w.log if d.pools["primary"].action == "down"]
    assert downs
    if expect_first_down_by is not None:
        assert downs[0][0] <= expect_first_down_by
        assert "clearly idle" in " ".join(downs[0][1].reasons)
    else:
        assert downs[0][0] >= 300 - 15  # waited for the down-window
    assert any(p.current - p.desired > 1 for _, p in downs) == expect_step_gt_1
    assert all(b - a >= 60 for (a, _), (b, _) in zip(downs, downs[1:], strict=False))  # cooldown holds
    assert w.replicas["primary"] >= needed(after_rate)  # never below what the demand needs


def test_idle_fast_path_respects_stale_metrics() -> None:
    w = World(config(), replicas={"primary": 12, "small": 0})
    w.run(lambda t: 1.0, 900, stale=True)
    assert w.replicas["primary"] == 12


@pytest.mark.parametrize(
    ("ttft_ms", "until_s", "expect_first_down_after"),
    [
        (1000.0, None, 300 - 15),  # measured p95 under the planned 1,400 ms (0.7 x SLO): the ordinary path
        (1500.0, None, None),  # above the plan in every interval: the model's headroom is not real, hold
        (1500.0, 300.0, 600 - 15),  # the last high interval must age out of the 300 s window first
    ],
)
def test_slo_scale_down_needs_the_headroom_in_measured_ttft(
    ttft_ms: float, until_s: float | None, expect_first_down_after: float | None
) -> None:
    # 5 req/s needs 3 of 4: not clearly idle; a running service (a new one's first scale-down is tested below)
    w = World(config(), replicas={"primary": 4, "small": 0}, state=running())
    t = 0.0
    while t <= 1200:
        high = until_s is None or t <= until_s
        w.tick(t, 5.0, ttft=ttft_ms if high else 1000.0)
        t += w.cfg.interval_s
    downs = [(tt, d.pools["primary"]) for tt, _, d in w.log if d.pools["primary"].action == "down"]
    if expect_first_down_after is None:
        assert not downs and w.replicas["primary"] == 4
        assert "no scale-down" in " ".join(w.log[-1][2].pools["primary"].reasons)
    else:
        assert downs and downs[0][0] >= expect_first_down_after
        assert w.replicas["primary"] >= needed(5.0)


@pytest.mark.parametrize(("new_service", "first_down_from"), [(True, 120.0), (False, 300.0)])
def test_a_new_services_first_scale_down_waits_the_idle_horizon(new_service: bool, first_down_from: float) -> None:
    """A new service starts at the planner's (or the spec's) size, which no recommendation asked for: its first
    scale-down waits the idle horizon (two 60 s cold starts), not a full 300 s down-window, and then steps like any
    other (one replica per cooldown, down to the highest recommendation seen). A restarted controller (its state
    restored from the annotation) waits the full window: its fleet was sized on history it no longer has."""
    w = World(config(idle_fraction=0.0), replicas={"primary": 6, "small": 0},  # 5 req/s needs 3 of 6
              state=PolicyState() if new_service else running())
    w.run(lambda t: 5.0, 600)
    downs = [(t, d.pools["primary"]) for t, _, d in w.log if d.pools["primary"].action == "down"]
    assert downs and first_down_from <= downs[0][0] < first_down_from + w.cfg.interval_s
    assert all(b - a >= 60 for (a, _), (b, _) in zip(downs, downs[1:], strict=False))  # cooldown holds
    assert all(p.current - p.desired == 1 for _, p in downs)
    assert w.replicas["primary"] == w.log[-1][2].pools["primary"].recommended >= needed(5.0)  # what it asks for
    before = [d.pools["primary"] for t, _, d in w.log if 0 < t < downs[0][0]]
    why = "a new service's start: the idle horizon" if new_service else "a full 300 s window of history"
    assert before and all(why in " ".join(p.reasons) for p in before)


def test_queue_policy_scale_down_ignores_ttft() -> None:
    # the KEDA-like baseline has no latency model to distrust: the guard is the slo policy's
    w = World(config("queue", target_queue_depth=1.0), replicas={"primary": 4, "small": 0})
    for k in range(60):
        w.tick(k * 15.0, 5.0, ttft=1900.0)
    assert w.replicas["primary"] < 4


def test_requests_held_at_the_router_start_a_replica_at_once() -> None:
    """Scale from zero: a pool at zero replicas with requests held at the router goes to one replica in the
    same step, whatever the stabilization windows (and stale metrics) say; without held requests it stays."""
    cfg = config(up_window_s=300.0, cooldown_s=600.0)
    cfg = replace(cfg, pools=[replace(p, min_replicas=0) for p in cfg.pools])
    idle = [_sig("primary", 10.0, 0, 0, 0.0), _sig("small", 10.0, 0, 0, 0.0)]
    assert decide(cfg, idle, PolicyState()).pools["primary"].desired == 0
    held = [replace(idle[0], held_requests=3.0, stale=True), idle[1]]
    d = decide(cfg, held, PolicyState()).pools["primary"]
    assert (d.desired, d.action) == (1, "up") and "scale from zero: 3 request(s) held" in " ".join(d.reasons)


def test_replicas_of_a_burst_that_ended_are_released_without_waiting_for_the_down_window() -> None:
    """One burst (0.5 -> 20 req/s for 300 s) that ends: its scale-up is the down-window's highest recommendation, yet
    once the recommendation is clearly idle the burst's replicas go within two cold starts and a cooldown."""
    w = World(primary_only(), replicas={"primary": 1, "small": 0})
    w.run(lambda t: 20.0 if 300 <= t < 600 else 0.5, 1200)
    assert max(d.pools["primary"].desired for _, _, d in w.log) >= needed(20.0)
    first_down = next(t for t, _, d in w.log if t >= 600 and d.pools["primary"].action == "down")
    assert first_down <= 600 + 2 * 60 + 60 < 600 + w.cfg.down_window_s
    assert "the last burst ended" in " ".join(w.log[int(first_down // 15)][2].pools["primary"].reasons)
    assert w.replicas["primary"] <= 2


def burst_that_tails_off(t: float) -> float:
    """0.5 -> 20 req/s at 300 s; from 600 s it falls back over ten minutes (sessions begun in the burst finishing)."""
    return 0.5 if t < 300 else 20.0 if t < 600 else max(0.5, 20.0 - (t - 600) * 20.0 / 600)


@pytest.mark.parametrize(("ttft_ms", "released_early"), [(1000.0, True), (1500.0, False)])
def test_replicas_of_a_burst_that_ended_follow_its_tail_down(ttft_ms: float, released_early: bool) -> None:
    """A burst that ended and tails off never leaves half the pool idle at once, yet each replica above the highest
    recommendation over the idle horizon (two cold starts) is idle: once the burst began more than a down-window
    ago it goes, half the excess per cooldown, while the measured TTFT p95 stays within the plan (1,400 ms here).
    Above the plan the pool waits until the capacity is clearly idle (half the pool), as before."""
    w = World(primary_only(), replicas={"primary": 1, "small": 0})
    w.run(burst_that_tails_off, 1500, ttft=ttft_ms)
    peak = max(d.pools["primary"].desired for _, _, d in w.log)
    assert peak >= needed(20.0)
    downs = [(t, d.pools["primary"]) for t, _, d in w.log if d.pools["primary"].action == "down"]
    first_at, first = downs[0]
    assert first_at > 300 + w.cfg.down_window_s  # the burst began more than a down-window ago
    if released_early:
        assert "the last burst ended" in " ".join(first.reasons) and first.current == peak
        assert first_at <= 840 and first.desired > w.cfg.idle_fraction * first.current
    else:
        assert "clearly idle" in " ".join(first.reasons) and first_at > 840
    assert all(b - a >= w.cfg.cooldown_s for (a, _), (b, _) in zip(downs, downs[1:], strict=False))
    assert all(d.pools["primary"].desired >= needed(rate) for t, rate, d in w.log if t >= 600)  # never below demand


def recurring_bursts(t: float) -> float:
    """20 req/s for 30 s every 120 s from 300 s on (shorter gaps than the down-window), else 0.5 req/s."""
    return 20.0 if t >= 300 and (t - 300) % 120 < 30 else 0.5


def test_replicas_are_kept_for_the_down_window_while_bursts_recur() -> None:
    """Bursts every 120 s (shorter than the down-window) and no student: each would arrive faster than a replica
    starts, so the capacity of the last one is not released early."""
    w = World(primary_only(), replicas={"primary": 1, "small": 0})
    w.run(recurring_bursts, 900)
    after = [d.pools["primary"].desired for t, _, d in w.log if 450 <= t <= 900]
    assert min(after) >= needed(20.0)


def test_warm_students_let_the_primary_release_a_burst_after_one_cold_start() -> None:
    """Bursts of two minutes every four with a student pool: the first burst warms a student, which can take a
    released primary's traffic while a replica starts again, so the primary goes back down one cold start after
    each burst (not a down-window) and up again for the next; the student stays warm while the bursts recur."""
    w = World(config(), replicas={"primary": 1, "small": 0})
    w.run(lambda t: 20.0 if t >= 300 and (t - 300) % 240 < 120 else 0.5, 1500)
    assert w.ready["small"] >= 1
    lows = [d.pools["primary"].desired for t, _, d in w.log if 540 <= t <= 1500]
    assert min(lows) < needed(20.0) and max(lows) >= needed(20.0)
    downs = [(t, d) for t, _, d in w.log if t >= 540 and d.pools["primary"].action == "down"]
    assert downs and all("ready students stand in for" in " ".join(d.pools["primary"].reasons) for _, d in downs)
    for t, _ in downs:  # never within one cold start of the last interval that needed the replicas
        recent = [d.pools["primary"].recommended for tt, _, d in w.log if t - 60 <= tt < t]
        assert max(recent) <= w.replicas_at(t)


def test_without_a_ready_student_the_primary_keeps_the_down_window() -> None:
    """A student that is still starting (or at zero) stands in for nothing: the fast release needs ready ones."""
    w = World(config(), replicas={"primary": 1, "small": 0}, cold_start=10_000.0)  # nothing ever becomes ready
    w.run(recurring_bursts, 900)
    assert not any("stand in" in " ".join(d.pools["primary"].reasons) for _, _, d in w.log)


def test_warm_students_carry_an_overflow_shorter_than_a_cold_start() -> None:
    """With a ready student that can carry the overflow, the primary starts replicas only for an overflow that
    lasted a cold start (a shorter one would buy a cold start and a hold for nothing); without students at once."""
    def short(t: float) -> float:
        return 8.0 if 60 <= t < 90 else 1.0  # 30 s of 8 req/s: needs 4 primaries, 2 are there

    def sustained(t: float) -> float:
        return 8.0 if t >= 60 else 1.0

    w = World(config(), replicas={"primary": 2, "small": 1}, state=running())
    w.run(short, 240)
    assert max(d.pools["primary"].desired for _, _, d in w.log) == 2
    assert any("ready students carry the overflow" in " ".join(d.pools["primary"].reasons) for _, _, d in w.log)
    w = World(config(), replicas={"primary": 2, "small": 1}, state=running())
    w.run(sustained, 240)
    first_up = next(t for t, _, d in w.log if d.pools["primary"].action == "up")
    assert 60 + 60 <= first_up <= 60 + 60 + 15 and w.replicas["primary"] >= needed(8.0)
    w = World(primary_only(), replicas={"primary": 2, "small": 0})
    w.run(short, 240)
    assert next(t for t, _, d in w.log if d.pools["primary"].action == "up") == 60


def test_a_student_past_its_planned_ttft_carries_nothing() -> None:
    """A student whose own measured TTFT p95 is past the plan (70 % of the SLO) has no spare capacity, whatever its
    capacity model says: the primary scales up at once instead of waiting for it to carry the overflow."""
    for student_ttft, waits in ((None, True), (1000.0, True), (1900.0, False)):
        w = World(config(), replicas={"primary": 2, "small": 1}, state=running())
        w.run(lambda t: 1.0, 30, student_ttft=student_ttft)  # within the idle student's cold start: still there
        d = w.tick(45.0, 8.0, student_ttft=student_ttft)
        assert (d.pools["primary"].action == "hold") is waits, (student_ttft, d.pools["primary"].reasons)


def _primary_only(seed: CapacitySeed) -> PolicyConfig:
    return config(pools=(PoolBounds("primary", "primary", 1, 30, 2, seed=seed),))


def _mix_sig(t: float, mean_in: float, rate: float = 3.0) -> PoolSignals:
    return PoolSignals("primary", "primary", t, 2, 2, arrival_rate=rate, mean_input_tokens=mean_in,
                       mean_output_tokens=MEAN_OUT, queue_depth=0.0)


def test_capacity_is_seeded_at_the_measured_mix() -> None:
    """A seed with a roofline per mix (seeds.py) is read at the interval's mean request shape: a mix at which the
    roofline halves the throughputs halves the capacity per replica and asks for more replicas than the fixed seed."""
    half = CapacitySeed(SEED.prefill_tokens_per_s / 2, SEED.decode_tokens_per_s / 2)
    asked: list[tuple[float, float, float, float | None]] = []

    def at_mix(mean_in: float, mean_out: float, hit: float, kv_sequences: float | None) -> CapacitySeed:
        asked.append((mean_in, mean_out, hit, kv_sequences))
        return half if mean_in > 4000 else SEED

    fixed = decide(_primary_only(SEED), [_mix_sig(0.0, 8000.0)], PolicyState()).pools["primary"]
    mixed = decide(_primary_only(replace(SEED, at_mix=at_mix)), [_mix_sig(0.0, 8000.0)], PolicyState()).pools["primary"]
    assert (8000.0, MEAN_OUT, 0.0, None) in asked  # no KV footprint measured: the planner's own
    assert mixed.capacity_rps == pytest.approx((fixed.capacity_rps or 0.0) / 2)
    assert mixed.recommended > fixed.recommended
    short = decide(_primary_only(replace(SEED, at_mix=at_mix)), [_mix_sig(0.0, MEAN_IN)], PolicyState()).pools["primary"]
    assert short.capacity_rps == pytest.approx(MU)  # the roofline at the seed's own mix: the seed


def test_the_measured_kv_footprint_sizes_a_decode_heavy_pool() -> None:
    """Long answers on long conversations hold the KV cache: the planner's roofline counts a sequence at its final
    context, while the engines' gauges say how many running sequences a full cache holds (PoolSignals.kv_full_sequences:
    shared prompt blocks once, partly generated answers). The policy plans with the measured figure: more sequences
    per cache, a larger decode batch, more requests per replica, fewer replicas; without the gauges it plans as
    before."""
    from llmfleet.autoscaler.seeds import seeds_for_service

    from .test_autoscaler_parts import isvc

    seed = seeds_for_service(isvc())["primary"]

    def sig(kv: float | None) -> PoolSignals:
        return PoolSignals("primary", "primary", 0.0, 12, 12, arrival_rate=3.0, mean_input_tokens=19_000.0,
                           mean_output_tokens=5_000.0, prefix_hit_rate=0.7, queue_depth=0.0, kv_full_sequences=kv)

    cfg = config(pools=(PoolBounds("primary", "primary", 1, 64, 12, seed=seed),))
    planner = decide(cfg, [sig(None)], PolicyState()).pools["primary"]
    measured = decide(cfg, [sig(86.0)], PolicyState()).pools["primary"]
    assert (seed.for_mix(19_000, 5_000, 0.7, 86.0).decode_tokens_per_s
            > 1.1 * seed.for_mix(19_000, 5_000, 0.7).decode_tokens_per_s)
    assert (measured.capacity_rps or 0.0) > 1.1 * (planner.capacity_rps or 0.0)
    assert measured.recommended < planner.recommended
    # a measurement beyond what this mix allows (sequences that would share more than their cached prompt) is held
    # to it: short requests running before a change to long ones do not size the pool for the long ones
    assert seed.for_mix(19_000, 5_000, 0.7, 1e9) == seed.for_mix(19_000, 5_000, 0.7, 200.0)
    assert seed.for_mix(19_000, 5_000, 0.7, 200.0) != seed.for_mix(19_000, 5_000, 0.7, 86.0)


def test_one_interval_of_long_prompts_moves_the_planned_capacity_part_way() -> None:
    """The primary plans at the smoothed cost of its mix: one interval whose mean prompt is 4x the usual (a few very
    long prompts in ~50 requests) lowers the planned capacity, but by less than that interval alone says; intervals
    that stay long bring it there."""
    cfg, st = _primary_only(SEED), PolicyState()
    for k in range(6):
        st = decide(cfg, [_mix_sig(15.0 * k, MEAN_IN)], st).state
    raw_long = 1.0 / (4 * MEAN_IN / SEED.prefill_tokens_per_s + MEAN_OUT / SEED.decode_tokens_per_s)
    d = decide(cfg, [_mix_sig(90.0, 4 * MEAN_IN)], st)
    assert raw_long < (d.pools["primary"].capacity_rps or 0.0) < 0.9 * MU
    st = d.state
    for k in range(7, 20):
        st, d = (x := decide(cfg, [_mix_sig(15.0 * k, 4 * MEAN_IN)], st)).state, x
    assert d.pools["primary"].capacity_rps == pytest.approx(raw_long, rel=0.05)


def test_a_release_is_judged_at_the_mix_of_the_down_window() -> None:
    """Scale-ups follow the last minute's mix; a release is judged at the heavier of that and the down-window's
    average: after 20 minutes of 4,000-token prompts, six and a half minutes of 1,000-token ones release one replica
    of four, not two (the last minute alone says two suffice), and the mix that stays short releases the other."""
    cfg, st, n, t = _primary_only(SEED), PolicyState(), 3, 0.0
    at: dict[float, int] = {}
    for mean_in, until in ((4 * MEAN_IN / 2, 1200.0), (MEAN_IN / 2, 2400.0)):
        while t < until:
            sig = PoolSignals("primary", "primary", t, n, n, arrival_rate=4.0, mean_input_tokens=mean_in,
                              mean_output_tokens=MEAN_OUT, queue_depth=0.0, ttft_p95_ms=500.0)
            d = decide(cfg, [sig], st)
            st, n, at[t] = d.state, d.pools["primary"].desired, d.pools["primary"].desired
            t += 15.0
    assert at[1185.0] == 4  # the long prompts' fleet
    assert at[1590.0] == 3
    assert at[2385.0] == 2


@pytest.mark.parametrize("window_s,burst", [(None, True), (15.0, True), (1.0, False)])
def test_the_burst_test_counts_the_requests_of_the_window_the_rate_was_measured_over(
    window_s: float | None, burst: bool
) -> None:
    """3x the level (2 req/s) is a burst over an interval (about 36 requests more than the smoothed level's) but not
    over one second (4 more: within three Poisson standard deviations), the window a decision brought forward by the
    router's wake-up may have."""
    w = World(config())
    for i in range(10):
        w.tick(15.0 * i, 2.0)
    sigs = [PoolSignals("primary", "primary", 150.0, w.replicas["primary"], w.ready["primary"], arrival_rate=6.0,
                        mean_input_tokens=MEAN_IN, mean_output_tokens=MEAN_OUT, queue_depth=0.0, window_s=window_s),
            PoolSignals("small", "student", 150.0, 0, 0, arrival_rate=0.0, queue_depth=0.0, window_s=window_s)]
    d = decide(w.cfg, sigs, w.state)
    assert (d.state.pool("primary").burst_until is not None) is burst
