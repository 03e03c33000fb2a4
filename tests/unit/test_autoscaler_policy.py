"""Table-driven tests of the pure scaling policy (burst, diurnal ramp, noisy, stale, cold start)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from llmfleet.api import parse_resource
from llmfleet.autoscaler.capacity import (
    CapacitySeed,
    RequestCost,
    erlang_c,
    prefill_time_scv,
    prompt_length_moments,
    replicas_for_ttft,
    wait_p95_seconds,
)
from llmfleet.autoscaler.policy import (
    PolicyConfig,
    PolicyState,
    PoolBounds,
    PoolSignals,
    ScalingDecision,
    decide,
)
from llmfleet.autoscaler.types import MAX_UTILIZATION

SEED = CapacitySeed(prefill_tokens_per_s=8000.0, decode_tokens_per_s=1500.0)
MEAN_IN, MEAN_OUT = 2000.0, 200.0
# One replica at this mix: 2000/8000 + 200/1500 = 0.383 s per request -> ~2.6 req/s.
MU = 1.0 / (MEAN_IN / SEED.prefill_tokens_per_s + MEAN_OUT / SEED.decode_tokens_per_s)


def config(policy: str = "slo", **kw: object) -> PolicyConfig:
    pools = (
        PoolBounds("primary", "primary", 1, 30, 2, seed=SEED),
        PoolBounds("small", "student", 0, 6, 0, seed=CapacitySeed(40000.0, 6000.0)),
    )
    values: dict[str, object] = dict(policy=policy, pools=pools, ttft_slo_ms=2000.0, interval_s=15.0, cold_start_s=60.0)
    values.update(kw)
    return PolicyConfig(**values)  # type: ignore[arg-type]


def running() -> PolicyState:
    """The state of a service past its first decision (as a restarted controller reads it from its annotation):
    policy.decide warms a start-up student only at a service's first decision, which tests of later behaviour skip."""
    return PolicyState.from_json('{"primary": {}, "small": {}}')


