"""Table-driven tests of the pure scaling policy (burst, diurnal ramp, noisy, stale, cold start)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from llmfleet.api import parse_resource
from llmfleet.autoscaler.capacity import CapacitySeed, erlang_c, replicas_for_ttft, wait_p95_seconds
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
             ttft: float | None = None, missing: bool = False, student_ttft: float | None = None) -> ScalingDecision:
        for at, pool in list(self.starting):
            if at <= t:
                self.ready[pool] += 1
                self.starting.remove((at, pool))
        sigs = [
            PoolSignals("primary", "primary", t, self.replicas["primary"], self.ready["primary"],
                        arrival_rate=None if missing else rate, mean_input_tokens=MEAN_IN,
                        mean_output_tokens=MEAN_OUT, queue_depth=queue, ttft_p95_ms=ttft, stale=stale),
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


# --- queueing math ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "servers,offered,expected",
    [(1, 0.5, 0.5), (2, 1.0, 1 / 3), (1, 0.0, 0.0), (3, 3.5, 1.0), (10, 5.0, 0.0361)],
)
def test_erlang_c_known_values(servers: int, offered: float, expected: float) -> None:
    assert erlang_c(servers, offered) == pytest.approx(expected, abs=2e-3)


PREFILL_S, DECODE_S = MEAN_IN / SEED.prefill_tokens_per_s, MEAN_OUT / SEED.decode_tokens_per_s


def test_wait_p95_decreases_with_replicas_and_is_inf_when_overloaded() -> None:
    waits = [wait_p95_seconds(n, 10.0, PREFILL_S, DECODE_S) for n in range(1, 12)]
    assert math.isinf(waits[0]) and math.isinf(waits[2])
    finite = [w for w in waits if math.isfinite(w)]
    assert finite == sorted(finite, reverse=True) and finite[-1] == 0.0
    n = replicas_for_ttft(10.0, PREFILL_S, DECODE_S, 0.3, MAX_UTILIZATION, 30)
    assert wait_p95_seconds(n, 10.0, PREFILL_S, DECODE_S) <= 0.3 < wait_p95_seconds(n - 1, 10.0, PREFILL_S, DECODE_S)


def test_the_wait_is_for_prefills_and_decodes_only_slow_them() -> None:
    """A request waits for the prefills ahead of it, not for whole requests (continuous batching adds it to the next
    step beside the running decodes): the p95 wait is M/M/c over the prefill work, the decodes' share of each
    replica slowing that server. Whole requests as the service (the model it replaces) would wait 1.65x longer here."""
    rate, n = 4.0, 2
    share = rate * DECODE_S / n
    mu = (1 - share) / PREFILL_S
    c = erlang_c(n, rate / mu)
    assert wait_p95_seconds(n, rate, PREFILL_S, DECODE_S) == pytest.approx(math.log(c / 0.05) / (n * mu - rate))
    # without decodes the prefill server is faster; whole requests as the service would wait longer
    assert wait_p95_seconds(n, rate, PREFILL_S, 0.0) < wait_p95_seconds(n, rate, PREFILL_S, DECODE_S)
    whole = 1 / (PREFILL_S + DECODE_S)
    c_whole = erlang_c(n, rate / whole)
    assert math.log(c_whole / 0.05) / (n * whole - rate) > 1.6 * wait_p95_seconds(n, rate, PREFILL_S, DECODE_S)
    # the decodes' share alone bounds the replicas where prefills would never queue
    assert replicas_for_ttft(4.0, 0.001, 0.5, 10.0, MAX_UTILIZATION, 30) == math.ceil(4.0 * 0.501 / MAX_UTILIZATION)


def test_the_ttft_budget_alone_bounds_utilization() -> None:
    """No separate utilization cap below 1: a chat-like mix (short prefills, decode most of a request) at 90 %
    utilization whose p95 wait fits the budget is one replica, as one simulated replica serves it (a shape whose
    knee is at 16-17 req/s met a 1 s SLO at 16); Erlang C's wait itself diverges as utilization nears 1."""
    prefill_s, decode_s = 0.004, 0.056  # ~16.7 req/s per replica
    rate = 0.9 / (prefill_s + decode_s)
    assert wait_p95_seconds(1, rate, prefill_s, decode_s) <= 0.68
    assert replicas_for_ttft(rate, prefill_s, decode_s, 0.68, MAX_UTILIZATION, 30) == 1
    assert math.isinf(wait_p95_seconds(1, 1.0 / (prefill_s + decode_s), prefill_s, decode_s))


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


