"""Student pools cost nothing while the primary has headroom: sized 0 without overflow or traffic of their own,
warmed within an interval of a ramp outgrowing the ready primaries, and still there to absorb a burst while
the primary cold-starts (policy and simulator through the production adapter)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_autoscaler_policy import World, config, primary_only, running  # noqa: E402

from llmfleet.autoscaler.capacity import CapacitySeed  # noqa: E402
from llmfleet.autoscaler.policy import PolicyState, PoolBounds, PoolSignals, decide  # noqa: E402
from llmfleet.autoscaler.types import MAX_UTILIZATION  # noqa: E402
from llmfleet.sim.production import make_service, simulate_service  # noqa: E402
from llmfleet.sim.workload import SyntheticSpec, synthetic  # noqa: E402


def test_an_idle_student_pool_scales_to_zero_when_the_primary_has_headroom() -> None:
    w = World(config(), replicas={"primary": 3, "small": 2}, state=running())
    w.run(lambda t: 1.0, 600)  # 1 req/s on 3 primaries: plenty of headroom
    assert w.replicas["small"] == 0
    assert all(d.pools["small"].recommended == 0 for _, _, d in w.log)


def test_a_student_is_warmed_while_a_ramp_outgrows_the_ready_primaries() -> None:
    """A ramp under the level-shift threshold: the student is asked for within an interval of the demand passing what
    the ready primaries carry, while the primary's new replica still starts (the student bridges its cold start)."""
    w = World(config(), replicas={"primary": 2, "small": 0})
    w.run(lambda t: 1.0, 300)
    assert w.replicas["small"] == 0
    # a steady ramp: +0.6 req/s per interval, under the level-shift threshold each step
    first_student = None
    for i in range(20):
        t = 315.0 + 15.0 * i
        ready = w.ready["primary"]
        d = w.tick(t, 1.0 + 0.6 * (i + 1))
        if d.pools["small"].desired > 0 and first_student is None:
            first_student = (ready, ready * 2.6 * MAX_UTILIZATION, 1.0 + 0.6 * (i + 1), d.pools["primary"].desired)
    assert first_student is not None
    ready, ready_cap, rate, primary_desired = first_student
    assert rate <= ready_cap + 2 * 0.6  # within an interval of the ramp passing the ready primaries
    assert primary_desired > ready  # a primary replica is on its way: the student bridges its cold start


def test_fallback_absorbs_a_burst_while_the_primary_cold_starts() -> None:
    # long prompts: one primary serves ~6 req/s, the 8x burst needs several more (60 s cold start)
    w = synthetic(SyntheticSpec(duration_s=420.0, rate_rps=2.0, diurnal_amplitude=0.0, bursts=[(180.0, 120.0, 8.0)],
                                tenants=4, user_tokens_mean=4000, output_tokens_mean=100, turns_mean=1.0,
                                seed=3))  # single-turn: a steady rate before the burst, no start-up ramp
    isvc = make_service(policy="slo", ttft_slo_ms=1500.0, replicas=1, model="llama-3.1-8b", max_replicas=16,
                        student="llama-3.2-1b", student_min=0, student_max_model_len=131072)
    res, hook = simulate_service(w, isvc)
    assert hook is not None
    first = hook.timeline[0]  # the service's first decision: a student warm as start-up insurance
    assert first["small"] == 1 and "from the start" in first["why"]["small"]
    before = [x["small"] for x in hook.timeline if 150.0 <= x["t"] < 175.0]
    assert before and max(before) == 0  # idle student past the start-up horizon: zero replicas, zero cost
    spike = [r for r in res.records if 180.0 <= r["arrival"] < 240.0]  # within the primary's 60 s cold start
    assert any(r["pool"] == "small" for r in spike), "the student took none of the burst"
    # GPU-seconds count every pool's replicas (per-replica figures are rounded to the millisecond)
    assert abs(res.summary["gpuSeconds"] - sum(r["gpuS"] for r in res.replicas)) < 1e-3 * len(res.replicas)
    assert any(r["pool"] == "small" and r["gpuS"] > 0 for r in res.replicas)


