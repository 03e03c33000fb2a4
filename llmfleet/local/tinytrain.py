"""Briefly train a tiny model with llmfleet's training worker, on the Python standard library's source.

`trained_tiny(spec, steps)` = the random-weight folder of `build_tiny`, tokenized stdlib source
(`llmfleet.workers.train.data.prepare` with the tiny tokenizer), a one-process CPU TrainingJob of the same
shape (`python -m llmfleet.workers.train`), and the exported weights copied into a cached folder next to
the random one (`<name>-<digest>-trained<steps>`), keeping the tiny tokenizer files and chat template.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from llmfleet.local.tinymodel import TinySpec, _publish, build_tiny, stdlib_files

# Enough source for a few hundred steps of 4096 tokens without repeating; tokenized in seconds.
CORPUS_FILES = 400


def training_job(spec: TinySpec, vocab: int, data: Path, tokenizer: Path, work: Path, steps: int,
                 metrics_port: int) -> dict[str, Any]:
    """A TrainingJob spec for one CPU process with the tiny model's exact shape."""
    return {
        "model": {"layers": spec.num_hidden_layers, "hidden": spec.hidden_size, "heads": spec.num_attention_heads,
                  "kvHeads": spec.num_key_value_heads, "ffn": spec.intermediate_size, "vocab": vocab, "seqLen": 256},
        "data": {"path": str(data), "tokenizer": str(tokenizer)},
        "optimization": {"globalBatchTokens": 4096, "microBatch": 4, "steps": steps, "precision": "fp32",
                         "lr": {"peak": 2e-3, "min": 2e-4, "warmupSteps": min(10, max(1, steps // 10))}},
        "workers": {"count": 1, "gpusPerWorker": 0},
        "checkpoint": {"uri": str(work / "ckpt"), "interval": steps},
        "output": {"path": str(work / "out")},
        "metrics": {"port": metrics_port},
    }


def trained_tiny(spec: TinySpec, steps: int, root: Path | None = None, force: bool = False,
                 timeout_s: float = 3600) -> Path:
    """Build (or reuse) the tiny model trained for `steps` optimizer steps; returns its folder."""
    import yaml

    from llmfleet.util.net import free_port
    from llmfleet.workers.train.data import prepare

    base = build_tiny(spec, root)
    final = base.parent / f"{base.name}-trained{steps}"
    if (final / ".complete").exists() and not force:
        return final
    if final.exists():
        shutil.rmtree(final)
    cfg = json.loads((base / "config.json").read_text())
    work = Path(tempfile.mkdtemp(prefix=f".train-{spec.name}-", dir=base.parent))
    try:
        prepare([str(p) for p in stdlib_files()[:CORPUS_FILES]], work / "data", tokenizer=str(base / "tokenizer.json"))
        job = training_job(spec, int(cfg["vocab_size"]), work / "data", base, work, steps, free_port())
        (work / "job.yaml").write_text(yaml.safe_dump({"spec": job}))
        with open(work / "train.log", "wb") as log:
            done = subprocess.run([sys.executable, "-m", "llmfleet.workers.train", "--spec", str(work / "job.yaml")],
                                  stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        if done.returncode != 0:
            tail = (work / "train.log").read_text(errors="replace").splitlines()[-10:]
            raise RuntimeError(f"training {spec.name} failed (exit {done.returncode}):\n" + "\n".join(tail))
        out = work / "out"
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-trained-", dir=base.parent))
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            shutil.copy(base / f, tmp / f)
        shutil.copy(out / "model.safetensors", tmp / "model.safetensors")
        trained_cfg = json.loads((out / "config.json").read_text())
        # The exporter guesses the eos token by name; the tiny tokenizer's ids are the truth.
        trained_cfg.update(bos_token_id=cfg["bos_token_id"], eos_token_id=cfg["eos_token_id"])
        (tmp / "config.json").write_text(json.dumps(trained_cfg, indent=2))
        meta = json.loads((base / "llmfleet-tiny.json").read_text()) | {"weights": f"trained {steps} steps"}
        (tmp / "llmfleet-tiny.json").write_text(json.dumps(meta, indent=2))
        shutil.copy(work / "train.log", tmp / "train.log")
        (tmp / ".complete").write_text("ok\n")
        _publish(tmp, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final
