"""KV-cache tiers: which medium holds a block (prefix index) and how many blocks a replica's host tier holds.

vLLM's native CPU offloading (`--kv-offloading-size <GiB> --kv-offloading-backend native`) writes KV blocks
through to a pinned host buffer and loads them back instead of recomputing them. Its KV events report each
block per `medium` ("GPU", "CPU") under the same engine hash; the prefix index counts copies per medium with
the helpers below. The host tier's size in blocks is not exported by vLLM, so it is derived here from what is:
`vllm:cache_config_info` (kv_offloading_size in GiB, block_size, cache_dtype) and the model's config.json.

Pure functions, no vLLM import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmfleet.plan.models import DTYPE_BYTES, kv_bytes_per_token_for

# -- media ------------------------------------------------------------------------------------------------------
# Per (engine hash, medium) reference counts, packed into one int per hash: a 16-bit field per medium slot
# (a dict per block would cost ~200 bytes on an index of a million blocks).
_MEDIUM_SLOTS: dict[str | None, int] = {None: 0, "GPU": 0, "CPU": 1, "STORAGE": 2}  # None: engines without tiers
_OTHER_MEDIUM_SLOT = 3  # media newer than this router share one slot
_COUNT_BITS = 16
_COUNT_MAX = (1 << _COUNT_BITS) - 1


def medium_slot(medium: object) -> int:
    """The count field of a KV event's `medium`."""
    if medium is None or isinstance(medium, str):
        return _MEDIUM_SLOTS.get(medium, _OTHER_MEDIUM_SLOT)
    return _OTHER_MEDIUM_SLOT


def count_add(counts: int, slot: int) -> int:
    """One more copy in `slot` (saturating, so a field never carries into the next medium's)."""
    shift = slot * _COUNT_BITS
    return counts if (counts >> shift) & _COUNT_MAX == _COUNT_MAX else counts + (1 << shift)


def count_sub(counts: int, slot: int) -> int:
    """One fewer copy in `slot`; a removal from a medium never seen storing it (a missed event) changes nothing."""
    shift = slot * _COUNT_BITS
    return counts - (1 << shift) if (counts >> shift) & _COUNT_MAX else counts


# -- host-tier capacity -----------------------------------------------------------------------------------------
GIB = 1 << 30
# vLLM's CPU offload spec rounds each offloaded block (all TP ranks together) up to a memory page
# (CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE).
PAGE_BYTES = 4096
# vLLM's cache dtypes with a fixed element size (bytes from plan.models.DTYPE_BYTES); "auto" follows the model
# dtype (see kv_element_bytes).
_CACHE_DTYPES = frozenset({"float16", "bfloat16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"})


def _element_bytes(dtype: str) -> int | None:
    return int(DTYPE_BYTES[dtype]) if dtype in _CACHE_DTYPES else None


class HostTierUnknown(ValueError):
    """The host tier's size in blocks cannot be derived; the message says why."""


def kv_element_bytes(cache_dtype: str = "auto", model_dtype: str = "auto") -> int:
    """Bytes per cached K or V element.

    `cache_dtype` is vLLM's (the `cache_dtype` label of vllm:cache_config_info); "auto" stores KV in the model
    dtype, which for `model_dtype` "auto" is 16-bit: vLLM serves bf16/fp16 checkpoints as they are and
    downcasts float32 checkpoints to 16 bits on GPUs. Quantized layouts with per-head scales or MLA-only dtypes
    have no fixed element size here and raise HostTierUnknown.
    """
    if cache_dtype != "auto":
        size = _element_bytes(cache_dtype)
        if size is None:
            raise HostTierUnknown(f"KV cache dtype {cache_dtype!r} has no known bytes per element")
        return size
    if model_dtype != "auto":
        size = _element_bytes(model_dtype)
        if size is None:
            raise HostTierUnknown(f"model dtype {model_dtype!r} has no known bytes per element")
        return size
    return 2


