"""Tiny model folders: loadable shapes, a working tokenizer with a chat template, cached builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet.local import tinymodel
from llmfleet.local.tinymodel import PRIMARY, STUDENT, build_tiny, param_count


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {s.name: build_tiny(s, root) for s in (PRIMARY, STUDENT)}


@pytest.mark.timeout(120)
def test_folders_are_complete_and_consistent(built: dict[str, Path]) -> None:
    from safetensors import safe_open
    from tokenizers import Tokenizer

    for spec in (PRIMARY, STUDENT):
        path = built[spec.name]
        for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json", ".complete"):
            assert (path / f).exists(), f
        cfg = json.loads((path / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_size"] == spec.hidden_size
        assert cfg["head_dim"] % 32 == 0  # CPU attention and fp8 KV need it
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        assert cfg["vocab_size"] == tok.get_vocab_size()
        text = "def main(argv):\n    return os.path.join(a, b)  # ünïcode"
        assert tok.decode(tok.encode(text).ids) == text  # byte-level: lossless on any text
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        assert shapes["model.embed_tokens.weight"] == (cfg["vocab_size"], spec.hidden_size)
        kv = spec.num_key_value_heads * cfg["head_dim"]
        assert shapes["model.layers.0.self_attn.k_proj.weight"] == (kv, spec.hidden_size)
        assert len([k for k in shapes if k.endswith("q_proj.weight")]) == spec.num_hidden_layers
        assert sum(_prod(s) for s in shapes.values()) == param_count(spec, cfg["vocab_size"])
        tcfg = json.loads((path / "tokenizer_config.json").read_text())
        assert "chat_template" in tcfg and tok.token_to_id(tcfg["eos_token"]) == cfg["eos_token_id"]
    assert param_count(STUDENT) < param_count(PRIMARY) / 2


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


@pytest.mark.timeout(60)
def test_cached_build_is_reused(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(tinymodel, "random_weights", boom)
    monkeypatch.setattr(tinymodel, "train_tokenizer", boom)
    assert build_tiny(PRIMARY, built[PRIMARY.name].parent) == built[PRIMARY.name]


def test_cache_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMFLEET_CACHE", str(tmp_path))
    assert tinymodel.cache_root() == tmp_path / "models"


def test_corpus_is_stdlib_source() -> None:
    files = tinymodel.stdlib_files()
    assert len(files) > 100 and all(p.suffix == ".py" for p in files[:50])
    assert files == sorted(files)


def test_training_job_matches_the_tiny_shape(tmp_path: Path) -> None:
    from llmfleet.api.trainingjob import TrainingJobSpec
    from llmfleet.local.tinytrain import training_job

    job = TrainingJobSpec.model_validate(training_job(STUDENT, 4096, tmp_path / "d", tmp_path / "tok", tmp_path, 50, 9500))
    m = job.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab) == (
        STUDENT.num_hidden_layers, STUDENT.hidden_size, STUDENT.num_attention_heads, STUDENT.num_key_value_heads,
        STUDENT.intermediate_size, 4096)
    assert job.workers.gpus_per_worker == 0 and job.optimization.steps == 50
