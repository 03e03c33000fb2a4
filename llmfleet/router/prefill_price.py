"""The prefill rate the estimated-ttft scorer prices a pool's work at, from the planner's roofline.

The scorer weighs seconds of queue (corrected to real time by every first byte) against seconds of prefill work
(prompt tokens over a rate). Priced faster than its replicas compute, recomputing a prefix on another replica
looks cheaper than it is: hit rates fall, the extra work lengthens the queues, and the fleet collapses. In the
10x-spike simulation of docs/benchmarks/router_rate_sensitivity.md an 8-replica fleet whose replicas prefill
~39,600 tokens/s meets its TTFT SLO for 100 % of requests priced at 5,000-60,000 tokens/s, 89 % at 100,000, 87 %
at 150,000 and 82 % at 300,000. One fixed rate for every pool is that mistake on any hardware slower than an H200:
Llama-3-70B on two H200s (tensor parallel 2) prefills about a fifth as fast as Llama-3-8B on one H200, Llama-3-8B
on an L4 about an eighth.

So a pool the planner knows (its model preset and GPU, MIG slice and tensor parallelism) is priced at
`DEFAULT_PREFILL_TOKENS_PER_S` times its roofline prefill rate over the reference's (`REFERENCE_MODEL` on one
`REFERENCE_GPU`, the hardware the default was set for), **never above the default**: the default's own margin
below the reference's roofline (30,000 against its ~39,600) carries to every slower pool, and the reference and
every faster pool keep exactly the default. Why not above: priced below the replicas' rate the fleet holds and
only its tail grows (TTFT p99 0.26 s at 5,000 against 0.17 s at 30,000), priced well above it the fleet collapses,
and the roofline's rate is an idle replica's: a burst's prompts share each step with the running decodes. Charging
a faster student pool's prefill above the default was measured in the autoscaler's simulation and cost the
fallback its timing. How much faster than its price a pool runs (`planned_prefill_speedup`) enters only where two
pools' queues are compared, the fallback's student-or-primary decision (docs/router.md, "Fallback"). A pool the
planner cannot price (CPU replicas, no preset, a GPU it does not know) has its rate measured instead, unless
`measurePrefillRate` says otherwise (docs/router.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.hardware import GPUProfile, get_gpu
from llmfleet.plan.models import get_model, planned_pool, weight_dtype_for
from llmfleet.plan.roofline import StepCostModel

# Prefill rate assumed for the reference and for a replica with none planned, configured or measured. Only ratios
# of estimates matter in a pool of identical replicas (the scale cancels); the figure is about Llama-3-8B bf16 on
# one H200 at the planner's roofline (below its marginal 39,600 tokens/s: the safe side, see above).
DEFAULT_PREFILL_TOKENS_PER_S = 30_000.0
REFERENCE_MODEL, REFERENCE_GPU = "llama-3-8b", "H200"


@lru_cache(maxsize=1)
def _reference_rate() -> float:
    return StepCostModel.build(get_model(REFERENCE_MODEL), get_gpu(REFERENCE_GPU)).prefill_tokens_per_s


def roofline_ratio(model: ModelShape, gpu: GPUProfile, *, tensor_parallel: int = 1, weight_dtype: str = "bf16") -> float:
    """One replica's roofline prefill rate of `model` on `gpu` (a MIG slice's profile where it is one) with
    `weight_dtype` weights (`plan.models.weight_dtype_for`) over the reference's (bf16)."""
    rate = StepCostModel.build(model, gpu, tensor_parallel=tensor_parallel,
                               weight_dtype=weight_dtype).prefill_tokens_per_s
    return rate / _reference_rate()


def planned_prefill_rate(model: ModelShape, gpu: GPUProfile, *, tensor_parallel: int = 1,
                         weight_dtype: str = "bf16") -> float:
    """The price of one replica: the default scaled by `roofline_ratio`, at most the default."""
    return DEFAULT_PREFILL_TOKENS_PER_S * min(roofline_ratio(model, gpu, tensor_parallel=tensor_parallel,
                                                             weight_dtype=weight_dtype), 1.0)


def planned_prefill_speedup(model: ModelShape, gpu: GPUProfile, *, tensor_parallel: int = 1,
                            weight_dtype: str = "bf16") -> float:
    """How much faster than its price a replica prefills at the roofline: `roofline_ratio` where the price is the
    capped default, 1 for the reference and every slower replica. Routing within a pool never needs it (one pool's
    replicas share their price); the fallback's comparison of two pools' prefill queues does
    (`fallback.pool_prefill_wait_ms`): priced alike, a Llama-3.2-1B student's queue on an H200 read 6.1x as long
    as the time its replicas take to work through it, beside an 8B primary's read at its own speed."""
    return max(roofline_ratio(model, gpu, tensor_parallel=tensor_parallel, weight_dtype=weight_dtype), 1.0)


def _planned_pool_price(price: Callable[..., float], model_preset: str | None, gpu_type: str | None, gpus: int,
                       mig_profile: str | None, tensor_parallel: int, quantization: str | None) -> float | None:
    """`price` (planned_prefill_rate or planned_prefill_speedup) of the pool the planner resolves from these names;
    None where it cannot (`plan.models.planned_pool`)."""
    planned = planned_pool(model_preset, gpu_type, gpus=gpus, mig_profile=mig_profile)
    return None if planned is None else price(*planned, tensor_parallel=tensor_parallel,
                                              weight_dtype=weight_dtype_for(quantization))


def pool_prefill_rate(model_preset: str | None, gpu_type: str | None = None, *, gpus: int = 1,
                      mig_profile: str | None = None, tensor_parallel: int = 1,
                      quantization: str | None = None) -> float | None:
    """`planned_prefill_rate` of a pool by the names in its spec (`quantization`: its model.quantization); None where
    the planner cannot price it (`plan.models.planned_pool`: no preset, CPU replicas, a preset, GPU or MIG profile
    it does not know)."""
    return _planned_pool_price(planned_prefill_rate, model_preset, gpu_type, gpus, mig_profile, tensor_parallel,
                               quantization)


def pool_prefill_speedup(model_preset: str | None, gpu_type: str | None = None, *, gpus: int = 1,
                         mig_profile: str | None = None, tensor_parallel: int = 1,
                         quantization: str | None = None) -> float:
    """`planned_prefill_speedup` of a pool by the names in its spec; 1 where the planner cannot price it (its rate
    is measured, or the default's)."""
    speedup = _planned_pool_price(planned_prefill_speedup, model_preset, gpu_type, gpus, mig_profile,
                                  tensor_parallel, quantization)
    return 1.0 if speedup is None else speedup