def test_a_restarted_operator_reads_the_state_times_on_its_own_clock() -> None:
    """The operator decides on time.monotonic(), which starts again in a new process (another node's uptime). The
    annotation carries Unix seconds, so a restart keeps the last action's age and what a burst left behind (its
    plan, the insurance student); a time the writer's clock put after the reader's now is read as now, so the
    cooldown cannot hold until the clock catches up."""
    st = PolicyState()
    p = st.pool("primary")
    p.last_action_at, p.last_burst_at, p.burst_until = 90.0, 80.0, 140.0
    s = st.pool("small")
    s.burst_insured, s.last_served_at = True, 95.0
    text = st.to_json(wall_offset=1e9)  # process A: monotonic 100 is Unix 1e9 + 100
    # process B, 30 s later, on a node whose monotonic clock reads 5: Unix 1e9 + 130, so its offset is 1e9 + 125
    r = PolicyState.from_json(text, wall_offset=1e9 + 125, now=5.0)
    assert 5.0 - (r.pools["primary"].last_action_at or 0.0) == pytest.approx(40.0)  # 10 s before A's 100, + 30 s
    assert r.pools["primary"].last_burst_at == pytest.approx(-45.0)
    assert r.pools["primary"].burst_until == pytest.approx(15.0)  # still ahead: the burst plan goes on
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


# --- burst capacity, unbiased capacity learning, idle scale-down ---------------------------------------------

def _sig(pool: str, t: float, replicas: int, ready: int, rate: float, **kw: object) -> PoolSignals:
    role = "primary" if pool == "primary" else "student"
    return PoolSignals(pool, role, t, replicas, ready, arrival_rate=rate, mean_input_tokens=MEAN_IN,  # type: ignore[arg-type]
                       mean_output_tokens=MEAN_OUT, **kw)  # type: ignore[arg-type]


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
    w = World(config(), replicas={"primary": 3, "small": 0})
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
    wait for the next short rise, which it would again meet late. A rise that lasts past the cold start keeps it for
    the whole window."""
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
            assert downs[0] >= ends + 300.0 - 15.0  # the HPA's down-window after the last high recommendation


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
            assert p.pending == (300.0, 3) if t < 360.0 else (p.late and p.short_rise)
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
    w = World(config(idle_fraction=idle_fraction), replicas={"primary": current, "small": 0})
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
    w = World(config(), replicas={"primary": 4, "small": 0})  # 5 req/s needs 3 of 4: not clearly idle
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
    assert "clearly idle" in " ".join(w.log[int(first_down // 15)][2].pools["primary"].reasons)
    assert w.replicas["primary"] <= 2


def primary_only(**kw: object) -> PolicyConfig:
    """`config` without the student pool: no fallback capacity to stand in for a released primary."""
    cfg = config(**kw)
    return replace(cfg, pools=cfg.pools[:1])


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

    w = World(config(), replicas={"primary": 2, "small": 1})
    w.run(short, 240)
    assert max(d.pools["primary"].desired for _, _, d in w.log) == 2
    assert any("ready students carry the overflow" in " ".join(d.pools["primary"].reasons) for _, _, d in w.log)
    w = World(config(), replicas={"primary": 2, "small": 1})
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
        w = World(config(), replicas={"primary": 2, "small": 1})
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
    asked: list[tuple[float, float, float]] = []

    def at_mix(mean_in: float, mean_out: float, hit: float) -> CapacitySeed:
        asked.append((mean_in, mean_out, hit))
        return half if mean_in > 4000 else SEED

    fixed = decide(_primary_only(SEED), [_mix_sig(0.0, 8000.0)], PolicyState()).pools["primary"]
    mixed = decide(_primary_only(replace(SEED, at_mix=at_mix)), [_mix_sig(0.0, 8000.0)], PolicyState()).pools["primary"]
    assert (8000.0, MEAN_OUT, 0.0) in asked
    assert mixed.capacity_rps == pytest.approx((fixed.capacity_rps or 0.0) / 2)
    assert mixed.recommended > fixed.recommended
    short = decide(_primary_only(replace(SEED, at_mix=at_mix)), [_mix_sig(0.0, MEAN_IN)], PolicyState()).pools["primary"]
    assert short.capacity_rps == pytest.approx(MU)  # the roofline at the seed's own mix: the seed


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
