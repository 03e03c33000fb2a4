"""Model shapes (the API's ModelShape) with presets, parameter counts and per-token byte sizes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.hardware import GPUProfile, get_gpu

PRESETS: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192,
                             rope_theta=500000.0),
    # Llama-3.1-8B: Llama-3-8B's shape with a 128k context (RoPE scaling; the roofline does not model it)
    "llama-3.1-8b": ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=131072,
                               rope_theta=500000.0),
    "llama-3-70b": ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, seq_len=8192,
                              rope_theta=500000.0),
    # the ~0.9B reference config of the training benchmark (benchmarks/train_mfu.py, config "0.9b")
    "ref-0.9b": ModelShape(layers=16, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=32768, seq_len=4096),
    "llama-2-7b": ModelShape(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000, seq_len=4096),
    "llama-3.2-1b": ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, seq_len=8192,
                               rope_theta=500000.0, tie_embeddings=True),
    "llama-3.1-70b": ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, seq_len=131072,
                                rope_theta=500000.0),
    "mistral-7b": ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32768, seq_len=32768,
                             rope_theta=1000000.0),  # v0.3's vocabulary
}


def _qwen2_5(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, *, small: bool = False) -> ModelShape:
    """A Qwen2.5 model: RoPE base 1e6 and its Instruct models' 32k context; the small ones tie their embeddings
    and have a 151,936-token vocabulary (152,064 otherwise). The QKV biases are left out (~0.01 % of the
    parameters)."""
    return ModelShape(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn,
                      vocab=151936 if small else 152064, seq_len=32768, rope_theta=1000000.0, tie_embeddings=small)


PRESETS |= {
    "qwen2.5-0.5b": _qwen2_5(24, 896, 14, 2, 4864, small=True),
    "qwen2.5-1.5b": _qwen2_5(28, 1536, 12, 2, 8960, small=True),
    "qwen2.5-7b": _qwen2_5(28, 3584, 28, 4, 18944),
    "qwen2.5-14b": _qwen2_5(48, 5120, 40, 8, 13824),
    "qwen2.5-32b": _qwen2_5(64, 5120, 40, 8, 27648),
    "qwen2.5-72b": _qwen2_5(80, 8192, 64, 8, 29568),
}

# Bytes per element of weights / KV-cache dtypes. int4 ignores the (small) per-group scales.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "auto": 2.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "int8": 1.0, "int4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}") from None


def tensor_parallel_problem(m: ModelShape, tensor_parallel: int) -> str | None:
    """Why vLLM cannot split `m` over `tensor_parallel` GPUs, or None: it shards attention heads, so their count
    must divide evenly, and the KV heads either divide evenly or are replicated a whole number of times (its
    model config and QKVParallelLinear refuse anything else, at start, after the weights are fetched)."""
    if m.heads % tensor_parallel:
        return (f"{m.heads} attention heads do not split over tensor parallelism {tensor_parallel} (vLLM needs a "
                "size that divides them)")
    kv = m.n_kv_heads
    if kv % tensor_parallel and tensor_parallel % kv:
        return (f"{kv} KV heads do not split over tensor parallelism {tensor_parallel} (vLLM needs a size that "
                "divides them or a multiple of them)")
    return None


def kv_dtype_for(kv_cache_dtype: str) -> str:
    """The planner's KV dtype for a pool's `vllm.kvCacheDtype` (auto, fp8, fp8_e4m3, fp8_e5m2)."""
    return "fp8" if kv_cache_dtype.startswith("fp8") else "bf16"


def shape_from_hf_config(cfg: Mapping[str, Any]) -> ModelShape:
    """The planner's shape of a Hugging Face config.json (a multimodal model's `text_config` where the top level
    has no layers): layers, width, attention and KV heads, MLP width, vocabulary, context, RoPE base, tied
    embeddings. ValueError, naming the key, for what a Llama-style shape cannot hold (mixture-of-experts, MLA or
    state-space layers, a head size other than hidden / heads) or a key it needs that is missing."""
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = cfg["text_config"]
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(cfg.get(key), int) and cfg[key] > 1:
            raise ValueError(f"{key} = {cfg[key]}: a mixture-of-experts model; the planner's shapes are dense")
    if "kv_lora_rank" in cfg or any("mamba" in k or k == "ssm_state_size" for k in cfg):
        raise ValueError("MLA or state-space layers (kv_lora_rank, ssm_state_size): the planner's shapes are "
                         "standard attention")

    def whole(key: str, default: int | None = None) -> int:
        value = cfg.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a whole number >= 1, got {value!r}")
        return value

    hidden, heads = whole("hidden_size"), whole("num_attention_heads")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        raise ValueError(f"head_dim = {head_dim} is not hidden_size / num_attention_heads ({hidden} / {heads}): the "
                         "planner's shapes have no separate head size")
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    return ModelShape(layers=whole("num_hidden_layers"), hidden=hidden, heads=heads,
                      kv_heads=whole("num_key_value_heads", heads), ffn=whole("intermediate_size"),
                      vocab=whole("vocab_size"), seq_len=whole("max_position_embeddings", 2048),
                      rope_theta=float(cfg.get("rope_theta") or 10000.0),
                      sliding_window=window if isinstance(window, int) and window > 0 else None,
                      tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))


def shape_from_document(doc: Any) -> ModelShape:
    """A shape file's document: a Hugging Face config.json (it has num_hidden_layers, or a text_config) or a
    ModelShape (layers, hidden, heads, kvHeads, ffn, vocab, ...). ValueError (a pydantic ValidationError for a
    ModelShape field) when it is neither."""
    if isinstance(doc, Mapping) and ("num_hidden_layers" in doc or "text_config" in doc):
        return shape_from_hf_config(doc)
    return ModelShape.model_validate(doc)


def load_shape(path: str | Path) -> ModelShape:
    """The shape in a YAML/JSON file or a model folder's config.json (`shape_from_document`). ValueError in one
    line naming the file and, for a ModelShape, the field; an unreadable file is the loader's InputFileError."""
    from pydantic import ValidationError

    from llmfleet.api.loader import load_yaml_file

    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    doc = load_yaml_file(file)  # its InputFileError names the file already
    try:
        return shape_from_document(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ValueError(f"{file}: {where}: {first['msg']}") from None
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


# A shape as one number per field, the form of a gauge per field (the serving wrapper's `llmfleet:model_shape`
# with the field in label `dim`, api.contracts): the fields the planner reads. No sliding window is an absent
# `sliding_window`; tied embeddings are 1, untied 0.
SHAPE_DIMS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "rope_theta", "sliding_window",
              "tie_embeddings")