def test_traffic_the_router_still_degrades_does_not_keep_a_student_when_the_primary_has_headroom() -> None:
    """After a burst the router's SLO-burn window keeps degrading for a while; that traffic alone must not hold
    student replicas once the ready primaries absorb the demand."""
    from llmfleet.autoscaler.policy import PoolSignals, decide

    cfg = config()
    state = running()
    desired = []
    for i in range(12):
        t = 15.0 * i
        sigs = [PoolSignals("primary", "primary", t, 3, 3, arrival_rate=2.0, mean_input_tokens=2000.0,
                            mean_output_tokens=200.0, queue_depth=0.0, degraded_fraction=0.3),
                PoolSignals("small", "student", t, 1, 1, arrival_rate=0.6, mean_input_tokens=2000.0,
                            mean_output_tokens=200.0, queue_depth=0.0)]
        d = decide(cfg, sigs, state)
        state = d.state
        assert d.pools["small"].recommended == 0
        desired.append(d.pools["small"].desired)
    assert 0 in desired  # released by the clearly-idle rule (the signals here do not follow the decisions)


def test_counting_noise_at_a_low_rate_is_no_burst_and_keeps_no_student_warm() -> None:
    """~0.4 req/s counted per 15 s interval (Poisson counts 2..11): many intervals exceed 1.5x the smoothed level by
    chance alone. None is a burst: no student is warmed and the primary plans for no ramp."""
    counts = [3, 9, 4, 10, 5, 2, 11, 6, 3, 8, 2, 10, 7, 4, 11, 5, 2, 9, 6, 3, 10, 4, 2, 11, 7, 5, 9, 3, 6, 10]
    w = World(config(), replicas={"primary": 2, "small": 0}, state=running())
    for i, k in enumerate(counts * 2):
        w.tick(15.0 * i, k / 15.0)
    assert all(d.pools["small"].desired == 0 for _, _, d in w.log)
    assert max(d.pools["primary"].desired for _, _, d in w.log) <= 2


def test_a_real_burst_still_warms_the_student() -> None:
    """A jump far beyond counting noise and beyond the ready primaries (0.4 -> 12 req/s) is a burst: the student
    starts at once."""
    w = World(config(), replicas={"primary": 1, "small": 0})
    w.run(lambda t: 0.4 if t < 300 else 12.0, 330)
    assert w.replicas["small"] >= 1


def test_the_base_rate_after_a_burst_ends_is_no_new_burst() -> None:
    """After 20 -> 0.5 req/s the smoothed level's trend undershoots 0.5 for a while; the rate that merely stays at
    0.5 is no jump: no student is warmed again and the primary plans for no ramp."""
    w = World(config(), replicas={"primary": 1, "small": 0})
    w.run(lambda t: 20.0 if 300 <= t < 600 else 0.5, 1200)
    assert w.state.pool("primary").last_burst_at == 300.0
    assert all(d.pools["small"].recommended == 0 for t, _, d in w.log if t >= 720)



def test_a_student_pool_keeps_one_replica_for_the_down_window_and_releases_the_rest_at_break_even() -> None:
    """After a burst the student replicas beyond the first are released at rent-or-buy's break-even (idle for their
    cold start), one per cooldown: they were capacity for the size of a burst the primaries now carry. The first
    stays for the whole down-window after it last served overflow: overflow that comes back finds it warm instead
    of a cold start away (the primary's early idle release after a burst is its own). Then it goes, even if
    recommendations that never reached it (overflow the ready primaries took) came later."""
    w = World(config(), replicas={"primary": 1, "small": 0})
    w.run(lambda t: 20.0 if 300 <= t < 900 else 0.5, 1500)
    small = [(t, d.pools["small"]) for t, _, d in w.log]
    peak = max(p.desired for _, p in small)
    assert peak >= 3
    last_multi = max(t for t, p in small if p.recommended > 1)
    at_most_one = next(t for t, p in small if t > last_multi and p.desired <= 1)
    hold = max(w.cold_start, 2 * w.cfg.interval_s)
    assert at_most_one <= last_multi + hold + (peak - 1) * w.cfg.cooldown_s
    served = w.state.pool("small").last_served_at
    assert served is not None and 300 <= served < 900
    assert all(p.desired >= 1 for t, p in small if served <= t <= served + w.cfg.down_window_s)
    gone = next(t for t, p in small if t > served and p.desired == 0)
    assert gone <= served + w.cfg.down_window_s + hold + w.cfg.cooldown_s
    last_asked = max(t for t, p in small if p.recommended > 0)
    assert last_asked > served and gone < last_asked + w.cfg.down_window_s
    assert small[-1][1].desired == 0


