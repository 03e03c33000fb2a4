"""precision: fp8 - torchao float8 training of the transformer blocks' linear layers.

Every nn.Linear inside `model.layers` becomes a torchao `Float8Linear`: its three matmuls (output, grad
input, grad weight) run on fp8 tensor cores with dynamic scales (one per tensor, or one per row with
rowwise scaling), master weights and everything else stay as they were (bf16 compute, fp32 weights).
The LM head (its weight is used directly by the compiled loss, and its 32k-wide logits are sensitive),
the embeddings and the norms stay in bf16. Under FSDP2 with tensorwise scaling the weights are
all-gathered in float8 (half the bytes of bf16); the scales for that are computed for all weights in one
pass after each optimizer step (`precompute_scales`).

fp8 needs fp8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell). On a CPU or an older GPU
the worker refuses to start with one clear error rather than quietly training in bf16: a job that asked
for fp8 and silently got bf16 would report numbers for something it did not run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

MIN_CAPABILITY = (8, 9)


class Float8Unavailable(ValueError):
    """fp8 was asked for where it cannot run (no fp8 tensor cores, or torchao missing)."""


def check_device(device: torch.device, emulate: bool = False) -> None:
    """Raise Float8Unavailable unless `device` has fp8 tensor cores (or `emulate`, for CPU tests)."""
    if emulate:
        return
    if device.type != "cuda":
        raise Float8Unavailable(
            "optimization.precision fp8 needs a GPU with fp8 tensor cores (compute capability 8.9+); this worker "
            "runs on CPU: use bf16 or fp32"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise Float8Unavailable(
            f"optimization.precision fp8 needs fp8 tensor cores (compute capability 8.9+); {name} has "
            f"{cap[0]}.{cap[1]}: use bf16"
        )


def _torchao() -> Any:
    try:
        import torchao.float8 as f8
    except ImportError as err:
        raise Float8Unavailable(
            f"optimization.precision fp8 needs torchao (pip install 'llmfleet[train]'): {err}"
        ) from None
    return f8


def config(scaling: str, fsdp_all_gather: bool, emulate: bool = False) -> Any:
    """torchao Float8LinearConfig: tensorwise (optionally float8 FSDP all-gather) or rowwise."""
    f8 = _torchao()
    if scaling == "rowwise":
        # torchao's rowwise recipe; its weights are all-gathered in bf16 (float8 all-gather is tensorwise only).
        cfg = f8.Float8LinearConfig.from_recipe_name("rowwise")
        if emulate:
            import dataclasses

            cfg = dataclasses.replace(cfg, emulate=True)
        return cfg
    if scaling != "tensorwise":
        raise ValueError(f"unknown float8 scaling {scaling!r}; use tensorwise or rowwise")
    return f8.Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_all_gather, emulate=emulate)


def block_linear_filter(module: nn.Module, fqn: str) -> bool:
    """Convert only linears inside the transformer blocks whose dimensions suit fp8 GEMMs (multiples of 16)."""
    if not isinstance(module, nn.Linear) or not fqn.startswith("layers."):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert(model: nn.Module, scaling: str, fsdp_all_gather: bool, emulate: bool = False) -> int:
    """Swap the blocks' nn.Linear for Float8Linear in place; returns how many were converted."""
    f8 = _torchao()
    from torchao.float8.float8_linear import Float8Linear

    f8.convert_to_float8_training(model, config=config(scaling, fsdp_all_gather, emulate),
                                  module_filter_fn=block_linear_filter)
    return sum(1 for m in model.modules() if isinstance(m, Float8Linear))


def precompute_scales(model: nn.Module) -> None:
    """After the optimizer step: one fused amax pass for every float8-all-gathered weight (FSDP2, tensorwise)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
