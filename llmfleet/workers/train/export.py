"""Export to / import from a Hugging Face folder (config.json, model.safetensors, tokenizer files) that
transformers and vLLM load: LlamaForCausalLM, or MistralForCausalLM when the model has a sliding window."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from llmfleet.workers.train.model import ModelArgs, Transformer

if TYPE_CHECKING:
    from llmfleet.api.trainingjob import TrainingJobSpec


def hf_config(args: ModelArgs, dtype: torch.dtype = torch.bfloat16, eos: int | None = None) -> dict[str, Any]:
    arch = "MistralForCausalLM" if args.sliding_window else "LlamaForCausalLM"
    cfg = {
        "architectures": [arch],
        "model_type": "mistral" if args.sliding_window else "llama",
        "hidden_size": args.hidden,
        "intermediate_size": args.ffn,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab,
        "max_position_embeddings": args.seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": args.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "bos_token_id": eos,
        "eos_token_id": eos,
    }
    if args.sliding_window:
        cfg["sliding_window"] = args.sliding_window
    return cfg


def args_from_hf_config(cfg: dict[str, Any]) -> ModelArgs:
    heads = int(cfg["num_attention_heads"])
    return ModelArgs(
        layers=int(cfg["num_hidden_layers"]), hidden=int(cfg["hidden_size"]), heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads), ffn=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]), seq_len=int(cfg.get("max_position_embeddings", 2048)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)), sliding_window=cfg.get("sliding_window"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
    )


def _hf_name(name: str) -> str:
    return name if name.startswith("lm_head.") else f"model.{name}"


def export_hf(
    state_dict: dict[str, torch.Tensor],
    args: ModelArgs,
    out: str | Path,
    tokenizer: str | Path | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write a full (unsharded) state dict of `Transformer` as a Hugging Face model folder.

    tokenizer: a tokenizer.json file or a folder holding one (plus any tokenizer_config.json); needed by
    vLLM. Returns the folder.
    """
    from safetensors.torch import save_file

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        name = name.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")
        if name.startswith("rope_") or (args.tie_embeddings and name == "lm_head.weight"):
            continue
        tensors[_hf_name(name)] = t.detach().to("cpu", dtype).contiguous()
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    eos = _copy_tokenizer(tokenizer, root) if tokenizer else None
    (root / "config.json").write_text(json.dumps(hf_config(args, dtype, eos), indent=2))
    gen: dict[str, Any] = {"do_sample": False}
    if eos is not None:
        gen.update(bos_token_id=eos, eos_token_id=eos)
    (root / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return root


def _copy_tokenizer(tokenizer: str | Path, root: Path) -> int | None:
    src = Path(tokenizer)
    folder = src if src.is_dir() else src.parent
    tok_json = folder / "tokenizer.json" if src.is_dir() else src
    if not tok_json.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {tokenizer}")
    shutil.copyfile(tok_json, root / "tokenizer.json")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_json))
    eos_tok = next((t for t in ("<|endoftext|>", "</s>", "<eos>") if tok.token_to_id(t) is not None), None)
    if (folder / "tokenizer_config.json").is_file():
        # The tokenizer's own config names its end-of-text token: better than guessing by name.
        named = json.loads((folder / "tokenizer_config.json").read_text()).get("eos_token")
        named = named.get("content") if isinstance(named, dict) else named
        if isinstance(named, str) and tok.token_to_id(named) is not None:
            eos_tok = named
        shutil.copyfile(folder / "tokenizer_config.json", root / "tokenizer_config.json")
    else:
        cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
                     "clean_up_tokenization_spaces": False}
        if eos_tok:
            cfg.update(bos_token=eos_tok, eos_token=eos_tok, unk_token=eos_tok, pad_token=eos_tok)
        (root / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
        if eos_tok:
            specials = {"bos_token": eos_tok, "eos_token": eos_tok, "unk_token": eos_tok, "pad_token": eos_tok}
            (root / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    return tok.token_to_id(eos_tok) if eos_tok else None


def load_hf(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Transformer:
    """A Transformer from a Hugging Face Llama/Mistral folder (ours, or any with the same layout)."""
    from safetensors.torch import load_file

    root = Path(path)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"{root}/config.json not found: not a Hugging Face model folder")
    args = args_from_hf_config(json.loads((root / "config.json").read_text()))
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {root}")
    hf: dict[str, torch.Tensor] = {}
    for f in files:
        hf.update(load_file(str(f)))
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=device)
    model.init_weights(seed=0)  # RoPE tables; weights are overwritten below
    sd = {k.removeprefix("model."): v for k, v in hf.items() if "rotary_emb" not in k}
    if args.tie_embeddings:
        sd.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.startswith("rope_") and not (args.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{root}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(dtype)


def export_trained(spec: TrainingJobSpec, model: torch.nn.Module, args: ModelArgs, *, rank: int,
                   work_dir: Path) -> tuple[Path, str] | None:
    """Gather a trained (possibly sharded) model and write `spec.output`: the HF model folder, or with method lora
    the PEFT adapter folder. Every rank calls it (the gather is collective); rank 0 writes. Returns the local
    folder and the output's URI, or None without `spec.output`."""
    if spec.output is None:
        return None
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from llmfleet.api.storage import parse_uri

    sd = cast(dict[str, torch.Tensor],
              get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    target = parse_uri(spec.output.path)
    # An s3:// output is written here first, then uploaded (and checked) by rank 0.
    out = Path(target.path) if target.scheme == "local" else work_dir / "export"
    lora = spec.lora if spec.method == "lora" else None
    if rank == 0 and lora is not None:
        from llmfleet.workers.train.lora import export_peft, peft_tensors

        export_peft(peft_tensors(sd), out, rank=lora.rank, alpha=lora.alpha, targets=lora.targets,
                    base_model=lora.base_model)
    elif rank == 0:
        tok = spec.data.tokenizer
        if tok is None and (Path(spec.data.path) / "tokenizer.json").is_file():
            tok = str(Path(spec.data.path) / "tokenizer.json")
        export_hf(sd, args, out, tokenizer=tok)
    dist.barrier()
    # After the barrier: the other ranks may finish while rank 0 uploads (a long upload would otherwise
    # run into the process group's timeout).
    if rank == 0 and target.scheme == "s3":
        from llmfleet.storage import upload

        upload(out, target)
    return out, str(target)
