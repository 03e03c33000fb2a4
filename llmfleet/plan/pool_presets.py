"""Which planner preset a pool of an InferenceService serves, and what the planner says its spec cannot run.

The preset (its model's shape) is what the autoscaler seeds a pool's capacity from and what the router prices its
prefill by (llmfleet.autoscaler.seeds, llmfleet.router.prefill_price); the operator, `llmfleet validate` and
`llmfleet up` refuse the problems below before a replica is started.
"""

from __future__ import annotations

from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION
from llmfleet.api.inferenceservice import InferenceService, PoolView
from llmfleet.api.storage import UriError, parse_uri
from llmfleet.plan.models import (
    PRESETS,
    kv_dtype_for,
    planned_pool,
    tensor_parallel_problem,
    weight_dtype_for,
)
from llmfleet.plan.roofline import kv_capacity

# The presets' models on the Hugging Face Hub (lower case; each name also with "-instruct", and the Llama-2 ones
# with "-hf" / "-chat-hf"), so a pool serving one by `hf://ORG/NAME` needs no model-preset annotation.
_HUB_MODELS: dict[str, tuple[str, ...]] = {
    "llama-3-8b": ("meta-llama/meta-llama-3-8b",),
    "llama-3.1-8b": ("meta-llama/llama-3.1-8b", "meta-llama/meta-llama-3.1-8b"),
    "llama-3-70b": ("meta-llama/meta-llama-3-70b",),
    "llama-3.1-70b": ("meta-llama/llama-3.1-70b", "meta-llama/meta-llama-3.1-70b", "meta-llama/llama-3.3-70b"),
    "llama-3.2-1b": ("meta-llama/llama-3.2-1b",),
    "mistral-7b": ("mistralai/mistral-7b-v0.3",),
    **{f"qwen2.5-{size}": (f"qwen/qwen2.5-{size}",) for size in ("0.5b", "1.5b", "7b", "14b", "32b", "72b")},
}
HUB_PRESETS: dict[str, str] = {
    repo + suffix: preset for preset, repos in _HUB_MODELS.items() for repo in repos for suffix in ("", "-instruct")
} | {"meta-llama/llama-2-7b-hf": "llama-2-7b", "meta-llama/llama-2-7b-chat-hf": "llama-2-7b",
     "mistralai/mistral-7b-instruct-v0.3": "mistral-7b"}

# Quantization methods whose weight bytes the planner knows (none: the model's 16 bits; fp8: one byte). The
# others (AWQ, GPTQ, bitsandbytes, compressed-tensors) store weights in fewer bits than the planner's bf16, so it
# cannot tell whether they fit.
SIZED_QUANTIZATION = (None, "fp8")


def pool_preset(isvc: InferenceService, pool: PoolView) -> str | None:
    """The planner preset `pool` serves: its model-preset annotation (`InferenceService.model_preset`), else the
    preset of the Hub repository it serves by `hf://` (`HUB_PRESETS`, any revision), else None."""
    if annotated := isvc.model_preset(pool):
        return annotated
    try:
        uri = parse_uri(pool.model.path)
    except UriError:
        return None
    return HUB_PRESETS.get(uri.location.lower()) if uri.scheme == "hf" else None


def model_preset_problems(isvc: InferenceService) -> list[tuple[str, str]]:
    """(field path, message) for each model-preset annotation the planner cannot use: a preset it does not know,
    or a `.<suffix>` that names no pool of the service. Both would otherwise be ignored without a word: the pool
    then gets the autoscaler's default seed and a measured prefill rate instead of the planner's. And, for a pool
    whose preset is known (`pool_preset`), what vLLM would refuse only at start, after fetching the weights: a
    tensor parallelism its heads do not allow (`tensor_parallel_problem`), weights that do not fit its GPUs."""
    pools = [p.name for p in isvc.pools()]
    problems = []
    for key, value in sorted(isvc.metadata.annotations.items()):
        if not key.startswith(MODEL_PRESET_ANNOTATION):
            continue
        path = f"metadata.annotations[{key}]"
        pool = key[len(MODEL_PRESET_ANNOTATION) + 1:]
        if key != MODEL_PRESET_ANNOTATION and (key[len(MODEL_PRESET_ANNOTATION)] != "." or pool not in pools):
            problems.append((path, f"names no pool of this service: use {MODEL_PRESET_ANNOTATION} (the primary) "
                                   f"or {MODEL_PRESET_ANNOTATION}.<pool> with a pool of {', '.join(pools)}"))
        elif value.lower() not in PRESETS:
            problems.append((path, f"unknown model preset {value!r}; known: {', '.join(PRESETS)}"))
    for view in isvc.pools():
        preset = pool_preset(isvc, view)
        if not preset or preset.lower() not in PRESETS:
            continue
        if problem := tensor_parallel_problem(PRESETS[preset.lower()], view.vllm.tensor_parallel_size):
            problems.append((f"{view.field_path}.vllm.tensorParallelSize", f"{problem}; model preset {preset}"))
        elif problem := weights_fit_problem(view, preset):
            problems.append((f"{view.field_path}.vllm.tensorParallelSize", problem))
    return problems


def weights_fit_problem(pool: PoolView, preset: str) -> str | None:
    """Why `preset`'s weights do not fit the KV budget of `pool`'s GPUs (gpuMemoryUtilization of each, over its
    tensor parallelism) as vLLM sizes it, or None: also where the planner cannot tell (CPU replicas, a GPU it does
    not know, a quantization whose weight bytes it does not know)."""
    planned = planned_pool(preset, pool.resources.gpu_type, gpus=pool.resources.gpus,
                           mig_profile=pool.resources.mig_profile)
    if planned is None or pool.model.quantization not in SIZED_QUANTIZATION:
        return None
    try:
        kv_capacity(*planned, weight_dtype=weight_dtype_for(pool.model.quantization),
                    kv_dtype=kv_dtype_for(pool.vllm.kv_cache_dtype),
                    gpu_memory_utilization=pool.vllm.gpu_memory_utilization,
                    tensor_parallel=pool.vllm.tensor_parallel_size)
    except ValueError as err:
        return f"model preset {preset}: {err} (or a bigger GPU, or fp8 weights)"
    return None
