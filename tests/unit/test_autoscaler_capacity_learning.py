"""The capacity estimate cannot ratchet: it learns only from true saturation, in token-level work, moves a bounded
step per interval, recovers when the replicas do more than estimated or the fleet shows headroom; TPOT misses
without a standing queue add no replica."""

from __future__ import annotations

import pytest

from llmfleet.autoscaler.capacity import (
    EFFICIENCY_BOUNDS,
    MAX_STEP,
    RECOVERY_HALF_LIFE_S,
    CapacitySeed,
    learn_efficiency,
    work_per_replica,
)
from llmfleet.autoscaler.policy import PolicyConfig, PolicyState, PoolBounds, PoolSignals, decide

SEED = CapacitySeed(prefill_tokens_per_s=8000.0, decode_tokens_per_s=1500.0)


def _cfg() -> PolicyConfig:
    return PolicyConfig(policy="slo", pools=(PoolBounds("primary", "primary", 1, 30, 2, seed=SEED),),
                        ttft_slo_ms=2000.0, tpot_slo_ms=100.0, interval_s=15.0, cold_start_s=60.0)


def _sig(t: float, ready: int = 2, *, work: float, rate: float = 1.0, **kw: object) -> PoolSignals:
    """Signals whose token-level work per ready replica is `work` seed units (half prefill, half decode)."""
    return PoolSignals("primary", "primary", t, ready, ready, arrival_rate=rate, mean_input_tokens=2000.0,
                       mean_output_tokens=200.0, prefill_tokens_per_s=work / 2 * SEED.prefill_tokens_per_s * ready,
                       decode_tokens_per_s=work / 2 * SEED.decode_tokens_per_s * ready, **kw)  # type: ignore[arg-type]


def _run(sigs: list[PoolSignals], efficiency: float = 1.0) -> list[float]:
    state = PolicyState()
    state.pool("primary").efficiency = efficiency
    out = []
    for s in sigs:
        state = decide(_cfg(), [s], state).state
        out.append(state.pools["primary"].efficiency)
    return out


def test_work_per_replica_is_in_seed_units() -> None:
    assert work_per_replica(8000.0, 1500.0, 2, SEED) == pytest.approx(1.0)
    assert work_per_replica(None, 1500.0, 2, SEED) is None and work_per_replica(1.0, 1.0, 0, SEED) is None


def test_a_lightly_loaded_fleet_with_one_queued_request_mid_step_keeps_its_estimate() -> None:
    """One request arriving mid-step on a lone replica shows a queue at the tick (waiting >= ready replicas), while
    the replica is far from saturated: the interval's low work must not be read as its capacity."""
    sigs = [_sig(15.0 * i, ready=1, work=0.1, queue_depth=1.0, min_queue_depth=0.0, ttft_p95_ms=300.0)
            for i in range(40)]
    assert _run(sigs) == [1.0] * 40


def test_true_saturation_lowers_the_estimate_by_a_bounded_step() -> None:
    effs = _run([_sig(15.0 * i, work=0.05, queue_depth=20.0, min_queue_depth=5.0) for i in range(30)])
    prev = 1.0
    for e in effs[1:]:  # the first interval has no previous ready count to compare
        assert e >= prev * (1 - MAX_STEP) - 1e-12 and e <= prev
        prev = e
    assert effs[-1] == pytest.approx(EFFICIENCY_BOUNDS[0])  # followed the evidence, stopped at the bound
    # saturated at the estimate's own capacity: a fixed point
    assert _run([_sig(15.0 * i, work=0.6, min_queue_depth=2.0) for i in range(40)], 0.6)[-1] == pytest.approx(0.6)


def test_recovers_when_replicas_serve_more_than_the_estimate() -> None:
    effs = _run([_sig(15.0 * i, work=0.9, min_queue_depth=0.0, ttft_p95_ms=1900.0) for i in range(20)], 0.3)
    assert effs[0] == pytest.approx(0.3 * (1 + MAX_STEP))  # a bounded step up, not a jump to 0.9
    assert effs[-1] == pytest.approx(0.9)  # and then the work it did (a lower bound on capacity)


