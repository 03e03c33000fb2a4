"""Capacity seeds from the planner's roofline (llmfleet.plan.capacity.replica_capacity).

The planner answers "how fast is one replica of model M on GPU G for this request shape": prefill
time of the uncached prompt, and the decode step time at the largest batch meeting the TPOT SLO.
The policy wants tokens/s, so prefill tokens/s = uncached tokens / prefill time and decode tokens/s
= batch / step time. Anything the planner cannot resolve (unknown model or GPU, CPU replicas) falls
back to the default seed; the online learning corrects the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmfleet.autoscaler.capacity import DEFAULT_SEED, CapacitySeed
from llmfleet.plan.capacity import ReplicaCapacity, TrafficShape
from llmfleet.plan.pools import pool_capacity, prefill_tokens_per_s, preset_for_pool, service_shape

if TYPE_CHECKING:
    from llmfleet.api.inferenceservice import InferenceService, PoolView

__all__ = ["preset_for_pool", "seed_for_pool", "seed_from_capacity", "seeds_for_service"]


def seed_from_capacity(cap: ReplicaCapacity, w: TrafficShape) -> CapacitySeed:
    """Convert the planner's per-replica numbers into a CapacitySeed. Pure."""
    prefill_tps = prefill_tokens_per_s(cap, w) or DEFAULT_SEED.prefill_tokens_per_s
    decode_tps = cap.max_batch / cap.decode_step_s if cap.decode_step_s > 0 else DEFAULT_SEED.decode_tokens_per_s
    # Prefills run one at a time per replica (they own the step's token budget): one queueing slot.
    return CapacitySeed(prefill_tokens_per_s=prefill_tps, decode_tokens_per_s=decode_tps, slots=1)


def seed_for_pool(
    pool: PoolView, model_preset: str | None, *, input_tokens: int = 2048, output_tokens: int = 256,
    ttft_slo_s: float = 1.0, tpot_slo_s: float = 0.1,
) -> CapacitySeed:
    """Planner seed for `pool` (model preset name as the planner knows it, GPU from resources.gpuType)."""
    w = TrafficShape(input_tokens=input_tokens, output_tokens=output_tokens, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)
    cap = pool_capacity(pool, model_preset, w)
    return seed_from_capacity(cap, w) if cap is not None else DEFAULT_SEED


def seeds_for_service(isvc: InferenceService) -> dict[str, CapacitySeed]:
    """Seeds for every pool; the planner preset comes from annotation `llmfleet.io/model-preset[.<pool>]`."""
    w = service_shape(isvc)
    return {pool.name: seed_for_pool(pool, preset_for_pool(isvc, pool), input_tokens=w.input_tokens,
                                     output_tokens=w.output_tokens, ttft_slo_s=w.ttft_slo_s, tpot_slo_s=w.tpot_slo_s)
            for pool in isvc.pools()}
