"""The CUDA path (NCCL, bf16, torch.compile, async DCP save, resume, export) on a tiny model.

Skipped without a GPU (CI); run on the device machine with
`python -m pytest -q tests/integration/train/test_train_cuda.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _run(spec: dict, tmp: Path, nproc: int, env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "llmfleet.workers.train", "--spec", str(path)]
    full = dict(os.environ, LLMFLEET_METRICS_PORT="0", NCCL_NVLS_ENABLE="0", **(env or {}))
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=400)


def _ramp_data(tmp_path: Path) -> Path:
    """A repeating ramp of 1000 tokens: learnable (the loss must fall), unlike uniform random tokens."""
    data = tmp_path / "data"
    data.mkdir()
    np.tile(np.arange(1000, dtype=np.uint16), 200).tofile(data / "shard-00000.bin")
    (data / "manifest.json").write_text(json.dumps({"dtype": "uint16", "vocab": 1024, "eos": 1023, "tokens": 200_000,
                                                    "shards": [{"file": "shard-00000.bin", "tokens": 200_000}]}))
    return data


def test_cuda_compile_async_checkpoint_resume_and_export(tmp_path: Path) -> None:
    nproc = min(2, torch.cuda.device_count())
    data = _ramp_data(tmp_path)
    spec = {
        "model": {"layers": 4, "hidden": 256, "heads": 8, "kvHeads": 2, "vocab": 1024, "seqLen": 256,
                  "slidingWindow": 128},
        "data": {"path": str(data)},
        "optimization": {"globalBatchTokens": 256 * 4 * nproc, "microBatch": 2, "steps": 12, "precision": "bf16",
                         "compile": True, "activationCheckpointing": "selective", "deterministic": True,
                         "lr": {"peak": 3e-3, "warmupSteps": 2}},
        "workers": {"count": 1, "gpusPerWorker": nproc},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), "interval": 4, "asyncSave": True},
        "metrics": {"logEvery": 1},
        "profiling": {"startStep": 9, "steps": 1},
        "output": {"path": str(tmp_path / "model")},
    }
    killed = _run(spec, tmp_path, nproc, {"LLMFLEET_FAIL_AT_STEP": "6"})
    assert killed.returncode != 0
    resumed = _run(spec, tmp_path, nproc)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr
    status = json.loads((tmp_path / "ckpt" / "status.json").read_text())
    assert status["done"] and status["step"] == 12 and status["mfu"] is not None and status["mfu"] > 0
    entries = [json.loads(x) for x in (tmp_path / "ckpt" / "train_log.jsonl").read_text().splitlines()]
    first = {e["step"]: e["loss"] for e in entries[:6]}
    redo = {e["step"]: e["loss"] for e in entries[6:]}
    for step in (5, 6):  # the steps the resumed run repeated from the step-4 checkpoint
        assert redo[step] == pytest.approx(first[step], rel=2e-2)
    assert redo[12] < first[1] - 0.5
    from llmfleet.workers.train.analyze import analyze_trace

    s = analyze_trace(tmp_path / "ckpt" / "traces" / "trace-rank0.json")
    assert s.device == "gpu" and s.kernels > 0
    print("TRACE", s.diagnosis)
    from llmfleet.workers.train.export import load_hf

    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    assert cfg["architectures"] == ["MistralForCausalLM"] and cfg["sliding_window"] == 128
    model = load_hf(tmp_path / "model")
    assert model(torch.randint(0, 1000, (1, 32))).shape == (1, 32, 1024)


def test_cuda_fp8_with_auto_micro_batch(tmp_path: Path) -> None:
    """precision fp8 (torchao float8 linears; float8 all-gather with 2 GPUs) and microBatch auto: the probe
    picks the whole per-rank batch for a tiny model, the loss falls, and the export is a plain bf16 model."""
    pytest.importorskip("torchao.float8")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs fp8 tensor cores")
    nproc = min(2, torch.cuda.device_count())
    data = _ramp_data(tmp_path)
    spec = {
        "model": {"layers": 2, "hidden": 256, "heads": 8, "kvHeads": 2, "vocab": 1024, "seqLen": 256},
        "data": {"path": str(data)},
        "optimization": {"globalBatchTokens": 256 * 8 * nproc, "microBatch": "auto", "steps": 12,
                         "precision": "fp8", "compile": True, "lr": {"peak": 3e-3, "warmupSteps": 2}},
        "workers": {"count": 1, "gpusPerWorker": nproc},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), "interval": 6, "asyncSave": False},
        "metrics": {"logEvery": 3},
        "output": {"path": str(tmp_path / "model")},
    }
    run = _run(spec, tmp_path, nproc)
    assert run.returncode == 0, run.stderr[-4000:]
    status = json.loads((tmp_path / "ckpt" / "status.json").read_text())
    assert status["done"] and status["precision"] == "fp8"
    assert (status["microBatch"], status["gradAccumulation"]) == (8, 1), status.get("microBatchReason")
    entries = [json.loads(x) for x in (tmp_path / "ckpt" / "train_log.jsonl").read_text().splitlines()]
    assert entries[-1]["loss"] < entries[0]["loss"] - 0.5
    from llmfleet.workers.train.export import load_hf

    model = load_hf(tmp_path / "model")
    assert model(torch.randint(0, 1000, (1, 32))).shape == (1, 32, 1024)
