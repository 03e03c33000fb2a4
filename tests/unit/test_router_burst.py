"""The router's arrival-burst detector (llmfleet.router.burst) and what the autoscaler does with its wake-up."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from llmfleet.autoscaler.capacity import Holt
from llmfleet.autoscaler.controller import Burst, with_burst
from llmfleet.autoscaler.policy import PoolSignals
from llmfleet.router.burst import (
    BURST_RATIO,
    FALSE_ALARMS_PER_HOUR,
    WINDOW_S,
    ArrivalBurst,
    follow_up_after,
    follow_up_s,
    poisson_sf,
)


@pytest.mark.parametrize("k,lam,expected", [
    (0, 3.0, 1.0), (1, 0.5, 1 - math.exp(-0.5)), (2, 1.0, 1 - 2 / math.e), (5, 0.0, 0.0),
    (3, 10.0, 1 - math.exp(-10) * (1 + 10 + 50)),  # below the mode: the complement
    (7, 0.9, 4.3400765e-05), (28, 12.0, 5.5836417e-05),  # above it: the upper tail (scipy.stats.poisson.sf(k-1))
])
def test_poisson_tail(k: int, lam: float, expected: float) -> None:
    assert poisson_sf(k, lam) == pytest.approx(expected, rel=1e-6, abs=1e-15)


def poisson_arrivals(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    out, t = [], start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return out
        out.append(t)


@pytest.mark.parametrize("rate", [0.3, 4.0, 40.0])
def test_steady_poisson_traffic_rarely_wakes_the_autoscaler(rate: float) -> None:
    """At any rate, steady arrivals open episodes at about FALSE_ALARMS_PER_HOUR (a test per second at a Poisson
    tail of that budget; the baseline's own noise adds some), not every few minutes as a fixed 3-sigma rule would at small
    counts (docs/autoscaler.md, "Burst wake-up", has the measured rates)."""
    hours = 6.0 if rate < 10 else 2.0
    det = ArrivalBurst()
    for t in poisson_arrivals(random.Random(7), rate, 0.0, hours * 3600.0):
        det.observe(t)
    assert det.episodes <= 4 * FALSE_ALARMS_PER_HOUR * hours + 1


@pytest.mark.parametrize("before,factor", [(0.5, 10.0), (4.0, 3.0), (40.0, 2.0)])
def test_a_step_opens_one_episode_within_seconds(before: float, factor: float) -> None:
    rng = random.Random(3)
    det = ArrivalBurst(rearm_s=15.0)
    fired = [t for t in poisson_arrivals(rng, before, 0.0, 300.0) + poisson_arrivals(rng, before * factor, 300.0, 312.0)
             if det.observe(t)]
    assert len(fired) == 1  # one per rearm period: the decision it brings forward has seen the burst
    assert 300.0 < fired[0] <= 300.0 + WINDOW_S + 1.0
    assert det.rate >= BURST_RATIO * before


@pytest.mark.parametrize("measured_s,measured_rate,burst_rate,expected", [
    (13.0, 15.0, 25.0, float(WINDOW_S)),  # 13 s mostly before the burst: diluted past the burst ratio
    (13.0, 20.0, 25.0, None),  # a ramp the window holds at more than 1 / BURST_RATIO of the detector's rate
    (WINDOW_S, 15.0, 45.0, None),  # a wake-up soon after a decision measured the burst's own seconds
    (None, 15.0, 45.0, None), (13.0, None, 45.0, None),  # nothing measured: nothing to compare
])
def test_a_woken_decision_that_measured_a_diluted_burst_is_followed_one_window_later(
        measured_s: float | None, measured_rate: float | None, burst_rate: float, expected: float | None) -> None:
    assert follow_up_s(measured_s, measured_rate, burst_rate) == expected


def test_the_follow_up_reads_the_primarys_rates() -> None:
    """The woken decision's demand is the primary's arrival rate (a student's own rate is only its overflow)."""
    student = PoolSignals("small", "student", 13.0, 1, 1, arrival_rate=1.0, window_s=13.0)
    primary = PoolSignals("primary", "primary", 13.0, 2, 2, arrival_rate=15.0, window_s=13.0)
    assert follow_up_after([student, primary], 25.0) == float(WINDOW_S)
    assert follow_up_after([student, replace(primary, arrival_rate=20.0)], 25.0) is None
    assert follow_up_after([student], 25.0) is None


def test_no_episode_before_a_baseline_and_one_request_after_silence_is_not_a_burst() -> None:
    det = ArrivalBurst()
    assert not any(det.observe(t / 100.0) for t in range(2000))  # 20 s at 100 req/s: no baseline to compare with
    det = ArrivalBurst()
    for t in range(70):
        det.observe(float(t))  # 1 req/s for 70 s, then a silent minute
    assert not det.observe(140.0)
    assert not det.observe(141.5)  # one request in the window
    assert not det.observe(142.0)  # two
    for t in (142.1, 142.2, 142.3):
        det.observe(t)  # (the test runs once a second, over the seconds that ended)
    assert det.observe(143.0)  # five in three seconds after a silent minute


def test_bad_detector_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 second"):
        ArrivalBurst(window_s=0)


def test_a_short_sample_moves_the_smoothed_rate_by_its_share_and_reads_no_trend_from_noise() -> None:
    full, short = Holt(), Holt()
    for t in range(0, 150, 15):
        full.update(float(t), 10.0)
        short.update(float(t), 10.0)
    full.update(150.0, 40.0)  # a whole interval at 4x
    short.update(136.0, 40.0, weight=1 / 15)  # one second of it, a second after the last sample
    assert full.level is not None and short.level is not None
    assert full.level > 20.0
    assert 10.0 < short.level < 12.5  # about 1/15 of the way
    assert abs(short.trend) < 1.0  # not (40 - 10) / 1 s


def signals(window_s: float | None, rate: float = 4.0) -> list[PoolSignals]:
    return [PoolSignals("primary", "primary", 100.0, 2, 2, arrival_rate=rate, window_s=window_s),
            PoolSignals("small", "student", 100.0, 0, 0, arrival_rate=0.0, window_s=window_s)]


def test_the_routers_burst_rate_replaces_only_a_fixed_window_rate() -> None:
    burst = Burst(rate=30.0, window_s=3.0)
    prom = with_burst(signals(None), burst)  # Prometheus: a one-minute rate dilutes a burst seconds old
    assert (prom[0].arrival_rate, prom[0].window_s) == (30.0, 3.0)
    assert prom[1].arrival_rate == 0.0  # a student's own traffic is its own
    scraped = with_burst(signals(4.0), burst)  # rates since the last decision hold the burst's seconds already
    assert scraped[0].arrival_rate == 4.0
    assert with_burst(signals(None, rate=50.0), burst)[0].arrival_rate == 50.0  # never lowered
    assert with_burst(signals(None), None) == signals(None)


@pytest.mark.parametrize("policy,follow_up,steps_expected", [("slo", False, 2), ("slo", True, 3), ("queue", False, 1)])
async def test_the_local_loop_steps_on_a_burst_for_slo_only(monkeypatch: pytest.MonkeyPatch, policy: str,
                                                            follow_up: bool, steps_expected: int) -> None:
    """The router's burst answer makes the local autoscaler loop step again once the detection window has passed
    since its last step, with the burst (for Prometheus' rates), and once more after the follow-up the woken step
    asks for (a diluted burst); `queue` waits out its interval."""
    import asyncio

    from llmfleet.autoscaler import local
    from llmfleet.autoscaler.controller import Wake
    from llmfleet.sim.production import make_service

    steps: list[tuple[float, Burst | None]] = []
    stop = asyncio.Event()

    async def step(isvc: object, actuator: object, source: object, state: object, now: float, **kw: object) -> object:
        steps.append((now, kw.get("burst")))  # type: ignore[arg-type]

        class Decision:
            pools: dict[str, object] = {}
            state = None
        # the woken step measured the burst diluted: one more step a (patched) detection window later
        follow = 0.2 if kw.get("burst") is not None and follow_up else None
        return type("Result", (), {"decision": Decision, "follow_up_s": follow})()

    class BurstOnce:
        def __init__(self, url: str | None) -> None:
            self.calls = 0

        async def wait(self, stop_: asyncio.Event, timeout_s: float) -> Wake:
            self.calls += 1
            if self.calls == 1:
                return Wake(burst=Burst(30.0, 3.0))
            await asyncio.sleep(min(timeout_s, 0.5))
            if self.calls >= 3:
                stop.set()
            return Wake()

    monkeypatch.setattr(local, "autoscale_step", step)
    monkeypatch.setattr(local, "Wakeup", BurstOnce)
    monkeypatch.setattr(local, "BURST_WINDOW_S", 0.2)
    isvc = make_service(policy=policy, student="llama-3.2-1b")  # intervalSeconds 15
    await asyncio.wait_for(local.run_local(isvc, object(), lambda pool: [], stop, router_url="http://router"), 10)  # type: ignore[arg-type]
    assert len(steps) == steps_expected
    if steps_expected >= 2:
        assert 0.2 <= steps[1][0] - steps[0][0] < 5.0 and steps[1][1] == Burst(30.0, 3.0)
    if steps_expected == 3:
        assert 0.2 <= steps[2][0] - steps[1][0] < 0.45 and steps[2][1] is None  # not the interval (15 s)


def test_a_step_long_after_the_last_decision_is_planned_within_two_detection_windows() -> None:
    """Simulator with the production router and policy: the regular decisions fall 13 s before a 10x step (decision
    phase 8 s). The wake-up's decision measures those 13 s and one of the step, which plans nothing; its follow-up one
    detection window later measures the step's own seconds and buys primaries and students at once, instead of the
    next regular decision an interval later."""
    from llmfleet.sim.production import make_service, simulate_service
    from llmfleet.sim.workload import SyntheticSpec, synthetic

    w = synthetic(SyntheticSpec(duration_s=300.0, rate_rps=12.0, diurnal_amplitude=0.0, bursts=[(200.0, 60.0, 10.0)],
                                tenants=4, turns_mean=1.0, seed=3))  # single-turn: the step is a step
    isvc = make_service(policy="slo", ttft_slo_ms=1500.0, replicas=2, model="llama-3.1-8b", max_replicas=16,
                        student="llama-3.2-1b", student_min=0, student_max_model_len=131072)
    _, hook = simulate_service(w, isvc, decision_phase_s=8.0)
    assert hook is not None
    around = [x for x in hook.timeline if 185.0 <= x["t"] <= 200.0 + 3 * WINDOW_S]
    regular, woken, *after = around
    assert 185.0 <= regular["t"] < 190.0 and 200.0 < woken["t"] < 200.0 + WINDOW_S
    assert woken["primary"] == regular["primary"] and woken["small"] == 0  # diluted: the step not seen
    assert after, "no decision over the step's own seconds before the next regular one"
    assert after[0]["t"] == pytest.approx(woken["t"] + WINDOW_S)
    assert after[0]["primary"] > woken["primary"] and after[0]["small"] > 0
