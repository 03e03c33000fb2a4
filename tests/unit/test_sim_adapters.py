"""Simulator LoRA: adapter slots (LRU) and load time per replica; adapter-aware vs adapter-blind routing."""

from __future__ import annotations

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import PoolSpec, SimConfig, simulate
from llmfleet.sim.replica import SimReplica
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.workload import Request, Workload

UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)


def test_replica_adapter_lru_and_load_time_stalls_the_next_step() -> None:
    rep = SimReplica(0, "primary", blocks=100, block_size=4, cost=UNIT, adapter_slots=2, adapter_load_s=0.5)
    for name in ("a", "b", "a", "c"):  # c evicts b (least recently used), not a
        rep.use_adapter(name)
    assert list(rep.adapters) == ["a", "c"] and rep.adapter_loads == 3
    assert rep.adapter_pending_s == 1.5
    rep.waiting.append(Request(0, 0.0, 8, 2))
    end = rep.schedule(0.0)
    assert end is not None and abs(end - (8 / 1000 + 1.5)) < 1e-9  # the 8-token prefill plus the loads
    assert rep.adapter_pending_s == 0.0


def _workload() -> Workload:
    # two adapters (a a b ...), spaced so each request finds the fleet idle: least-request rotates its start
    reqs = [Request(i, i * 1.0, 40, 4, adapter="aab"[i % 3]) for i in range(40)]
    return Workload("alt", reqs, block_size=4)


def _cfg() -> SimConfig:
    return SimConfig(pools=[PoolSpec(replicas=2, cost=UNIT, kv_blocks=200, adapter_slots=1, adapter_load_s=0.3)])


def test_adapter_aware_routing_loads_each_adapter_once() -> None:
    blind = simulate(_workload(), _cfg(), "least-request").summary
    aware = simulate(_workload(), _cfg(), LlmfleetRouter(weights={"adapter-loaded": 1.0, "queue-depth": 0.1})).summary
    assert aware["adapterLoads"] == 2  # one per adapter: each stays on the replica that holds it
    assert blind["adapterLoads"] > 10  # least-request rotates: one slot per replica thrashes
    assert aware["ttft"]["p99"] < blind["ttft"]["p99"]
    base = simulate(_workload(), SimConfig(pools=[PoolSpec(replicas=2, cost=UNIT, kv_blocks=200)]), "least-request")
    assert base.summary["adapterLoads"] == 4  # no slot limit: each replica loads each adapter once