def test_recovers_towards_the_seed_with_headroom_and_no_saturation() -> None:
    """A lowered estimate keeps the fleet big enough that saturation never shows it wrong: with TTFT headroom and no
    standing queue it returns towards the seed (half-way per RECOVERY_HALF_LIFE_S)."""
    n = int(RECOVERY_HALF_LIFE_S / 15.0)
    effs = _run([_sig(15.0 * i, work=0.05, min_queue_depth=0.0, ttft_p95_ms=200.0) for i in range(n)], 0.3)
    assert effs[-1] == pytest.approx(1.0 - 0.7 * 0.5, rel=1e-6)
    # without headroom (TTFT above the planned 70 % of the SLO) it holds
    assert _run([_sig(15.0 * i, work=0.05, min_queue_depth=0.0, ttft_p95_ms=1500.0) for i in range(n)], 0.3)[-1] == 0.3
    # and it never drifts above the seed on its own
    assert learn_efficiency(1.0, 0.1, saturated=False, headroom=True, interval_s=15.0) == 1.0


def _feedback(min_queue: float) -> int:
    state = PolicyState()
    d = None
    for i in range(12):  # settle, then two intervals of TPOT misses with the TTFT fine
        tpot = 250.0 if i >= 10 else 40.0
        d = decide(_cfg(), [_sig(15.0 * i, work=0.3, rate=1.0, ttft_p95_ms=300.0, tpot_p95_ms=tpot,
                                 min_queue_depth=min_queue)], state)
        state = d.state
    assert d is not None
    return d.pools["primary"].desired


def test_tpot_misses_without_a_standing_queue_add_no_replica() -> None:
    """Long prefills sharing steps with decodes stretch TPOT on a fleet with idle capacity: not a replica's job."""
    assert _feedback(min_queue=0.0) == 2
    # with requests waiting all interval the batches are full: one more replica
    assert _feedback(min_queue=2.0) == 3


def test_saturation_signals_from_prometheus_and_scrapes() -> None:
    from llmfleet.autoscaler.signals import PoolRef, Selectors, build_queries, values_from_scrapes

    q = build_queries("svc", "ns", "primary", "primary", Selectors(), "1m")
    assert q["min_queue_depth"].startswith("min(min_over_time(") and "num_requests_waiting" in q["min_queue_depth"]

    w = "vllm:num_requests_waiting"
    prev = {(w, (("replica", "a"),)): 3.0, (w, (("replica", "b"),)): 0.0}
    cur = {(w, (("replica", "a"),)): 2.0, (w, (("replica", "b"),)): 4.0}
    v = values_from_scrapes(PoolRef("primary", "primary", 2, 2), {}, {}, prev, cur, 15.0)
    assert v["min_queue_depth"] == 0.0  # replica b had an empty queue at the previous scrape: not saturated


def test_the_simulator_reports_token_level_work_and_the_interval_queue() -> None:
    from llmfleet.sim.engine import simulate
    from llmfleet.sim.types import PoolSpec, SimConfig
    from llmfleet.sim.workload import Request, Workload

    seen: list[PoolSignals] = []

    def hook(now: float, sigs: list[PoolSignals]) -> dict[str, int]:
        seen.extend(sigs)
        return {}

    # 160 long prompts at once on one replica running 4 at a time: a standing queue for several 15 s intervals
    w = Workload("t", [Request(i, 0.0, 7000, 200) for i in range(160)], block_size=16)
    simulate(w, SimConfig(pools=[PoolSpec(replicas=1, max_num_seqs=4)], autoscale_interval_s=15.0), autoscaler=hook)
    # the first interval began with an empty queue (before the arrivals); the second was queued throughout
    assert seen[0].min_queue_depth == 0.0 and seen[1].min_queue_depth is not None and seen[1].min_queue_depth >= 1
    # token-level: prompt tokens count when computed, not when their requests finish (none finished by 15 s)
    assert seen[0].prefill_tokens_per_s is not None and seen[0].prefill_tokens_per_s > 0
    assert seen[0].mean_input_tokens is not None and 0 < sum(s.prefill_tokens_per_s or 0.0 for s in seen) * 15.0 <= 160 * 7000
