"""Simulator scale-in: the production victim choice (llmfleet.autoscaler.scalein), fed the router's index."""

from __future__ import annotations

import pytest

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import Fleet, PoolSpec, SimConfig, SimRouter, simulate
from llmfleet.sim.replica import SimReplica
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.workload import Request, Workload

# step time = tokens / 1000 s
UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)


class FirstReady(SimRouter):
    """Sends everything to the first routable replica and reports replica 0 as holding nothing exclusive."""

    name = "first-ready"

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        return fleet.routable["primary"][0] if fleet.routable["primary"] else None

    def blocks_lost_if_removed(self, reps: list[SimReplica]) -> dict[str, int] | None:
        return {str(r.id): 0 if r.id == 0 else 5 for r in reps}


def _run(scale_in: str) -> dict[int, float]:
    # replica 0 is busy at the 15 s tick (a 2 s prefill from 14.5 s); replica 1 is idle
    reqs = [Request(i, float(i), 100, 1, keys=(10 * i,)) for i in range(14)]
    reqs += [Request(14, 14.5, 2000, 1, keys=(140,)), Request(15, 20.0, 100, 1, keys=(150,))]
    cfg = SimConfig(pools=[PoolSpec(replicas=2, min_replicas=1, kv_blocks=1000, cost=UNIT)], scale_in=scale_in,
                    autoscale_interval_s=15.0)
    res = simulate(Workload("w", reqs, block_size=4), cfg, router=FirstReady(), autoscaler=lambda now, s: {"primary": 1})
    return {r["id"]: r["gpuS"] for r in res.replicas}


def test_scale_in_drains_the_replica_the_router_reports_cheapest_to_lose() -> None:
    # cache-aware (the production choice): replica 0 holds nothing only it has, so it goes, busy or not;
    # it stops once its in-flight request is done (16.5 s), and replica 1 serves the rest
    gpu_s = _run("cache-aware")
    assert gpu_s[0] == 16.5 and gpu_s[1] > 20.0
    # least-loaded ignores the index: the idle replica 1 goes at the tick
    gpu_s = _run("least-loaded")
    assert gpu_s[1] == 15.0 and gpu_s[0] > 20.0


def test_llmfleet_router_reports_the_blocks_only_each_replica_holds() -> None:
    shared = tuple(range(8))
    reqs = [Request(0, 0.0, 64, 1, keys=shared + tuple(range(100, 108))),
            Request(1, 0.0, 64, 1, keys=tuple(range(200, 216)))]
    router = LlmfleetRouter()
    simulate(Workload("w", reqs, block_size=4), SimConfig(pools=[PoolSpec(replicas=2, kv_blocks=1000, cost=UNIT)]),
             router=router)
    lost = router.blocks_lost_if_removed(router.fleet.replicas)
    assert lost is not None and sorted(lost.values()) == [16, 16]  # the two prompts went to different replicas


def test_an_unknown_scale_in_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="scale_in must be"):
        _run("fewest-requests")