def shape_dims(m: ModelShape) -> dict[str, float]:
    """`m` as {SHAPE_DIMS field: number}; `shape_from_dims` reads it back to an equal shape."""
    dims = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.n_kv_heads, "ffn": m.ffn_dim,
            "vocab": m.vocab, "seq_len": m.seq_len, "rope_theta": m.rope_theta,
            "tie_embeddings": 1 if m.tie_embeddings else 0}
    if m.sliding_window is not None:
        dims["sliding_window"] = m.sliding_window
    return {k: float(v) for k, v in dims.items()}


def shape_from_dims(dims: Mapping[str, float]) -> ModelShape:
    """The shape `shape_dims` wrote. ValueError, naming the field, for a missing field, a fraction where a whole
    number belongs, or numbers that are no valid shape (heads that do not divide the width)."""
    whole: dict[str, int] = {}
    for key in SHAPE_DIMS:
        if key in ("rope_theta", "sliding_window"):
            continue
        if key not in dims:
            raise ValueError(f"{key} missing")
        if not float(dims[key]).is_integer():
            raise ValueError(f"{key} must be a whole number, got {dims[key]!r}")
        whole[key] = int(dims[key])
    if whole["tie_embeddings"] not in (0, 1):
        raise ValueError(f"tie_embeddings must be 0 or 1, got {whole['tie_embeddings']}")
    window = dims.get("sliding_window")
    if window is not None and not float(window).is_integer():
        raise ValueError(f"sliding_window must be a whole number, got {window!r}")
    return ModelShape(layers=whole["layers"], hidden=whole["hidden"], heads=whole["heads"],
                      kv_heads=whole["kv_heads"], ffn=whole["ffn"], vocab=whole["vocab"], seq_len=whole["seq_len"],
                      rope_theta=float(dims.get("rope_theta", 10000.0)),
                      sliding_window=int(window) if window is not None else None,
                      tie_embeddings=bool(whole["tie_embeddings"]))