@dataclass
class World:
    """A minimal fleet: desired replicas become ready `cold_start` seconds after they are asked for."""

    cfg: PolicyConfig
    cold_start: float = 60.0
    replicas: dict[str, int] = field(default_factory=lambda: {"primary": 2, "small": 0})
    starting: list[tuple[float, str]] = field(default_factory=list)
    ready: dict[str, int] = field(default_factory=dict)
    state: PolicyState = field(default_factory=PolicyState)
    log: list[tuple[float, float, ScalingDecision]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ready = dict(self.replicas)

    def tick(self, t: float, rate: float, *, stale: bool = False, queue: float = 0.0,
             ttft: float | None = None, missing: bool = False, student_ttft: float | None = None,
             queue_time: float | None = None) -> ScalingDecision:
        for at, pool in list(self.starting):
            if at <= t:
                self.ready[pool] += 1
                self.starting.remove((at, pool))
        sigs = [
            PoolSignals("primary", "primary", t, self.replicas["primary"], self.ready["primary"],
                        arrival_rate=None if missing else rate, mean_input_tokens=MEAN_IN,
                        mean_output_tokens=MEAN_OUT, queue_depth=queue, ttft_p95_ms=ttft,
                        queue_time_p95_ms=queue_time, stale=stale),
            PoolSignals("small", "student", t, self.replicas["small"], self.ready["small"],
                        arrival_rate=None if missing else self.overflow(rate), queue_depth=0.0,
                        ttft_p95_ms=student_ttft, stale=stale),
        ]
        d = decide(self.cfg, sigs, self.state)
        self.state = d.state
        for name, n in d.desired().items():
            cur = self.replicas[name]
            if n > cur:
                self.starting += [(t + self.cold_start, name)] * (n - cur)
            elif n < cur:
                drop = cur - n
                # remove starting replicas first, then ready ones
                pending = [s for s in self.starting if s[1] == name]
                for s in pending[:drop]:
                    self.starting.remove(s)
                    drop -= 1
                self.ready[name] -= drop
            self.replicas[name] = n
        self.log.append((t, rate, d))
        return d

    def overflow(self, rate: float) -> float:
        """What the router's fallback sends ready students: the demand beyond the ready primaries' capacity."""
        if self.ready.get("small", 0) <= 0:
            return 0.0
        return max(rate - self.ready["primary"] * MU * MAX_UTILIZATION, 0.0)

    def run(self, rate_at: Callable[[float], float], until: float, **kw: object) -> None:
        t = 0.0
        while t <= until:
            self.tick(t, rate_at(t), **kw)  # type: ignore[arg-type]
            t += self.cfg.interval_s

    def actions(self, pool: str = "primary", after: float = 0.0) -> int:
        return sum(1 for t, _, d in self.log if t >= after and d.pools[pool].action != "hold")

    def replicas_at(self, t: float, pool: str = "primary") -> int:
        return next(d.pools[pool].desired for tt, _, d in reversed(self.log) if tt <= t)


def needed(rate: float) -> int:
    """Replicas to hold `rate` at the policy's utilization bound (MAX_UTILIZATION): a lower bound it must reach."""
    return math.ceil(rate / (MU * MAX_UTILIZATION))


def _sig(pool: str, t: float, replicas: int, ready: int, rate: float, **kw: object) -> PoolSignals:
    role = "primary" if pool == "primary" else "student"
    return PoolSignals(pool, role, t, replicas, ready, arrival_rate=rate, mean_input_tokens=MEAN_IN,  # type: ignore[arg-type]
                       mean_output_tokens=MEAN_OUT, **kw)  # type: ignore[arg-type]


def primary_only(**kw: object) -> PolicyConfig:
    """`config` without the student pool: no fallback capacity to stand in for a released primary."""
    cfg = config(**kw)
    return replace(cfg, pools=cfg.pools[:1])


# --- queueing math ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "servers,offered,expected",
    [(1, 0.5, 0.5), (2, 1.0, 1 / 3), (1, 0.0, 0.0), (3, 3.5, 1.0), (10, 5.0, 0.0361)],
)
def test_erlang_c_known_values(servers: int, offered: float, expected: float) -> None:
    assert erlang_c(servers, offered) == pytest.approx(expected, abs=2e-3)


PREFILL_S, DECODE_S = MEAN_IN / SEED.prefill_tokens_per_s, MEAN_OUT / SEED.decode_tokens_per_s
COST = RequestCost(PREFILL_S, DECODE_S)  # the decodes' whole time competes with the prefill; exponential prefills


def test_wait_p95_decreases_with_replicas_and_is_inf_when_overloaded() -> None:
    waits = [wait_p95_seconds(n, 10.0, COST) for n in range(1, 12)]
    assert math.isinf(waits[0]) and math.isinf(waits[2])
    finite = [w for w in waits if math.isfinite(w)]
    assert finite == sorted(finite, reverse=True) and finite[-1] == 0.0
    n = replicas_for_ttft(10.0, COST, 0.3, MAX_UTILIZATION, 30)
    assert wait_p95_seconds(n, 10.0, COST) <= 0.3 < wait_p95_seconds(n - 1, 10.0, COST)


def test_the_wait_is_for_prefills_and_decodes_only_slow_them() -> None:
    """A request waits for the prefills ahead of it, not for whole requests (continuous batching adds it to the next
    step beside the running decodes): the p95 wait is M/M/c over the prefill work, the decodes' share of each
    replica slowing that server. Whole requests as the service (the model it replaces) would wait 1.65x longer here."""
    rate, n = 4.0, 2
    share = rate * DECODE_S / n
    mu = (1 - share) / PREFILL_S
    c = erlang_c(n, rate / mu)
    assert wait_p95_seconds(n, rate, COST) == pytest.approx(math.log(c / 0.05) / (n * mu - rate))
    # without decodes the prefill server is faster; whole requests as the service would wait longer
    assert wait_p95_seconds(n, rate, RequestCost(PREFILL_S, 0.0)) < wait_p95_seconds(n, rate, COST)
    whole = 1 / (PREFILL_S + DECODE_S)
    c_whole = erlang_c(n, rate / whole)
    assert math.log(c_whole / 0.05) / (n * whole - rate) > 1.6 * wait_p95_seconds(n, rate, COST)
    # the decodes' share alone bounds the replicas where prefills would never queue
    assert replicas_for_ttft(4.0, RequestCost(0.001, 0.5), 10.0, MAX_UTILIZATION, 30) == math.ceil(4.0 * 0.501 / MAX_UTILIZATION)