def test_a_student_warmed_on_a_slow_rise_is_released_at_break_even_not_held_as_burst_insurance() -> None:
    """A ramp under the level-shift threshold warms a student to bridge the primaries' cold start. No burst was seen,
    so its first replica is no insurance for one coming back: once nothing asks for it, it goes at rent-or-buy's
    break-even (its cold start, at least two intervals; then the cooldown), not after the whole down-window."""
    w = World(config(), replicas={"primary": 2, "small": 0})
    w.run(lambda t: 1.0, 300)
    for i in range(20):  # +0.6 req/s per interval, under the level-shift threshold each step
        w.tick(315.0 + 15.0 * i, 1.0 + 0.6 * (i + 1))
    for i in range(40):  # then the rate stays
        w.tick(615.0 + 15.0 * i, 13.0)
    assert w.state.pool("primary").last_burst_at is None
    small = [(t, d.pools["small"]) for t, _, d in w.log]
    asked = [t for t, p in small if p.recommended > 0]
    assert asked, "the ramp warmed no student"
    gone = next(t for t, p in small if t > asked[-1] and p.desired == 0)
    hold = max(w.cold_start, 2 * w.cfg.interval_s)
    assert gone <= asked[-1] + hold + w.cfg.cooldown_s < asked[-1] + w.cfg.down_window_s
    assert not w.state.pool("small").burst_insured


def test_a_level_shift_the_primaries_absorb_renews_no_burst_insurance() -> None:
    """A burst the student serves (20 req/s on one primary) buys insurance; a later level shift the ready primaries
    absorb (0.5 -> 1.5 req/s: nothing overflows to the student) does not renew it. The student goes at its
    break-even after that shift's warm horizon, not a whole down-window after its last recommendation."""
    w = World(config(), replicas={"primary": 1, "small": 0})
    w.run(lambda t: 20.0 if 300 <= t < 420 else 1.5 if t >= 540 else 0.5, 1500)
    st = w.state.pool("small")
    assert st.last_served_at is not None and 300 <= st.last_served_at < 420  # it served the burst's overflow
    assert w.state.pool("primary").last_burst_at == 540.0
    small = [(t, d.pools["small"]) for t, _, d in w.log]
    last_asked = max(t for t, p in small if p.recommended > 0)
    gone = next(t for t, p in small if t > last_asked and p.desired == 0)
    hold = max(w.cold_start, 2 * w.cfg.interval_s)
    assert gone <= last_asked + hold + w.cfg.cooldown_s < last_asked + w.cfg.down_window_s


