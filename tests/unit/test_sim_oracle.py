"""Hindsight schedules (llmfleet.sim.oracle): a hand-sized workload whose cheapest schedule is known."""

from __future__ import annotations

import pytest

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import PoolSpec
from llmfleet.sim.oracle import hindsight_schedule, replay_schedule
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.workload import Request, Workload

# step time = tokens / 1000 s, so a 500-token prompt takes 0.5 s on its own replica
UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)
SLO_S = 2.0


def _burst() -> Workload:
    """1 request/s of 500 distinct tokens, 5 requests/s from 20 s to 30 s, then 1/s again until 49 s.

    One replica keeps up outside the burst (half busy); the burst brings 2.5 s of work per second, which two
    replicas cannot keep up with: it needs three.
    """
    arrivals = [float(t) for t in range(20)] + [20 + k / 5 for k in range(50)] + [float(t) for t in range(30, 50)]
    reqs = [Request(i, t, 500, 1, keys=tuple(range(1000 * i, 1000 * i + 125))) for i, t in enumerate(arrivals)]
    return Workload("burst", reqs, block_size=4)


def _pool(cold_start_s: float) -> PoolSpec:
    return PoolSpec(replicas=1, kv_blocks=10_000, cost=UNIT, cold_start_s=cold_start_s)


def test_instant_replicas_follow_the_burst() -> None:
    found = hindsight_schedule(_burst(), _pool(10.0), SLO_S, 4, router=LlmfleetRouter, target=1.0,
                               window_s=10.0, instant=True)
    assert found.replicas == (1, 1, 3, 1, 1)
    assert found.attainment == 1.0 and found.instant
    # one replica for the whole run (last request done at 49.5 s) and two more for the burst's 10 s, plus at
    # most the drain of their last requests; static-at-peak would pay 3 x 49.5 s
    assert 69.5 <= found.gpu_seconds < 71.0


def test_a_cold_start_is_paid_a_window_early() -> None:
    found = hindsight_schedule(_burst(), _pool(10.0), SLO_S, 4, router=LlmfleetRouter, target=1.0, window_s=10.0)
    # the two burst replicas must be started one window (the 10 s cold start) before the burst
    assert found.replicas == (1, 3, 3, 1, 1)
    assert 89.5 <= found.gpu_seconds < 91.0  # the two burst replicas paid for 20 s each
    late = replay_schedule(_burst(), _pool(10.0), (1, 1, 3, 1, 1), SLO_S, 10.0, LlmfleetRouter)
    assert any(r["ttft"] > SLO_S for r in late.records)  # started with the burst: too late


def test_a_start_that_misses_the_target_is_refused() -> None:
    with pytest.raises(ValueError, match="start higher"):
        hindsight_schedule(_burst(), _pool(0.0), SLO_S, 1, router=LlmfleetRouter, target=1.0, window_s=10.0)
    with pytest.raises(ValueError, match="at least one replica"):
        replay_schedule(_burst(), _pool(0.0), (1, 0), SLO_S, 10.0, LlmfleetRouter)


def test_several_orders_keep_the_cheapest_and_count_every_replay() -> None:
    one = hindsight_schedule(_burst(), _pool(10.0), SLO_S, 4, router=LlmfleetRouter, target=1.0, window_s=10.0)
    three = hindsight_schedule(_burst(), _pool(10.0), SLO_S, 4, router=LlmfleetRouter, target=1.0, window_s=10.0,
                               orders=("forward", "backward", "highest"))
    assert three.replicas == one.replicas and three.gpu_seconds <= one.gpu_seconds
    assert three.simulations > 2 * one.simulations