def test_only_the_decodes_compute_slows_the_prefill_server() -> None:
    """Memory-bound decode steps leave compute idle that a batched prefill runs on: with a quarter of the decode time
    spent on FLOPs, the prefill server is slowed by that quarter (the same M/M/c formula at that share), so the wait
    is shorter than with the whole decode time; utilization still counts the whole decode (the replicas' floor)."""
    rate, n = 4.0, 2
    lean = RequestCost(PREFILL_S, DECODE_S, decode_compute_s=DECODE_S / 4)
    mu = (1 - rate * DECODE_S / 4 / n) / PREFILL_S
    c = erlang_c(n, rate / mu)
    assert wait_p95_seconds(n, rate, lean) == pytest.approx(math.log(c / 0.05) / (n * mu - rate))
    assert wait_p95_seconds(n, rate, lean) < wait_p95_seconds(n, rate, COST)
    assert replicas_for_ttft(4.0, RequestCost(0.001, 0.5, 0.01), 10.0, MAX_UTILIZATION, 30) == math.ceil(4.0 * 0.501)


def test_the_spread_of_prefill_times_scales_the_wait_by_allen_cunneen() -> None:
    """G/G/c by Allen-Cunneen: M/M/c's wait times (1 + SCV) / 2 for Poisson arrivals. Equal prefills wait half as
    long as exponential ones, a heavy tail (SCV 4) 2.5x as long; replicas_for_ttft plans more replicas for it."""
    rate, n = 4.0, 2
    base = wait_p95_seconds(n, rate, COST)
    assert base > 0
    assert wait_p95_seconds(n, rate, replace(COST, prefill_scv=0.0)) == pytest.approx(base / 2)
    assert wait_p95_seconds(n, rate, replace(COST, prefill_scv=4.0)) == pytest.approx(2.5 * base)
    budget = base * 1.2
    assert (replicas_for_ttft(rate, replace(COST, prefill_scv=4.0), budget, MAX_UTILIZATION, 30)
            > replicas_for_ttft(rate, COST, budget, MAX_UTILIZATION, 30)
            >= replicas_for_ttft(rate, replace(COST, prefill_scv=0.0), budget, MAX_UTILIZATION, 30))


def _moments(lengths: list[float]) -> tuple[float, float, float, float]:
    m1, m2, m3, m4 = (sum(x ** k for x in lengths) / len(lengths) for k in (1, 2, 3, 4))
    return m1, m2, m3, m4


def test_prefill_time_scv_from_prompt_length_moments() -> None:
    """Equal prompts: 0. Exponential prompt lengths (E[L^k] = k! m^k) with no attention term: 1, M/M/c's own case.
    The attention term makes long prompts' prefills costlier than their length, so the same lengths spread their
    prefill times more; cached tokens still attend, so a hit rate adds to it. Not measured: 1 (M/M/c)."""
    assert prefill_time_scv(_moments([1000.0] * 5), 1e-4) == pytest.approx(0.0, abs=1e-12)
    m = 1000.0
    exponential = (m, 2 * m ** 2, 6 * m ** 3, 24 * m ** 4)
    assert prefill_time_scv(exponential, 0.0) == pytest.approx(1.0)
    mixed = _moments([500.0, 1000.0, 2000.0, 30000.0])
    no_attention = prefill_time_scv(mixed, 0.0)
    with_attention = prefill_time_scv(mixed, 2e-5)
    assert with_attention > no_attention > 0
    # exactly the SCV of t = L + r L^2 over the prompts
    times = [x + 2e-5 * x * x for x in (500.0, 1000.0, 2000.0, 30000.0)]
    mean = sum(times) / 4
    assert with_attention == pytest.approx(sum((t - mean) ** 2 for t in times) / 4 / mean ** 2)
    assert prefill_time_scv(mixed, 2e-5, hit_rate=0.5) > with_attention
    assert prefill_time_scv(None, 2e-5) == 1.0
    assert prompt_length_moments([500.0, 1000.0, 2000.0, 30000.0]) == pytest.approx(mixed)
    assert prompt_length_moments([]) is None