def _int_field(cfg: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = cfg.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def kv_bytes_per_token(
    model_config: Mapping[str, Any], *, cache_dtype: str = "auto", model_dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> int:
    """K and V of every layer for one token, summed over tensor-parallel ranks: 2 · layers · kvHeads · headDim · bytes.

    From a Hugging Face config.json (a multimodal model's `text_config` when the top level has no layers).
    Each rank holds max(1, kvHeads // tp) heads, so with fewer KV heads than ranks the heads are replicated and
    the total grows with tp (vLLM sizes the offload buffer over all ranks). Llama-3-8B in bf16:
    2 · 32 · 8 · 128 · 2 = 131,072 bytes. MLA (kv_lora_rank) and state-space layers have another layout and
    raise HostTierUnknown.
    """
    cfg = model_config
    if _int_field(cfg, "num_hidden_layers", "n_layer", "num_layers") is None and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    if "kv_lora_rank" in cfg or any("mamba" in k or k == "ssm_state_size" for k in cfg):
        raise HostTierUnknown("MLA or state-space KV layout: only standard K/V attention caches are sized")
    layers = _int_field(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int_field(cfg, "num_attention_heads", "n_head")
    kv_heads = _int_field(cfg, "num_key_value_heads", "num_kv_heads") or heads
    head_dim = _int_field(cfg, "head_dim")
    if head_dim is None and heads is not None:
        hidden = _int_field(cfg, "hidden_size", "n_embd")
        head_dim = hidden // heads if hidden is not None else None
    if layers is None or kv_heads is None or not head_dim:
        raise HostTierUnknown("config.json lacks num_hidden_layers, num_key_value_heads/num_attention_heads or "
                              "head_dim/hidden_size")
    tp = max(1, tensor_parallel_size)
    heads_all_ranks = max(1, kv_heads // tp) * tp
    return int(kv_bytes_per_token_for(layers, heads_all_ranks, head_dim, kv_element_bytes(cache_dtype, model_dtype)))


def cached_capacity(gpu_blocks: int, host_blocks: int) -> int:
    """Distinct blocks a replica can hold cached, what bounds its prefix-index LRU: the larger tier's blocks.

    vLLM writes every computed block through to the host tier and refreshes it there when a request finishes,
    so the host tier already holds most of what the GPU holds: the union is about max(GPU, host), not the sum
    (which would keep up to min(GPU, host) blocks the engine no longer has). The simulator's replica
    (`cached_capacity`) uses the same rule.
    """
    return max(gpu_blocks, host_blocks)


def host_cache_blocks(offload_gib: float, block_size: int, bytes_per_token: int) -> int:
    """Blocks of `block_size` tokens a `offload_gib` GiB host buffer holds (each block page-aligned, as vLLM does)."""
    block_bytes = -(-block_size * bytes_per_token // PAGE_BYTES) * PAGE_BYTES
    return int(offload_gib * GIB) // block_bytes


def load_model_config(model_path: str | None) -> dict[str, Any]:
    """The model folder's config.json; HostTierUnknown when there is none the router can read."""
    if not model_path or "://" in model_path:
        raise HostTierUnknown(f"model path {model_path!r} is not a local folder the router can read")
    path = Path(model_path)
    path = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HostTierUnknown(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise HostTierUnknown(f"{path} is not a JSON object")
    return data


def offload_gib_from_label(value: str | None, backend: str | None) -> float | None:
    """kv_offloading_size label of vllm:cache_config_info -> GiB; None when offloading is off ("None").

    Only the native backend sizes its buffer from it (lmcache keeps blocks in its own server): HostTierUnknown.
    """
    if value is None or value in ("", "None"):
        return None
    if backend not in (None, "", "native"):
        raise HostTierUnknown(f"kv_offloading_backend {backend!r} keeps blocks outside the replica's buffer")
    try:
        gib = float(value)
    except ValueError:
        raise HostTierUnknown(f"kv_offloading_size label {value!r} is not a number") from None
    return gib if gib > 0 else None