def test_a_level_shift_the_ready_primaries_absorb_warms_no_student() -> None:
    """On/off traffic within the ready primary's capacity (0.1 -> 1.2 req/s on one primary of ~2.6 req/s; even the
    burst forecast, twice the rate, stays within it; measured TTFT p95 200 ms against a 2 s SLO): each switch on
    is a level shift, but the primary absorbs it and the next one is of its kind. No student is warmed."""
    w = World(config(), replicas={"primary": 1, "small": 0}, state=running())
    w.run(lambda t: 1.2 if (t // 300) % 2 == 1 else 0.1, 1800, ttft=200.0)
    assert w.state.pool("primary").last_burst_at is not None  # each switch on is detected as a level shift
    assert all(d.pools["small"].recommended == 0 for _, _, d in w.log)


def test_after_a_burst_beyond_the_ready_primaries_the_next_level_shift_warms_the_student() -> None:
    """A burst the ready primaries did not absorb (20 req/s on 1 primary, TTFT p95 over the plan) says the traffic
    bursts past them. A later level shift within a down-window of it warms the student at once, even one the ready
    primary absorbs when it is detected (0.1 -> 1.2 req/s, as in the test above): bursts grow past the interval that
    detects them."""
    w = World(config(), replicas={"primary": 1, "small": 0})
    for i in range(int(1200 / 15) + 1):
        t = 15.0 * i
        rate = 20.0 if 300 <= t < 360 else 1.2 if t >= 600 else 0.1
        w.tick(t, rate, ttft=5000.0 if 300 <= t < 360 else 200.0)
    assert w.state.pool("primary").last_burst_at == 600.0
    at_shift = next(d for t, _, d in w.log if t == 600.0)
    assert at_shift.pools["small"].recommended >= 1
    assert "burst past the ready primaries" in at_shift.pools["small"].reasons[0]  # the reasons say why


def test_a_level_shift_whose_ttft_p95_stays_within_the_slo_warms_no_student() -> None:
    """On/off traffic within one primary (as above) whose TTFT p95 while on is 1.6 s: past the 1.4 s plan, within the
    2 s SLO (heavy-tailed prompts arriving together on a lightly loaded replica). The ready primary absorbed it: no
    student. The same traffic at 2.5 s, past the SLO, did go past it: the next level shift warms the student."""
    for ttft, warmed in ((1600.0, False), (2500.0, True)):
        w = World(config(), replicas={"primary": 1, "small": 0}, state=running())
        assert w.cfg.ttft_target_fraction * w.cfg.ttft_slo_ms < 1600.0 < w.cfg.ttft_slo_ms
        on = lambda t: (t // 300) % 2 == 1  # noqa: E731
        for i in range(int(1800 / 15) + 1):
            t = 15.0 * i
            w.tick(t, 1.2 if on(t) else 0.1, ttft=ttft if on(t) else 200.0)
        assert any(d.pools["small"].recommended > 0 for _, _, d in w.log) is warmed, ttft


def test_a_ttft_miss_without_waiting_past_the_budget_warms_no_student() -> None:
    """The same on/off traffic with a TTFT p95 of 2.5 s (past the 2 s SLO) while on: where the engine's queue-time p95
    is 0.1 s, within the plan's wait budget, the miss is the prompts' own prefill and the primary absorbed the
    traffic (no student); where requests waited 2 s, or the queue time is not measured, the next level shift warms it."""
    for queue_time, warmed in ((100.0, False), (2000.0, True), (None, True)):
        w = World(config(), replicas={"primary": 1, "small": 0}, state=running())
        on = lambda t: (t // 300) % 2 == 1  # noqa: E731
        for i in range(int(1800 / 15) + 1):
            t = 15.0 * i
            w.tick(t, 1.2 if on(t) else 0.1, ttft=2500.0 if on(t) else 200.0,
                   queue_time=queue_time if on(t) else None)
        assert any(d.pools["small"].recommended > 0 for _, _, d in w.log) is warmed, queue_time


# A primary at 26 req/s per replica at the policy tests' mix (2,000-token prompts, 200-token answers) and its student.
FAST_POOLS = (PoolBounds("primary", "primary", 1, 30, 1, seed=CapacitySeed(80000.0, 15000.0)),
              PoolBounds("small", "student", 0, 6, 0, seed=CapacitySeed(400000.0, 60000.0)))


def _clump_after_a_quiet_interval(quiet_prompt_tokens: float, clump_rps: float) -> PolicyState:
    """One primary at 26 req/s per replica (2,000-token prompts, 1 s TTFT SLO) serving 2 req/s for 20 minutes, then
    an interval of two requests of `quiet_prompt_tokens` each, then a clump of `clump_rps` 2,000-token requests
    (TTFT p95 100 ms throughout): the state after the clump."""
    cfg, state = config(pools=FAST_POOLS, ttft_slo_ms=1000.0), running()
    intervals = [(2.0, 2000.0)] * 80 + [(2 / 15, quiet_prompt_tokens), (clump_rps, 2000.0)]
    for i, (rate, prompt) in enumerate(intervals):
        t = 15.0 * i
        signals = [PoolSignals("primary", "primary", t, 1, 1, arrival_rate=rate, mean_input_tokens=prompt,
                               mean_output_tokens=200.0, queue_depth=0.0, ttft_p95_ms=100.0),
                   PoolSignals("small", "student", t, 0, 0, arrival_rate=0.0, queue_depth=0.0)]
        state = decide(cfg, signals, state).state
    return state


def test_a_clump_after_one_long_prompt_is_no_burst_past_the_ready_primaries() -> None:
    """Two 24k-token prompts in a quiet interval set the smoothed mix's cost to ~3x the down-window's: a clump of 5 req/s
    (burst rate 10) is past one replica's capacity at that mix (9 req/s) but not at the down-window's (26): no
    record of a burst past the ready primaries (a release is judged at the heavier mix, this evidence at the
    lighter). A clump of 14 req/s after a quiet interval of ordinary prompts (burst rate 28) is past it."""
    assert _clump_after_a_quiet_interval(24000.0, 5.0).pool("primary").burst_beyond_ready_at is None
    assert _clump_after_a_quiet_interval(2000.0, 14.0).pool("primary").burst_beyond_ready_at is not None


def test_clumps_that_went_past_the_ready_primaries_only_as_extrapolated_stop_warming_students() -> None:
    """2 req/s on one primary of 26 req/s, and every 300 s an interval of 14 req/s (a clump: its burst rate, the jump
    kept over a cold start, is 28, past the replica; nothing measured is: TTFT p95 100 ms, no queue). The first clump
    warms the student; the next finds the first went past the replica only as extrapolated, records nothing (the
    first's memory still warms the student once) and later clumps warm none. A clump whose TTFT misses with requests
    waiting (1,500 ms, queue-time 1,200 ms) is measured evidence: it warms the student, and so does the extrapolated
    clump after it (trusted again), but not the ones after that."""
    w = World(config(pools=FAST_POOLS, ttft_slo_ms=1000.0), replicas={"primary": 1, "small": 0}, state=running())
    student: dict[float, int] = {}
    records: dict[float, float | None] = {}
    for i in range(int(2400 / 15) + 1):
        t = 15.0 * i
        clump, missed = t >= 300 and t % 300 == 0, t == 1500
        d = w.tick(t, 14.0 if clump else 2.0, ttft=1500.0 if missed else 100.0, queue_time=1200.0 if missed else 20.0)
        if clump:
            student[t] = d.pools["small"].recommended
            records[t] = w.state.pool("primary").burst_beyond_ready_at
    assert {t for t, n in student.items() if n > 0} == {300.0, 600.0, 1500.0, 1800.0, 2100.0}
    assert records == {300.0: 300.0, 600.0: 300.0, 900.0: 300.0, 1200.0: 300.0, 1500.0: 1500.0, 1800.0: 1800.0,
                       2100.0: 1800.0, 2400.0: 1800.0}


def _bursts_out_of_silence(w: World, until: float, big_at: float | None = None) -> None:
    """30 s of 1.2 req/s every 240 s from 60 s on (within one primary: TTFT p95 200 ms), nothing in between (no
    arrivals, no TTFT sample); with `big_at`, 20 req/s for 60 s there instead (TTFT p95 5 s: past the plan)."""
    for i in range(int(until / 15) + 1):
        t = 15.0 * i
        big = big_at is not None and big_at <= t < big_at + 60
        on = big or (t >= 60 and (t - 60) % 240 < 30)
        w.tick(t, 20.0 if big else 1.2 if on else 0.0, ttft=5000.0 if big else 200.0 if on else None)


def test_bursts_out_of_silence_within_the_ready_primaries_warm_no_student() -> None:
    """Each burst is a level shift that falls silent within its horizon; none ever went past the ready primary, so
    silence renews nothing: no student."""
    w = World(config(), replicas={"primary": 1, "small": 0}, state=running())
    _bursts_out_of_silence(w, 1800)
    assert w.state.pool("primary").last_burst_at is not None and w.state.pool("primary").last_burst_at > 1500
    assert w.state.pool("primary").burst_beyond_ready_at is None
    assert all(d.pools["small"].recommended == 0 for _, _, d in w.log)


def test_bursts_out_of_silence_after_one_past_the_ready_primaries_keep_the_insurance() -> None:
    """After one burst past the ready primary (20 req/s), the small bursts out of silence that follow renew its
    memory each time they fall silent: the student is still asked for at a burst more than two down-windows later.
    Without the renewal the memory ends a down-window after the big burst's horizon."""
    w = World(config(), replicas={"primary": 1, "small": 0}, state=running())
    _bursts_out_of_silence(w, 1500, big_at=300.0)
    last = 60.0 + 240.0 * 5  # 1,260 s: the fifth small burst after the big one
    assert last - 360.0 > 2 * w.cfg.down_window_s
    at_last = next(d for t, _, d in w.log if t == last)
    assert at_last.pools["small"].recommended >= 1
    assert "burst past the ready primaries" in at_last.pools["small"].reasons[0]


def _prompt_heavy_burst_on_one_primary(duration_s: float, burst_at: float, burst_s: float):  # type: ignore[no-untyped-def]
    """A 10x burst of 4k-token prompts on 1 primary with 1 warm student, only the queue-delay fallback trigger."""
    from llmfleet.sim.production import Fallback

    w = synthetic(SyntheticSpec(duration_s=duration_s, rate_rps=2.0, diurnal_amplitude=0.0,
                                bursts=[(burst_at, burst_s, 10.0)], tenants=4, user_tokens_mean=4000,
                                output_tokens_mean=20, turns_mean=1.0, seed=3))
    isvc = make_service(policy="static", ttft_slo_ms=1000.0, replicas=1, model="llama-3.1-8b", student="llama-3.2-1b",
                        student_min=1, student_max_model_len=131072,
                        fallback=Fallback(queue_delay_fraction=0.5, max_degraded=0.9, burn_rate=1e9))
    return w, isvc


def test_queue_delay_fallback_sees_a_prompt_heavy_burst_inside_the_batch() -> None:
    """Prompt-heavy burst on one primary with a warm student and only the queue-delay trigger (no SLO-burn
    fallback): with chunked prefill the engine admits the burst into its running batch, so its waiting queue stays
    short while the prompts wait for prefill compute. The router's own signals (requests without a first token,
    its prefill queue) must still see the delay and send the overflow to the student before TTFTs pass the SLO."""
    res, _ = simulate_service(*_prompt_heavy_burst_on_one_primary(240.0, 60.0, 120.0))
    burst = [r for r in res.records if 60.0 <= r["arrival"] < 180.0]
    assert sum(1 for r in burst if r["pool"] == "small") > 0.3 * len(burst)
    on_time = sum(1 for r in burst if r["ttft"] is not None and r["ttft"] <= 1.0)
    assert on_time >= 0.99 * len(burst)


def test_the_simulated_fallback_learns_the_students_own_latency(monkeypatch) -> None:
    """The fallback hears the student's own end-to-end latencies in the simulator as in the router (they price its
    queue when it compares the pools), and the primary's SLO window only the primary's."""
    from llmfleet.sim import production
    from llmfleet.sim.routers import LlmfleetRouter

    made: list[LlmfleetRouter] = []

    class Spy(LlmfleetRouter):
        def attach(self, fleet) -> None:  # type: ignore[no-untyped-def]
            super().attach(fleet)
            made.append(self)

    monkeypatch.setattr(production, "LlmfleetRouter", Spy)
    res, _ = simulate_service(*_prompt_heavy_burst_on_one_primary(120.0, 30.0, 60.0))
    (router,) = made
    assert router.policy is not None
    served = sum(1 for r in res.records if r["pool"] == "small")
    assert served > 0 and len(router.policy.student_trackers["small"].samples) > 0
    assert len(router.policy.slo_tracker.samples) <= sum(1 for r in res.records if r["pool"] == "primary")


def test_the_routers_burst_wake_up_brings_the_decision_forward() -> None:
    """A burst between two decisions: the router's detector (llmfleet.router.burst) wakes the `slo` autoscaler
    within its window, which starts students then instead of at the next interval; `queue` (the KEDA/HPA-style
    baseline) keeps its interval."""
    from llmfleet.router.burst import WINDOW_S

    w = synthetic(SyntheticSpec(duration_s=260.0, rate_rps=2.0, diurnal_amplitude=0.0, bursts=[(187.0, 60.0, 8.0)],
                                tenants=4, user_tokens_mean=4000, output_tokens_mean=100, turns_mean=1.0, seed=3))
    start = w.requests[0].arrival
    isvc = make_service(policy="slo", ttft_slo_ms=1500.0, replicas=1, model="llama-3.1-8b", max_replicas=16,
                        student="llama-3.2-1b", student_min=0, student_max_model_len=131072)
    _, hook = simulate_service(w, isvc)
    assert hook is not None
    regular = [start + 15.0 * k for k in range(1, 40)]
    early = [x for x in hook.timeline if min(abs(x["t"] - r) for r in regular) > 1e-6]
    assert early and 187.0 < early[0]["t"] <= 187.0 + WINDOW_S + 1.0  # seconds after the burst, not at 195 s
    # the decision it brought forward saw the burst: a student starts for it (the primary's queueing model may
    # still fit the first seconds' rate on the one replica; the next interval plans it for the burst)
    assert early[0]["small"] > 0
    assert max(x["primary"] for x in hook.timeline if x["t"] <= 187.0 + 2 * 15.0) > 1
    before = [x["t"] for x in hook.timeline if x["t"] < 187.0]
    assert all(min(abs(t - r) for r in regular) < 1e-6 for t in before)  # no wake-up from steady traffic
    _, qhook = simulate_service(w, make_service(policy="queue", ttft_slo_ms=1500.0, replicas=1, model="llama-3.1-8b",
                                                max_replicas=16, student="llama-3.2-1b", student_min=0,
                                                student_max_model_len=131072))
    assert qhook is not None
    assert all(min(abs(x["t"] - r) for r in regular) < 1e-6 for x in qhook.timeline)


def test_a_rise_within_counting_noise_while_a_primary_starts_warms_no_student() -> None:
    """While a primary replica cold-starts, students are sized for what the ready replicas cannot absorb. A rise the
    level-shift test rejects as counting noise (75 -> 90 requests in 15 s) is no ramp: its slope kept over the cold
    start (6 req/s + 1 req/s per 15 s for 60 s = 10 req/s, past the 3 ready replicas' ~6.7) must not warm a student."""
    w = World(config(), replicas={"primary": 3, "small": 0})
    w.run(lambda t: 5.0, 600)
    assert w.replicas == {"primary": 3, "small": 0}
    w.replicas["primary"] = 4  # a fourth replica asked for by an earlier decision, still starting
    w.starting.append((700.0, "primary"))
    d = w.tick(615.0, 6.0)
    assert w.state.pool("primary").last_burst_at is None  # not a level shift
    assert d.pools["small"].recommended == 0, d.pools["small"].reasons


def test_a_level_shift_while_a_primary_starts_still_sizes_students_for_its_slope() -> None:
    """The same cold start with a detected burst (5 -> 12 req/s): the students are sized for the jump's slope kept over
    the cold start, beyond what the ready replicas absorb."""
    w = World(config(), replicas={"primary": 3, "small": 0})
    w.run(lambda t: 5.0, 600)
    w.replicas["primary"] = 4
    w.starting.append((700.0, "primary"))
    d = w.tick(615.0, 12.0)
    assert w.state.pool("primary").last_burst_at == 615.0
    assert d.pools["small"].recommended >= 1


def test_a_new_service_warms_the_first_student_as_insurance_for_the_idle_horizon() -> None:
    """A service's first decision knows nothing of how its traffic bursts (and the router's detector has no baseline
    for a minute): the first student is warmed at once and held for the idle horizon (two primary cold starts), then
    released at break-even when nothing asked for it. Meanwhile it stands in for no primary: the primaries are sized
    as in a service without students."""
    w = World(config(), replicas={"primary": 2, "small": 0})
    w.run(lambda t: 1.0, 600)
    small = [(t, d.pools["small"]) for t, _, d in w.log]
    assert small[0][1].desired == 1 and "from the start" in small[0][1].reasons[0]
    horizon = max(2 * w.cold_start, 4 * w.cfg.interval_s)
    assert all(p.desired == 1 for t, p in small if t <= horizon)
    gone = next(t for t, p in small if t > horizon and p.desired == 0)
    assert gone <= horizon + max(w.cold_start, 2 * w.cfg.interval_s) + w.cfg.cooldown_s
    assert all(p.desired == 0 for t, p in small if t >= gone)
    alone = World(primary_only(), replicas={"primary": 2, "small": 0})
    alone.run(lambda t: 1.0, 600)
    assert [d.pools["primary"].desired for _, _, d in w.log] == [d.pools["primary"].desired for _, _, d in alone.log]
    assert not any("stand in" in " ".join(d.pools["primary"].reasons) for _, _, d in w.log)


def test_the_start_up_student_that_serves_a_burst_stays_as_burst_insurance() -> None:
    """A burst within the start-up horizon that the starting primary does not absorb reaches the warm student; from
    then on it is insurance bought in a burst: kept for a down-window after it last served overflow."""
    w = World(config(), replicas={"primary": 1, "small": 0})
    w.run(lambda t: 20.0 if 60 <= t < 90 else 0.5, 900)
    served = w.state.pool("small").last_served_at
    assert served is not None and 60 <= served < 90
    small = [(t, d.pools["small"]) for t, _, d in w.log]
    assert all(p.desired >= 1 for t, p in small if t <= served + w.cfg.down_window_s)
    assert small[-1][1].desired == 0


def test_only_a_services_first_decision_warms_a_start_up_student() -> None:
    """The start-up insurance survives a restart (the annotation keeps its end), and a restarted controller, whose
    state is restored, warms none of its own; nor do the queue and static policies."""
    w = World(config(), replicas={"primary": 2, "small": 0})
    w.tick(0.0, 1.0)
    until = w.state.pool("small").startup_until
    assert until is not None and until > 0
    restored = PolicyState.from_json(w.state.to_json())
    assert restored.pool("small").startup_until == until
    w.state = restored
    assert w.tick(15.0, 1.0).pools["small"].desired == 1  # still insured after the restart
    later = World(config(), replicas={"primary": 2, "small": 0}, state=running())
    assert later.tick(0.0, 1.0).pools["small"].desired == 0
    for policy in ("queue", "static"):
        assert World(config(policy), replicas={"primary": 2, "small": 0}).tick(0.0, 1.0).pools["small"].desired == 0


def test_the_start_up_student_takes_a_burst_in_the_first_minute() -> None:
    """Simulator: a 4x burst 40 s after a service starts, before the router's burst detector has a baseline and before
    a student started on the first evidence could be ready. The start-up student is warm and takes its overflow:
    (almost) every request of the burst meets the SLO, where a service without it missed most of them (349 of 436)."""
    w = synthetic(SyntheticSpec(duration_s=240.0, rate_rps=2.0, diurnal_amplitude=0.0, bursts=[(40.0, 30.0, 8.0)],
                                tenants=4, user_tokens_mean=4000, output_tokens_mean=100, turns_mean=1.0, seed=3))
    isvc = make_service(policy="slo", ttft_slo_ms=1500.0, replicas=1, model="llama-3.1-8b", max_replicas=16,
                        student="llama-3.2-1b", student_min=0, student_max_model_len=131072)
    res, hook = simulate_service(w, isvc)
    assert hook is not None and hook.timeline[0]["small"] == 1
    burst = [r for r in res.records if 40.0 <= r["arrival"] < 70.0]
    missed = [r for r in burst if r["ttft"] is None or r["ttft"] > 1.5]
    assert len(burst) > 300 and len(missed) <= 0.01 * len(burst), len(missed)
    assert sum(r["pool"] == "small" for r in burst) > len(burst) / 2