def test_the_policy_plans_more_replicas_for_a_heavy_tailed_prompt_mix_of_the_same_mean() -> None:
    """The same arrival rate and mean prompt: equal prompts versus a tenth of them 31x longer (the router's power
    sums, PoolSignals.input_tokens_moments). The long ones hold a prefill server far longer than the mean says, so
    the queue ahead of a request is longer and the plan larger; its predicted TTFT at its own plan stays in budget."""
    cfg = config()
    equal = [MEAN_IN] * 10
    tailed = [500.0] * 9 + [15500.0]
    assert sum(tailed) / 10 == MEAN_IN

    def plan(lengths: list[float]) -> tuple[int, float]:
        m1, m2, m3, m4 = _moments(lengths)
        state = PolicyState()
        d = None
        for t in (0.0, 15.0, 30.0):  # the smoothed spread settles on the measured one
            sig = PoolSignals("primary", "primary", t, 2, 2, arrival_rate=5.0, mean_input_tokens=m1,
                              mean_output_tokens=MEAN_OUT, input_tokens_moments=(m2, m3, m4), queue_depth=0.0)
            d = decide(cfg, [sig, PoolSignals("small", "student", t, 0, 0, arrival_rate=0.0)], state)
            state = d.state
        assert d is not None and d.pools["primary"].predicted_ttft_ms is not None
        return d.pools["primary"].recommended, d.pools["primary"].predicted_ttft_ms

    n_equal, ttft_equal = plan(equal)
    n_tailed, ttft_tailed = plan(tailed)
    assert n_tailed > n_equal
    assert ttft_tailed <= cfg.ttft_target_fraction * cfg.ttft_slo_ms


def test_the_ttft_budget_alone_bounds_utilization() -> None:
    """No separate utilization cap below 1: a chat-like mix (short prefills, decode most of a request) at 90 %
    utilization whose p95 wait fits the budget is one replica, as one simulated replica serves it (a shape whose
    knee is at 16-17 req/s met a 1 s SLO at 16); Erlang C's wait itself diverges as utilization nears 1."""
    cost = RequestCost(0.004, 0.056)  # ~16.7 req/s per replica
    rate = 0.9 / (cost.prefill_s + cost.decode_s)
    assert wait_p95_seconds(1, rate, cost) <= 0.68
    assert replicas_for_ttft(rate, cost, 0.68, MAX_UTILIZATION, 30) == 1
    assert math.isinf(wait_p95_seconds(1, 1.0 / (cost.prefill_s + cost.decode_s), cost))


# --- scenarios -------------------------------------------------------------------------------------------------

def burst(t: float) -> float:
    return 20.0 if 300 <= t < 900 else 2.0


def diurnal(t: float) -> float:
    return 6.0 + 5.0 * math.sin(2 * math.pi * t / 3600.0)


def test_burst_scales_up_at_once_uses_students_then_scales_down_slowly() -> None:
    w = World(config(idle_fraction=0.0))  # the HPA behaviour alone (the idle fast path is tested below)
    w.run(burst, 2100)
    first = next(d for t, _, d in w.log if t == 300)
    assert first.pools["primary"].action == "up" and first.pools["primary"].desired == 6  # +maxScaleUpStep
    # students cover the burst while the primary is cold-starting
    assert first.pools["small"].desired >= 1
    assert w.replicas_at(345) >= needed(20.0)
    # never drops below what the burst needs while it lasts
    assert all(d.pools["primary"].desired >= needed(20.0) for t, _, d in w.log if 345 <= t < 900)
    # scale-down starts only after the down-window and goes one replica per cooldown
    downs = [(t, d.pools["primary"]) for t, _, d in w.log if t >= 900 and d.pools["primary"].action == "down"]
    assert downs and downs[0][0] >= 900 + 300 - 60
    assert all(p.current - p.desired == 1 for _, p in downs)
    assert all(b - a >= 60 for (a, _), (b, _) in zip(downs, downs[1:], strict=False))
    # students shrink back once the primary has caught up
    assert w.replicas_at(2100, "small") < first.pools["small"].desired


