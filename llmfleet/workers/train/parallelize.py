"""Parallelize the model, always in this order (each step wraps what the previous one produced):

0. residual dtype           - (a world of one, autocast) the embedding's output is cast to bf16, so the
                               residual stream between the blocks is bf16 as under FSDP's bf16 parameters;
                               with fp32 weights it would be fp32 and every residual add, norm input and
                               residual gradient would move twice the bytes (memory-bound kernels);
1. float8 conversion         - (precision fp8) swaps the blocks' nn.Linear for torchao Float8Linear. First,
                               because it replaces modules: AC, compile and FSDP must wrap the float8
                               modules, not the originals, and FSDP's float8 all-gather needs the
                               Float8Linear weights to exist when fully_shard is applied;
2. activation checkpointing  - per block, so recompute happens inside a block's backward;
3. torch.compile             - per block (and the loss head), after AC so the compiler sees the
                               checkpoint region and can pick what to save (and fuses float8's
                               amax/scale/cast into neighbouring kernels); before FSDP so the
                               compiled code never traces FSDP's hooks;
4. FSDP2 fully_shard         - per block, then the root; bf16 params with fp32 gradient reduction;
                               HSDP when the mesh is 2-D (replicate x shard). Skipped on a world of one:
                               there FSDP only adds copies (all-gather copy-in/out, gradient chunk-cat:
                               ~3% of an H200 step measured) and the trainer uses bf16 autocast instead.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from llmfleet.workers.train import float8
from llmfleet.workers.train.model import Transformer, norm_cross_entropy


def build_mesh(device_type: str, world_size: int, replicate_groups: int) -> DeviceMesh:
    """1-D mesh for FSDP, 2-D (replicate, shard) for HSDP."""
    if world_size % replicate_groups:
        raise ValueError(f"replicate groups ({replicate_groups}) must divide the world size ({world_size})")
    if replicate_groups == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(
        device_type, (replicate_groups, world_size // replicate_groups), mesh_dim_names=("replicate", "shard")
    )


def cast_residual_stream(model: Transformer, dtype: torch.dtype) -> None:
    """Cast the embedding's output (the start of the residual stream) to `dtype`."""
    model.embed_tokens.register_forward_hook(lambda _module, _inputs, out: out.to(dtype))


def apply_activation_checkpointing(model: Transformer, mode: str) -> None:
    """none | selective (every other block) | full (every block)."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.layers):
        if mode == "full" or i % 2 == 0:
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: Transformer, mode: str | None = None) -> None:
    """Compile each block on its own (one graph reused L times: short compile, no recompiles) and the
    final norm + output projection + cross-entropy as one fused region. Static shapes: the microBatch probe
    runs other batch sizes first, and a dynamic-shape recompile would leave the run on slower symbolic kernels."""
    for i, block in enumerate(model.layers):
        model.layers[i] = torch.compile(block, fullgraph=True, mode=mode, dynamic=False)  # type: ignore[assignment]
    model.loss_fn = torch.compile(norm_cross_entropy, fullgraph=True, mode=mode, dynamic=False)


def apply_fsdp(
    model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype, reshard_after_forward: bool
) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers: Any = model.layers
    for i, block in enumerate(layers):
        # The last block's parameters are needed again at the start of backward: keep them.
        last = i == len(layers) - 1
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and not last)
    # Root: embeddings, final norm and output projection in one group.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def parallelize(
    model: Transformer,
    mesh: DeviceMesh,
    *,
    activation_checkpointing: str,
    compile: bool,
    param_dtype: torch.dtype,
    reshard_after_forward: bool,
    float8_scaling: str | None = None,
    float8_all_gather: bool = True,
    float8_emulate: bool = False,
    residual_dtype: torch.dtype | None = None,
) -> Transformer:
    """float8_scaling (tensorwise|rowwise) turns on precision fp8; float8_emulate is for CPU tests only;
    residual_dtype (one device under autocast) is the residual stream's dtype."""
    fsdp = mesh.size() > 1
    if residual_dtype is not None and not fsdp:
        cast_residual_stream(model, residual_dtype)  # 0
    if float8_scaling is not None:
        float8.convert(model, float8_scaling, fsdp_all_gather=fsdp and float8_all_gather,
                       emulate=float8_emulate)  # 1
    apply_activation_checkpointing(model, activation_checkpointing)  # 2
    if compile:
        apply_compile(model, os.environ.get("LLMFLEET_COMPILE_MODE") or None)  # 3
    if fsdp:
        apply_fsdp(model, mesh, param_dtype, reshard_after_forward)  # 4
    return model
