"""Simulator step costs: replicas sharing one host's cores (PoolSpec.shared_cores: steps slow down with the busy
replicas), and the cost model's per-request overhead (paid once, by the step that admits the request)."""

from __future__ import annotations

import pytest

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import PoolSpec, SimConfig, simulate
from llmfleet.sim.routers import RoundRobin
from llmfleet.sim.workload import Request, Workload

# step time = tokens / 1000 s: no overhead, no memory term, no attention term
UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)


def _trace() -> Workload:
    # three 100-token prompts at once (round-robin: one per replica), then one alone once all are idle again
    return Workload("shared-host", [
        Request(0, 0.0, 100, 1, ()), Request(1, 0.0, 100, 1, ()), Request(2, 0.0, 100, 1, ()),
        Request(3, 1.0, 100, 1, ()),
    ], block_size=4)


def _ttfts(shared_cores: float) -> list[float]:
    pool = PoolSpec(replicas=3, kv_blocks=100, cost=UNIT, shared_cores=shared_cores)
    res = simulate(_trace(), SimConfig(pools=[pool], check_invariants=True), RoundRobin())
    return [r["ttft"] for r in sorted(res.records, key=lambda r: r["rid"])]


def test_a_step_takes_busy_replicas_over_cores_times_as_long() -> None:
    # 2 cores: the first two replicas start their steps with 1 and 2 busy (a core each: 0.1 s); the third
    # starts with 3 busy on 2 cores (1.5x: 0.15 s); the last request finds the host idle again (0.1 s)
    assert _ttfts(2.0) == pytest.approx([0.1, 0.1, 0.15, 0.1])
    # 1 core: 1x, 2x, 3x
    assert _ttfts(1.0) == pytest.approx([0.1, 0.2, 0.3, 0.1])


def test_independent_replicas_by_default() -> None:
    assert _ttfts(0.0) == pytest.approx([0.1, 0.1, 0.1, 0.1])


def test_decode_runs_are_slowed_too() -> None:
    # one 8-token prompt with 5 output tokens per replica, all at once on 1 core: replica k plans its prefill
    # with k+1 busy; the decode run that follows is planned while all three are busy (3x)
    w = Workload("decode", [Request(i, 0.0, 8, 5, ()) for i in range(3)], block_size=4)
    step = 8 / 1000
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=3, kv_blocks=100, cost=UNIT, shared_cores=1.0)]), RoundRobin())
    rec = sorted(res.records, key=lambda r: r["rid"])
    assert [r["ttft"] for r in rec] == pytest.approx([step, 2 * step, 3 * step])
    solo = simulate(w, SimConfig(pools=[PoolSpec(replicas=3, kv_blocks=100, cost=UNIT)]), RoundRobin())
    solo_decode = [r["e2e"] - r["ttft"] for r in solo.records]
    assert all(d > 0 for d in solo_decode)
    assert rec[0]["e2e"] - rec[0]["ttft"] == pytest.approx(3 * solo_decode[0])


def test_shared_host_needs_cores() -> None:
    from llmfleet.sim.replica import SimReplica

    with pytest.raises(ValueError, match="cores > 0"):
        SimReplica(0, "primary", 10, 4, UNIT).share_host([0], 0.0)


def test_the_request_overhead_is_paid_once_by_the_admitting_step() -> None:
    # step = tokens / 1000 s; a 20 ms per-request cost: the prefill step of 100 tokens takes 0.12 s, the four
    # decode steps that follow 1 ms each, as without it
    cost = StepCostModel(**{**UNIT.__dict__, "request_overhead_s": 0.02})
    w = Workload("one", [Request(0, 0.0, 100, 5, ())], block_size=4)
    rec = simulate(w, SimConfig(pools=[PoolSpec(replicas=1, kv_blocks=100, cost=cost)]), RoundRobin()).records[0]
    assert rec["ttft"] == pytest.approx(0.12)
    assert rec["e2e"] - rec["ttft"] == pytest.approx(0.004)
    # the second request arrives while the first's step runs: its own step pays the cost again
    w2 = Workload("two", [Request(0, 0.0, 100, 1, ()), Request(1, 0.0, 100, 1, ())], block_size=4)
    pool = PoolSpec(replicas=1, kv_blocks=100, cost=cost)
    assert [r["ttft"] for r in simulate(w2, SimConfig(pools=[pool]), RoundRobin()).records] == pytest.approx([0.12, 0.24])