def test_diurnal_ramp_tracks_demand_without_flapping() -> None:
    w = World(config(down_window_s=300.0))
    w.run(diurnal, 7200)
    for t, rate, d in w.log:
        if t >= 120:  # after warm-up, the primary never falls below the utilization bound of the demand
            assert w.replicas["primary"] >= 1
            assert d.pools["primary"].desired >= needed(rate) - 1, (t, rate, d.pools["primary"])
    peak = max(d.pools["primary"].desired for _, _, d in w.log)
    trough = min(d.pools["primary"].desired for t, _, d in w.log if t > 2700)
    assert peak >= needed(11.0) and trough <= needed(2.0) + 2
    # monotone phases: the number of direction changes is small (one per half period, not per tick)
    dirs = [d.pools["primary"].action for _, _, d in w.log if d.pools["primary"].action != "hold"]
    flips = sum(1 for a, b in zip(dirs, dirs[1:], strict=False) if a != b)
    assert flips <= 6


def test_noisy_metrics_do_not_flap() -> None:
    rng = random.Random(7)
    w = World(config())
    w.run(lambda t: 8.0 * (1 + rng.uniform(-0.3, 0.3)), 3600)
    assert w.actions(after=600) <= 2
    assert w.replicas["primary"] >= needed(8.0)
    # at full capacity, a gap within the smoothed rate's noise warms no student (policy._within_noise)
    assert w.actions("small", after=900) == 0 and w.replicas["small"] == 0


@pytest.mark.parametrize("kind", ["stale", "missing"])
def test_stale_or_missing_metrics_never_scale_down(kind: str) -> None:
    w = World(config(down_window_s=60.0, cooldown_s=0.0), replicas={"primary": 10, "small": 3})
    w.run(lambda t: 0.1, 1800, **{kind: True})
    assert w.replicas == {"primary": 10, "small": 3}
    assert all("hold" in " ".join(d.pools["primary"].reasons) for _, _, d in w.log)
    # once fresh data arrives, scale-down resumes only after a full down-window of fresh history
    t0 = 1815.0
    for i in range(12):
        w.tick(t0 + 15 * i, 0.1)
    downs = [t for t, _, d in w.log if d.pools["primary"].action == "down"]
    assert downs and downs[0] >= t0 + 60


def test_cold_start_is_measured_and_used_as_forecast_horizon() -> None:
    w = World(config(cold_start_s=None), cold_start=150.0)
    w.run(burst, 900)
    measured = w.state.pools["primary"].cold_start_s
    assert measured is not None and 140 <= measured <= 180
    # the next state carries it across a restart through the annotation JSON
    restored = PolicyState.from_json(w.state.to_json())
    assert restored.pools["primary"].cold_start_s == pytest.approx(measured, rel=1e-6)


def test_ramp_forecast_scales_ahead_of_demand() -> None:
    """With a steady ramp, the slo policy provisions for the rate one cold start ahead."""
    w = World(config())
    w.run(lambda t: 1.0 + t / 60.0, 900)  # +1 req/s per minute
    t, rate, d = w.log[-1]
    assert d.pools["primary"].recommended >= needed(rate + 1.0)


@pytest.mark.parametrize("violated_intervals,expect_up", [(1, False), (2, True)])
def test_slo_violation_feedback_adds_replica_keeps_capacity_estimate(violated_intervals: int, expect_up: bool) -> None:
    """Only a violation that persists over two consecutive intervals is a capacity error (p95 of one is noisy); it
    adds a replica but leaves the capacity estimate alone (that is learned from saturation only)."""
    w = World(config())
    for i in range(10):
        w.tick(15.0 * i, 2.0)
    before = w.replicas["primary"]
    for k in range(violated_intervals):
        d = w.tick(150.0 + 15.0 * k, 2.0, ttft=5000.0)
    assert (d.pools["primary"].desired == before + 1) == expect_up
    assert w.state.pools["primary"].efficiency == 1.0


