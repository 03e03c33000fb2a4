"""The planner's numbers for one pool of an InferenceService: which model preset it serves and how fast one of
its replicas is (`replica_capacity` for the pool's model, GPU and vLLM settings).

The autoscaler seeds its capacity model from them (llmfleet.autoscaler.seeds) and the router prices each pool's
prefill queue at the pool's own rate (llmfleet.router.config: a student's small model prefills several times
faster than the primary's). Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION
from llmfleet.plan.capacity import ReplicaCapacity, TrafficShape, replica_capacity
from llmfleet.plan.hardware import get_gpu
from llmfleet.plan.models import get_model

if TYPE_CHECKING:
    from llmfleet.api.inferenceservice import InferenceService, PoolView


def preset_for_pool(isvc: InferenceService, pool: PoolView) -> str | None:
    """The planner preset a pool serves: annotation `llmfleet.io/model-preset.<pool>`, for the primary also the
    unsuffixed one."""
    ann = isvc.metadata.annotations
    return ann.get(f"{MODEL_PRESET_ANNOTATION}.{pool.name}") or (
        ann.get(MODEL_PRESET_ANNOTATION) if pool.role == "primary" else None
    )


def service_shape(isvc: InferenceService) -> TrafficShape:
    """The request shape the planner's per-pool numbers are taken at: its default prompt and answer lengths, the
    service's SLOs."""
    return TrafficShape(ttft_slo_s=isvc.spec.slo.ttft_p95_ms / 1000.0, tpot_slo_s=isvc.spec.slo.tpot_p95_ms / 1000.0)


def pool_capacity(pool: PoolView, model_preset: str | None, w: TrafficShape) -> ReplicaCapacity | None:
    """The planner's capacity of one replica of `pool` (model preset, GPU from resources.gpuType, its vLLM settings)
    for requests of shape `w`; None when the planner cannot tell (no preset or GPU type, an unknown one, no GPU)."""
    gpu_type = pool.resources.gpu_type
    if not model_preset or not gpu_type or pool.resources.gpus <= 0:
        return None
    try:
        model, gpu = get_model(model_preset), get_gpu(gpu_type)
    except ValueError:
        return None
    kv = "fp8" if pool.vllm.kv_cache_dtype.startswith("fp8") else "bf16"
    return replica_capacity(model, gpu, w, kv_dtype=kv, tensor_parallel=pool.vllm.tensor_parallel_size,
                            max_num_seqs=pool.vllm.max_num_seqs or 256)


def prefill_tokens_per_s(cap: ReplicaCapacity, w: TrafficShape) -> float | None:
    """Uncached prompt tokens one replica prefills per second at shape `w` (None without a prefill time)."""
    new_tokens = max(1.0, w.input_tokens * (1.0 - w.prefix_hit_rate))
    return new_tokens / cap.prefill_s if cap.prefill_s > 0 else None


def pool_prefill_tokens_per_s(isvc: InferenceService, pool: PoolView) -> float | None:
    """The planner's prefill rate of one replica of `pool` at the service's shape; None when it cannot tell."""
    w = service_shape(isvc)
    cap = pool_capacity(pool, preset_for_pool(isvc, pool), w)
    return prefill_tokens_per_s(cap, w) if cap is not None else None
