"""method: lora on the training worker: a frozen base, trained LoRA updates, a PEFT adapter export.

Two gloo ranks under torchrun (FSDP2 shards frozen and trainable parameters of a block together). The export is
checked against its meaning: the base model with W + (alpha / r) B A merged in computes different logits
logits, and the base weights did not move.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def base_and_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from llmfleet.workers.train.data import prepare
    from llmfleet.workers.train.export import export_hf
    from llmfleet.workers.train.model import ModelArgs, Transformer

    work = tmp_path_factory.mktemp("lora")
    lib = Path(sysconfig.get_paths()["stdlib"])
    prepare([str(lib / f) for f in ("functools.py", "textwrap.py")], work / "data", tokenizer="bpe", vocab_size=512)
    args = ModelArgs(layers=2, hidden=64, heads=2, kv_heads=1, ffn=128, vocab=512, seq_len=64)
    model = Transformer(args)
    model.init_weights(seed=3)
    export_hf(model.state_dict(), args, work / "base", tokenizer=work / "data" / "tokenizer.json", dtype=torch.float32)
    return work / "base", work / "data"


def test_lora_training_exports_a_peft_adapter_of_the_base(base_and_data: tuple[Path, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from llmfleet.workers.train.export import load_hf
    from llmfleet.workers.train.lora import PEFT_PREFIX

    base, data = base_and_data
    spec = {
        "model": {"layers": 2, "hidden": 64, "heads": 2, "vocab": 512, "seqLen": 64},  # shape: from the base
        "data": {"path": str(data)},
        "method": "lora",
        "lora": {"baseModel": str(base), "rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj", "down_proj"]},
        "optimization": {"globalBatchTokens": 256, "microBatch": 2, "steps": 4, "precision": "fp32",
                         "lr": {"peak": 1e-2, "warmupSteps": 0}},
        "workers": {"count": 2},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), "interval": 4},
        "output": {"path": str(tmp_path / "adapter")},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, LLMFLEET_METRICS_PORT="0", OMP_NUM_THREADS="1", LLMFLEET_DEVICE="cpu")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "llmfleet.workers.train", "--spec", str(path)]
    run = subprocess.run(["nice", "-n", "10", *cmd], env=env, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stderr[-3000:]

    out = tmp_path / "adapter"
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16
    assert cfg["target_modules"] == ["down_proj", "q_proj", "v_proj"] and cfg["base_model_name_or_path"] == str(base)
    tensors = load_file(str(out / "adapter_model.safetensors"))
    expected = {f"{PEFT_PREFIX}layers.{i}.{m}.lora_{ab}.weight" for i in (0, 1)
                for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj") for ab in "AB"}
    assert set(tensors) == expected
    assert tensors[f"{PEFT_PREFIX}layers.0.self_attn.q_proj.lora_A.weight"].shape == (8, 64)
    assert tensors[f"{PEFT_PREFIX}layers.0.self_attn.v_proj.lora_B.weight"].shape == (32, 8)  # kv_heads x head_dim
    assert tensors[f"{PEFT_PREFIX}layers.1.mlp.down_proj.lora_A.weight"].shape == (8, 128)
    assert all(t.abs().sum() > 0 for k, t in tensors.items() if "lora_B" in k)  # B starts at 0: it trained

    # merged: the base with W + (alpha/r) B A must differ from the base, and the base folder is untouched
    model = load_hf(base)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.arange(1, 33).unsqueeze(0)
    with torch.no_grad():
        base_logits = model(tokens)
        for i in (0, 1):
            for mod in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"):
                a = tensors[f"{PEFT_PREFIX}layers.{i}.{mod}.lora_A.weight"]
                b = tensors[f"{PEFT_PREFIX}layers.{i}.{mod}.lora_B.weight"]
                model.get_submodule(f"layers.{i}.{mod}").weight += (16 / 8) * b @ a
        merged_logits = model(tokens)
    assert not torch.allclose(base_logits, merged_logits)
    assert all(torch.equal(v, load_hf(base).state_dict()[k]) for k, v in before.items())
    log = [json.loads(line) for line in (tmp_path / "ckpt" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 4 and all(e["loss"] == e["loss"] for e in log)