@pytest.mark.parametrize("queue_time,expect_up", [(None, True), (3500.0, True), (200.0, False)])
def test_a_ttft_miss_that_queueing_did_not_make_adds_no_replica(queue_time: float | None, expect_up: bool) -> None:
    """A TTFT p95 of 5 s against a 2 s SLO, twice in a row: with the engines' queue-time p95 at 3.5 s queueing made
    the miss (5 - 3.5 s is within the SLO) and a replica is added, as when the queue time is not measured; at 0.2 s
    the miss is the prompts' own prefill (4.8 s without any queueing), which no replica shortens."""
    w = World(config())
    for i in range(10):
        w.tick(15.0 * i, 2.0)
    before = w.replicas["primary"]
    for k in range(2):
        d = w.tick(150.0 + 15.0 * k, 2.0, ttft=5000.0, queue_time=queue_time)
    assert (d.pools["primary"].desired == before + 1) == expect_up
    if not expect_up:
        assert any("own prefill" in r for r in d.pools["primary"].reasons)


def test_a_feedback_replica_is_held_for_a_down_window_then_twice_as_long_each_time_the_miss_comes_back() -> None:
    """The model said the ready replicas were enough and the measured TTFT said otherwise: the replica the feedback
    added is kept while the planned rate stays at the rate of that miss, for one down-window (the model, still
    optimistic there, would release it once the measured TTFT recovered). Then the model judges again; when the miss
    comes back the next hold is twice as long, and once the rate falls well below it the count starts over."""
    w = World(primary_only())  # down-window 300 s
    for i in range(40):
        w.tick(15.0 * i, 2.0)
    before = w.replicas["primary"]
    for k in range(2):
        w.tick(600.0 + 15.0 * k, 2.0, ttft=5000.0)
    assert w.replicas["primary"] == before + 1
    st = w.state.pools["primary"]
    floor = st.feedback_floor
    assert floor is not None and floor[1] == before + 1 and st.feedback_floor_until == 615.0 + 300.0
    w.state = PolicyState.from_json(w.state.to_json())  # an operator restart keeps the evidence and its hold
    st = w.state.pools["primary"]
    assert st.feedback_floor == (round(floor[0], 4), floor[1]) and st.feedback_floor_until == 915.0
    assert st.feedback_floors == 1
    for i in range(18):  # the hold: same rate, TTFT within the plan
        w.tick(630.0 + 15.0 * i, 2.0, ttft=500.0)
    assert w.replicas["primary"] == before + 1
    for i in range(40):  # after it, the model's down-window releases the replica
        w.tick(900.0 + 15.0 * i, 2.0, ttft=500.0)
    st = w.state.pools["primary"]
    assert w.replicas["primary"] == before and st.feedback_floor is None and st.feedback_floor_until is None
    for k in range(2):  # the miss comes back: the replica again, held twice as long
        w.tick(1500.0 + 15.0 * k, 2.0, ttft=5000.0)
    st = w.state.pools["primary"]
    assert w.replicas["primary"] == before + 1 and st.feedback_floors == 2 and st.feedback_floor_until == 1515.0 + 600.0
    for i in range(38):  # 570 s of the 600 s hold
        w.tick(1530.0 + 15.0 * i, 2.0, ttft=500.0)
    assert w.replicas["primary"] == before + 1


