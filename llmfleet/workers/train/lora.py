"""LoRA for the training worker's Transformer, and the PEFT adapter folder vLLM loads.

A LoRA-wrapped linear layer computes W x + (alpha / r) · B A x with the base W frozen, A (r x in) random and
B (out x r) zero at the start, so training begins at the base model. The adapter folder is what PEFT writes
and vLLM's `--enable-lora` / `/v1/load_lora_adapter` read:

    adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha", "target_modules", "base_model_name_or_path", ...}
    adapter_model.safetensors  base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight  (r x in)
                               base_model.model.model.layers.<i>.self_attn.q_proj.lora_B.weight  (out x r)

The worker's module names are already Hugging Face Llama's (layers.<i>.self_attn.q_proj, mlp.down_proj, ...),
so a PEFT key is `base_model.model.model.` + the module name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

from llmfleet.api.trainingjob import DEFAULT_LORA_TARGETS, LoraTarget

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model.model."
# Projections of a Llama block that vLLM applies LoRA to (its packed qkv_proj / gate_up_proj take the parts).
LORA_TARGETS: tuple[str, ...] = get_args(LoraTarget)


class LoRALinear(nn.Module):
    """`base` (frozen) plus a trainable low-rank update scaled by alpha / rank."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.rank = rank
        self.scale = alpha / rank
        base.weight.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device,
                                               dtype=base.weight.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device,
                                               dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # PEFT's initialisation of A; B starts at zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale
        return out


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: Sequence[str] = DEFAULT_LORA_TARGETS) -> list[str]:
    """Wrap every nn.Linear whose name ends in one of `targets`; freeze everything else. Returns the wrapped
    module names (in the model's own naming)."""
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown:
        raise ValueError(f"LoRA targets {unknown} are not Llama projections ({', '.join(LORA_TARGETS)})")
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = []
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Linear) and leaf in targets:
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, leaf, LoRALinear(module, rank, alpha))
            wrapped.append(name)
    if not wrapped:
        raise ValueError(f"no linear layer named {', '.join(targets)} in the model")
    return wrapped


def peft_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA weights in a state dict of a model wrapped by `apply_lora` (`<module>.lora_A` / `.lora_B`, wrapper
    prefixes of compile and activation checkpointing removed), under their PEFT names."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        module, _, leaf = name.rpartition(".")
        if leaf in ("lora_A", "lora_B"):
            clean = module.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")
            out[f"{PEFT_PREFIX}{clean}.{leaf}.weight"] = t.detach()
    return out


def peft_config(rank: int, alpha: float, targets: Iterable[str], base_model: str) -> dict[str, Any]:
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "target_modules": sorted(set(targets)), "base_model_name_or_path": base_model, "lora_dropout": 0.0,
        "bias": "none", "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False, "use_dora": False,
        "inference_mode": True,
    }


def export_peft(tensors: dict[str, torch.Tensor], out: str | Path, *, rank: int, alpha: float,
                targets: Iterable[str], base_model: str, dtype: torch.dtype = torch.float32) -> Path:
    """Write a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors); returns it."""
    from safetensors.torch import save_file

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to("cpu", dtype).contiguous() for k, v in tensors.items()}, str(root / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    (root / ADAPTER_CONFIG).write_text(json.dumps(peft_config(rank, alpha, targets, base_model), indent=2))
    return root


def random_adapter(model_dir: str | Path, out: str | Path, *, rank: int = 8, alpha: float = 16.0,
                   targets: Sequence[str] = DEFAULT_LORA_TARGETS, seed: int = 0, std: float = 0.05) -> Path:
    """An adapter with random A and B (so it visibly changes the output) for the Llama folder `model_dir`,
    sized from its config.json: for tests and demos that need adapters without training them."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, ffn, layers = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    kv = int(cfg.get("num_key_value_heads") or heads) * head_dim
    shapes = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
              "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, ffn), "up_proj": (hidden, ffn),
              "down_proj": (ffn, hidden)}
    kind = {t: "mlp" if t in ("gate_proj", "up_proj", "down_proj") else "self_attn" for t in LORA_TARGETS}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for t in targets:
            fan_in, fan_out = shapes[t]
            key = f"{PEFT_PREFIX}layers.{i}.{kind[t]}.{t}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) * std
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * std
    return export_peft(tensors, out, rank=rank, alpha=alpha, targets=targets, base_model=str(model_dir))