def weight_dtype_for(quantization: str | None) -> str:
    """The planner's weight dtype for a pool's `model.quantization`: fp8 (weights and matmuls in fp8: twice the
    FLOPs of bf16 on fp8 tensor cores, half the bytes). Every other method prices as bf16: AWQ, GPTQ and
    bitsandbytes keep 16-bit matmuls (the same prefill), and their smaller weights, which would leave more room for
    KV and read faster in decode, are left out: the safe side for a seed and a price. compressed-tensors may be
    either kind, so it gets bf16 too."""
    return "fp8" if quantization == "fp8" else "bf16"


def get_model(name: str) -> ModelShape:
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[key]


def planned_pool(model: str | ModelShape | None, gpu_type: str | None, *, gpus: int = 1,
                 mig_profile: str | None = None) -> tuple[ModelShape, GPUProfile] | None:
    """The planner's model and GPU (one MIG instance of `mig_profile` where given) for a pool's spec names: `model`
    is a preset name or a shape itself. None where it has none: no model, no GPU (CPU replicas), or a preset, GPU
    or MIG profile it does not know."""
    if model is None or model == "" or not gpu_type or gpus <= 0:
        return None
    try:
        return get_model(model) if isinstance(model, str) else model, get_gpu(gpu_type, mig=mig_profile)
    except ValueError:
        return None


def attention_params_per_layer(m: ModelShape) -> int:
    kv_dim = m.n_kv_heads * m.head_dim
    return 2 * m.hidden * m.hidden + 2 * m.hidden * kv_dim  # q, o + k, v


def mlp_params_per_layer(m: ModelShape) -> int:
    return 3 * m.hidden * m.ffn_dim  # SwiGLU: gate, up, down


def layer_params(m: ModelShape) -> int:
    return attention_params_per_layer(m) + mlp_params_per_layer(m) + 2 * m.hidden  # + two RMSNorms


def embedding_params(m: ModelShape) -> int:
    return m.vocab * m.hidden


def total_params(m: ModelShape) -> int:
    head = 0 if m.tie_embeddings else m.vocab * m.hidden
    return m.layers * layer_params(m) + embedding_params(m) + head + m.hidden


def matmul_params(m: ModelShape) -> int:
    """Parameters that take part in a matmul per token: all but the input embedding lookup (and norms)."""
    return m.layers * (attention_params_per_layer(m) + mlp_params_per_layer(m)) + m.vocab * m.hidden


def kv_bytes_per_token_for(layers: int, kv_heads: int, head_dim: int, element_bytes: float) -> float:
    """K and V for every layer: 2 · layers · kvHeads · headDim · bytes (exact for integer element sizes)."""
    return 2 * layers * kv_heads * head_dim * element_bytes


def kv_bytes_per_token(m: ModelShape, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes of one token of a model shape in `kv_dtype`."""
    return kv_bytes_per_token_for(m.layers, m.n_kv_heads, m.head_dim, dtype_bytes(kv_dtype))


def attention_kind(m: ModelShape) -> str:
    if m.n_kv_heads == m.heads:
        return "MHA"
    if m.n_kv_heads == 1:
        return "MQA"
    return f"GQA (groups of {m.heads // m.n_kv_heads})"