def test_a_feedback_replica_goes_once_the_rate_falls_away_and_the_count_starts_over() -> None:
    """Released while its hold lasts because the rate fell well below the miss's: the evidence is forgotten, and
    the next miss is held for one down-window again."""
    w = World(primary_only())
    for i in range(40):
        w.tick(15.0 * i, 2.0)
    before = w.replicas["primary"]
    for k in range(2):
        w.tick(600.0 + 15.0 * k, 2.0, ttft=5000.0)
    st = w.state.pools["primary"]
    st.feedback_floors, st.feedback_floor_until = 3, 615.0 + 2400.0  # a fourth hold: 2,400 s
    for i in range(60):  # the rate halves
        w.tick(630.0 + 15.0 * i, 1.0, ttft=500.0)
    st = w.state.pools["primary"]
    assert w.replicas["primary"] <= before and st.feedback_floor is None and st.feedback_floors == 0
    assert st.feedback_floor_until is None  # nothing of the forgotten hold is left to persist


def test_slo_feedback_waits_until_the_last_action_settled() -> None:
    """Right after a scale-up the old replicas still drain the backlog: a TTFT miss then is no capacity error."""
    w = World(primary_only(), cold_start=30.0)
    for i in range(10):
        w.tick(15.0 * i, 2.0)
    w.tick(150.0, 8.0)  # burst: scale up
    assert w.state.pools["primary"].last_action_at == 150.0
    eff = w.state.pools["primary"].efficiency
    w.tick(180.0, 8.0, ttft=5000.0)
    d = w.tick(195.0, 8.0, ttft=5000.0)  # replicas ready, but only 45 s after the action (< 60 + 30)
    assert d.pools["primary"].action == "hold" and w.state.pools["primary"].efficiency == eff
    d = w.tick(240.0, 8.0, ttft=5000.0)  # settled (60 + 2 x 15 s), the miss persists: now evidence
    assert d.pools["primary"].action == "up" and w.state.pools["primary"].efficiency == eff


def test_queue_policy_is_keda_like() -> None:
    w = World(config("queue", target_queue_depth=4.0))
    d = w.tick(0.0, 5.0, queue=30.0)
    assert d.pools["primary"].recommended == 8 and d.pools["primary"].desired == 6  # step-limited
    d = w.tick(15.0, 5.0, queue=float(6 * 4))  # exactly on target -> hold
    assert d.pools["primary"].action == "hold"


def test_static_policy_uses_spec_replicas() -> None:
    w = World(config("static"), replicas={"primary": 5, "small": 0})
    d = w.tick(0.0, 100.0, queue=1000.0)
    assert d.desired() == {"primary": 2, "small": 0}


def test_decide_is_pure_and_deterministic() -> None:
    cfg = config()
    state = PolicyState()
    sigs = [PoolSignals("primary", "primary", 0.0, 2, 2, arrival_rate=9.0, mean_input_tokens=MEAN_IN,
                        mean_output_tokens=MEAN_OUT, queue_depth=3.0),
            PoolSignals("small", "student", 0.0, 0, 0, arrival_rate=0.0)]
    a, b = decide(cfg, sigs, state), decide(cfg, sigs, state)
    assert a.desired() == b.desired() and a.pools == b.pools
    assert state.pools == {}  # input state untouched
    with pytest.raises(ValueError, match="no signals for pool"):
        decide(cfg, sigs[:1], state)


def test_config_from_inference_service() -> None:
    isvc = parse_resource({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"},
        "spec": {"model": {"path": "/m"}, "replicas": 3, "minReplicas": 1, "maxReplicas": 9,
                 "slo": {"ttftP95Ms": 800},
                 "autoscaling": {"policy": "queue", "maxScaleDownStep": 2, "coldStartSeconds": 45},
                 "fallback": {"pools": [{"name": "small", "model": {"path": "/s"}, "maxReplicas": 3}]}},
    })
    cfg = PolicyConfig.from_service(isvc)  # type: ignore[arg-type]
    assert cfg.policy == "queue" and cfg.ttft_slo_ms == 800 and cfg.max_down_step == 2 and cfg.cold_start_s == 45
    assert [(p.name, p.role, p.min_replicas, p.max_replicas) for p in cfg.pools] == [
        ("primary", "primary", 1, 9), ("small", "student", 0, 3)]


