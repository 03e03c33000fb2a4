"""The planner's fleet for a recorded workload: `llmfleet sim plan`, and the autoscaling benchmark's static
planner baseline and starting fleets.

A trace holds what the planner otherwise asks for by hand (`llmfleet plan --rate --input --output --prompts`):
the arrival rate of its busiest minute, its mean output, and its prompt lengths, each priced on its own
(`llmfleet.plan.capacity.replica_capacity(prompts=...)`: attention makes a long prompt cost more than its share of
the mean). It lives in the simulator's floor because the trace loaders do; the formulas stay in the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.capacity import ReplicaPlan, TrafficShape, replicas_needed
from llmfleet.plan.hardware import GPUProfile
from llmfleet.plan.roofline import kv_capacity
from llmfleet.sim.report import finite_cache_hit_bound, ttft_lower_bound
from llmfleet.sim.types import PoolSpec
from llmfleet.sim.workload import Request, Workload

MINUTE_S = 60.0  # the rate is planned per whole minute: the window an operator reads a dashboard's peak over


@dataclass(frozen=True)
class TracePlan:
    """Replicas the planner provisions for a workload, and what it planned them for."""

    workload: str
    requests: int  # the requests planned for (the first minute's with `first_minute`)
    minutes: int  # whole minutes of the workload (a last, partial minute is not a rate)
    rate_rps: float  # the planned rate: the busiest whole minute's (or the first minute's)
    mean_rate_rps: float  # the whole workload's over its span (at least a second), for comparison
    shape: TrafficShape
    plan: ReplicaPlan
    cache_blocks: int | None = None  # with the workload's own reuse (plan_with_reuse): the pooled cache's blocks


def over_slo_alone(w: Workload, pool: PoolSpec, ttft_slo_s: float) -> tuple[int, int]:
    """(servable requests no fleet serves within `ttft_slo_s`, servable requests): a request's prefill alone, on an
    idle replica of `pool` with every prefix the workload sent before cached (`ttft_lower_bound`), takes longer.
    A request longer than the pool's context is not servable (the engine rejects it)."""
    bounds = ttft_lower_bound(w, pool.cost_model(), pool.max_batched_tokens)
    context = pool.context_len()
    servable = [lb for r, lb in zip(w.requests, bounds, strict=True) if r.prompt_len + r.output_len <= context]
    return sum(1 for lb in servable if lb > ttft_slo_s), len(servable)


def minute_rates(w: Workload) -> list[float]:
    """Requests per second in each whole minute from the first arrival. A workload shorter than a minute has no
    whole minute: its one rate is its requests over its span (at least a second)."""
    if not w.requests:
        return []
    t0 = min(r.arrival for r in w.requests)
    counts: dict[int, int] = {}
    for r in w.requests:
        k = int((r.arrival - t0) // MINUTE_S)
        counts[k] = counts.get(k, 0) + 1
    last = max(counts)
    if last == 0:
        return [len(w.requests) / max(max(r.arrival for r in w.requests) - t0, 1.0)]
    return [counts.get(k, 0) / MINUTE_S for k in range(last)]


def plan_workload(w: Workload, model: ModelShape, gpu: GPUProfile, *, ttft_slo_s: float, tpot_slo_s: float,
                  hit_rate: float = 0.0, first_minute: bool = False, kv_dtype: str = "bf16",
                  tensor_parallel: int = 1, max_num_seqs: int = 256) -> TracePlan:
    """The planner's replicas for `w`'s busiest whole minute, at the mean output of its requests and with each
    prompt's prefill priced on its own. `first_minute`: for the first minute's rate and requests instead, what an
    operator deploys from the traffic seen before any history exists (nothing later in the trace is used)."""
    if not w.requests:
        raise ValueError(f"{w.name}: no requests to plan for")
    if not 0.0 <= hit_rate <= 1.0:
        raise ValueError(f"the prefix hit rate must be within [0, 1], got {hit_rate:g}")
    rates = minute_rates(w)
    t0 = min(r.arrival for r in w.requests)
    sample: list[Request] = [r for r in w.requests if r.arrival - t0 < MINUTE_S] if first_minute else w.requests
    rate = rates[0] if first_minute else max(rates)
    shape = TrafficShape(input_tokens=int(sum(r.prompt_len for r in sample) / len(sample)),
                         output_tokens=max(1, int(sum(r.output_len for r in sample) / len(sample))), rate_rps=rate,
                         prefix_hit_rate=hit_rate, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)
    plan = replicas_needed(model, gpu, shape, kv_dtype=kv_dtype, tensor_parallel=tensor_parallel,
                           max_num_seqs=max_num_seqs, prompts=[r.prompt_len for r in sample])
    return TracePlan(workload=w.name, requests=len(sample), minutes=len(rates), rate_rps=rate,
                     mean_rate_rps=len(w.requests) / max(w.duration, 1.0), shape=shape, plan=plan)


def plan_with_reuse(w: Workload, model: ModelShape, gpu: GPUProfile, *, ttft_slo_s: float, tpot_slo_s: float,
                    first_minute: bool = False, kv_dtype: str = "bf16", tensor_parallel: int = 1,
                    max_num_seqs: int = 256) -> TracePlan:
    """`plan_workload` at the prefix hit rate the workload's own reuse gives the fleet it plans: the hit rate of
    one pooled LRU cache as large as n replicas' KV caches together (`finite_cache_hit_bound`: what routing that
    sends every prefix where it is cached gets from LRU engines), at the fewest n whose plan at that hit rate is
    n replicas or fewer. More replicas cache more, and more hits need fewer replicas, so the plan is the smallest
    fleet that is consistent with its own cache. An upper bound on the hits (the KV cache also holds the running
    requests, and no router is perfect), so a lower bound on the replicas a real fleet needs."""
    def at(hit_rate: float) -> TracePlan:
        return plan_workload(w, model, gpu, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, hit_rate=hit_rate,
                             first_minute=first_minute, kv_dtype=kv_dtype, tensor_parallel=tensor_parallel,
                             max_num_seqs=max_num_seqs)

    blocks = kv_capacity(model, gpu, kv_dtype=kv_dtype, tensor_parallel=tensor_parallel,
                         block_size=w.block_size).blocks
    t0 = min((r.arrival for r in w.requests), default=0.0)
    seen = Workload(w.name, [r for r in w.requests if r.arrival - t0 < MINUTE_S], w.block_size) if first_minute else w
    cold = at(0.0)
    for n in range(1, cold.plan.replicas + 1):
        found = at(finite_cache_hit_bound(seen, n * blocks, "lru"))
        if found.plan.replicas <= n:
            return replace(found, cache_blocks=n * blocks)
    return cold
