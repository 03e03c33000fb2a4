"""Capacity seeds from the planner's roofline (llmfleet.plan.capacity.replica_capacity).

The planner answers "how fast is one replica of model M on GPU G for this request shape": what the prefill of
the uncached prompt adds to an engine step of the running decodes, and the decode step time at the largest batch
meeting the TPOT SLO. The policy wants tokens/s, so prefill tokens/s = uncached tokens / batched prefill time and
decode tokens/s = batch / step time. The seed of a pool the planner knows also carries the roofline at any other mix
(`CapacitySeed.for_mix`): the policy evaluates it at each interval's measured mean request shape and prefix
hit rate, since a replica's throughput depends on them. The model is a preset (the annotation, or the Hub
repository served), else the shape the pool's replicas report (the serving wrapper reads it from the model's
config.json). Anything the planner cannot resolve (no model, an unknown GPU, CPU replicas) falls back to the
default seed; the online learning corrects the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

from llmfleet.autoscaler.capacity import DEFAULT_SEED, CapacitySeed
from llmfleet.plan.capacity import ReplicaCapacity, TrafficShape, replica_capacity
from llmfleet.plan.models import kv_dtype_for, planned_pool, shape_dims, shape_from_dims, weight_dtype_for
from llmfleet.plan.pool_presets import pool_preset
from llmfleet.plan.roofline import StepCostModel

if TYPE_CHECKING:
    from llmfleet.api.inferenceservice import InferenceService, PoolView
    from llmfleet.api.trainingjob import ModelShape
    from llmfleet.autoscaler.state import PolicyState
    from llmfleet.autoscaler.types import PoolSignals


def seed_from_capacity(cap: ReplicaCapacity, w: TrafficShape, cost: StepCostModel | None = None) -> CapacitySeed:
    """Convert the planner's per-replica numbers into a CapacitySeed. Pure. With the step cost model the seed also
    carries what the queueing estimate reads from it: the decodes' compute-only rate at the mix's mean context and
    the prefill's attention ratio (capacity.py)."""
    new_tokens = max(1.0, w.input_tokens * (1.0 - w.prefix_hit_rate))
    prefill_tps = new_tokens / cap.prefill_batched_s if cap.prefill_batched_s > 0 else DEFAULT_SEED.prefill_tokens_per_s
    decode_tps = cap.max_batch / cap.decode_step_s if cap.decode_step_s > 0 else DEFAULT_SEED.decode_tokens_per_s
    if cost is None:
        return CapacitySeed(prefill_tokens_per_s=prefill_tps, decode_tokens_per_s=decode_tps)
    compute_s = cost.decode_compute_time(w.input_tokens + w.output_tokens / 2)
    return CapacitySeed(prefill_tokens_per_s=prefill_tps, decode_tokens_per_s=decode_tps,
                        decode_compute_tokens_per_s=1.0 / compute_s if compute_s > 0 else None,
                        prefill_attention_ratio=cost.prefill_attention_ratio)


def seed_for_pool(
    pool: PoolView, model: str | ModelShape | None, *, input_tokens: int = 2048, output_tokens: int = 256,
    ttft_slo_s: float = 1.0, tpot_slo_s: float = 0.1,
) -> CapacitySeed:
    """Planner seed for `pool` (`model`: a preset name as the planner knows it, or a shape; GPU from
    resources.gpuType and migProfile)."""
    planned = planned_pool(model, pool.resources.gpu_type, gpus=pool.resources.gpus,
                           mig_profile=pool.resources.mig_profile)
    if planned is None:
        return DEFAULT_SEED
    model, gpu = planned
    kv = kv_dtype_for(pool.vllm.kv_cache_dtype)
    weights = weight_dtype_for(pool.model.quantization)
    tp, seqs = pool.vllm.tensor_parallel_size, pool.vllm.max_num_seqs or 256
    cost = StepCostModel.build(model, gpu, weight_dtype=weights, kv_dtype=kv, tensor_parallel=tp)

    @lru_cache(maxsize=64)  # one interval asks for the same mix several times (capacity, prefill, learning)
    def at(mean_in: int, mean_out: int, hit_rate: float, kv_sequences: int | None = None) -> CapacitySeed:
        w = TrafficShape(input_tokens=mean_in, output_tokens=mean_out, prefix_hit_rate=hit_rate, ttft_slo_s=ttft_slo_s,
                         tpot_slo_s=tpot_slo_s, kv_sequences=kv_sequences)
        return seed_from_capacity(replica_capacity(model, gpu, w, weight_dtype=weights, kv_dtype=kv, tensor_parallel=tp,
                                                   max_num_seqs=seqs, cost=cost), w, cost)

    def at_mix(mean_in: float, mean_out: float, hit_rate: float, kv_sequences: float | None = None) -> CapacitySeed:
        """The roofline at the observed mix (whole tokens, at least one each; a hit rate within [0, 1]) with the KV
        cache holding `kv_sequences` (whole sequences, at least one) where that was measured."""
        kv = max(1, int(kv_sequences)) if kv_sequences is not None and math.isfinite(kv_sequences) else None
        return at(max(1, round(mean_in)), max(1, round(mean_out)), min(max(hit_rate, 0.0), 1.0), kv)

    try:
        base = at(input_tokens, output_tokens, 0.0)
    except ValueError:  # the preset's weights do not fit these GPUs (an invalid spec the operator reports): the
        return DEFAULT_SEED  # default seed, never an autoscaler that stops; the fit does not depend on the mix
    return replace(base, at_mix=at_mix)


def seeds_for_service(isvc: InferenceService,
                      reported_shapes: Mapping[str, ModelShape] | None = None) -> dict[str, CapacitySeed]:
    """Seeds for every pool. The planner's model comes from annotation `llmfleet.io/model-preset[.<pool>]`, else
    from the Hub repository the pool serves (`plan.pool_presets.pool_preset`), else from the shape the pool's
    replicas report (`reported_shapes`, pool -> shape: `known_shapes`), so a model no preset names (a
    fine-tune, a copy on S3 or a volume, another family) is planned too. A preset wins: it is what the spec says,
    and the operator checked it."""
    out = {}
    for pool in isvc.pools():
        model: str | ModelShape | None = pool_preset(isvc, pool) or (reported_shapes or {}).get(pool.name)
        out[pool.name] = seed_for_pool(
            pool, model, ttft_slo_s=isvc.spec.slo.ttft_p95_ms / 1000.0, tpot_slo_s=isvc.spec.slo.tpot_p95_ms / 1000.0
        )
    return out


def known_shapes(signals: Iterable[PoolSignals], state: PolicyState | None = None) -> dict[str, ModelShape]:
    """Pool -> the model shape its replicas report now, else the last one they agreed on (`state`, where
    `remember_shapes` kept it), for the pools that have one."""
    out: dict[str, ModelShape] = {}
    for name, pool in (state.pools.items() if state is not None else ()):
        if pool.model_shape:
            try:
                out[name] = shape_from_dims(pool.model_shape)
            except ValueError:  # an annotation edited by hand: the replicas report it again soon
                continue
    out.update({s.pool: s.model_shape for s in signals if s.model_shape is not None})
    return out


def remember_shapes(state: PolicyState, signals: Iterable[PoolSignals]) -> None:
    """Keep in `state` (persisted with it) the model shape each pool's replicas report now."""
    for s in signals:
        if s.model_shape is not None:
            state.pool(s.pool).model_shape = shape_dims(s.model_shape)