def test_state_json_tolerates_garbage() -> None:
    assert PolicyState.from_json("not json").pools == {}
    assert PolicyState.from_json('{"primary": 3}').pools == {}
    s = PolicyState.from_json('{"primary": {"lastActionAt": 12.5, "efficiency": 0.8, "lastAction": "up"}}')
    assert s.pools["primary"].last_action_at == 12.5 and s.pools["primary"].efficiency == 0.8
    for bad in ('"x"', '{"since": "x", "target": 3, "readyBefore": 2}', '{"since": 1, "target": true, "readyBefore": 2}',
                '{"since": 1, "target": 3, "readyBefore": -1}'):
        s = PolicyState.from_json(f'{{"primary": {{"pendingScaleUp": {bad}, "lateScaleUp": 1}}}}')
        assert s.pools["primary"].pending is None and not s.pools["primary"].late
    for bad in ('3', '{"rate": "x", "replicas": 3}', '{"rate": 1.5, "replicas": 0}', '{"rate": true, "replicas": 2}',
                '{"rate": -1, "replicas": 2}'):
        assert PolicyState.from_json(f'{{"primary": {{"feedbackFloor": {bad}}}}}').pools["primary"].feedback_floor is None
    for bad in ('"x"', 'true', '-1', '1.5'):
        assert PolicyState.from_json(f'{{"primary": {{"feedbackFloors": {bad}}}}}').pools["primary"].feedback_floors == 0


def test_a_restarted_operator_reads_the_state_times_on_its_own_clock() -> None:
    """The operator decides on time.monotonic(), which starts again in a new process (another node's uptime). The
    annotation carries Unix seconds, so a restart keeps the last action's age and what a burst left behind (its
    plan, the insurance student); a time the writer's clock put after the reader's now is read as now, so the
    cooldown cannot hold until the clock catches up."""
    st = PolicyState()
    p = st.pool("primary")
    p.last_action_at, p.last_burst_at, p.burst_until = 90.0, 80.0, 140.0
    p.burst_beyond_ready_at = 85.0
    p.shift_extrapolated_past, p.extrapolation_unconfirmed = True, True
    s = st.pool("small")
    s.burst_insured, s.last_served_at = True, 95.0
    text = st.to_json(wall_offset=1e9)  # process A: monotonic 100 is Unix 1e9 + 100
    # process B, 30 s later, on a node whose monotonic clock reads 5: Unix 1e9 + 130, so its offset is 1e9 + 125
    r = PolicyState.from_json(text, wall_offset=1e9 + 125, now=5.0)
    assert 5.0 - (r.pools["primary"].last_action_at or 0.0) == pytest.approx(40.0)  # 10 s before A's 100, + 30 s
    assert r.pools["primary"].last_burst_at == pytest.approx(-45.0)
    assert r.pools["primary"].burst_until == pytest.approx(15.0)  # still ahead: the burst plan goes on
    assert r.pools["primary"].burst_beyond_ready_at == pytest.approx(-40.0)  # the kind of burst it was
    p_r = r.pools["primary"]  # and whether its extrapolation is trusted
    assert p_r.shift_extrapolated_past and p_r.extrapolation_unconfirmed and not p_r.shift_measured_past
    assert r.pools["small"].burst_insured and r.pools["small"].last_served_at == pytest.approx(-30.0)
    assert r.pools["primary"].cold_start_s is None and not r.pools["primary"].burst_insured
    # the writer's clock ahead of the reader's: the last action is read as now, not 45 s in the future
    assert PolicyState.from_json(text, wall_offset=1e9 + 45, now=0.0).pools["primary"].last_action_at == 0.0
    # the cooldown (60 s) then counts from the restored time: a scale-down 40 s after the last action waits
    cfg = config(idle_fraction=0.0, down_window_s=0.0)
    sigs = [_sig("primary", 5.0, 3, 3, 0.5), PoolSignals("small", "student", 5.0, 0, 0, arrival_rate=0.0)]
    r.pools["primary"].first_seen = -1000.0
    d = decide(cfg, sigs, r)
    assert d.pools["primary"].action == "hold" and any("cooldown" in x for x in d.pools["primary"].reasons)
    d = decide(cfg, [replace(x, now=30.0) for x in sigs], d.state)
    assert d.pools["primary"].action == "down"
