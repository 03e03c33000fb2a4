"""CLI errors of `llmfleet train`, `llmfleet data prepare` and `llmfleet analyze trace`: one line, non-zero exit."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app

runner = CliRunner()


def test_train_rejects_an_invalid_spec_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    bad = tmp_path / "job.yaml"
    bad.write_text("model: {hidden: 100, heads: 3}\ndata: {path: /x}\n")
    result = runner.invoke(app, ["train", "-f", str(bad)])
    assert result.exit_code == 2
    assert "error:" in result.output and "divisible" in result.output
    assert not list(temp.iterdir())  # the resolved copy of the spec is gone with the refusal


def test_train_refuses_pvc_locations_off_kubernetes(tmp_path: Path) -> None:
    for spec in ("data: {path: pvc://datasets/tokens}\n",
                 "data: {path: /x}\noutput: {path: pvc://models/out}\n"):
        job = tmp_path / "job.yaml"
        job.write_text("model: {hidden: 64, heads: 4, seqLen: 64}\noptimization: {globalBatchTokens: 64}\n" + spec)
        result = runner.invoke(app, ["train", "-f", str(job)])
        assert result.exit_code == 2 and "claims exist only on Kubernetes" in result.output, result.output


def test_train_rejects_a_missing_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "-f", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "nope.yaml: No such file" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_data_prepare_bytes(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello world\n" * 20)
    result = runner.invoke(app, ["data", "prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["tokens"] == 12 * 20 + 1


def test_data_prepare_missing_input(tmp_path: Path) -> None:
    result = runner.invoke(app, ["data", "prepare", str(tmp_path / "none*.txt"), "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "no input files" in result.output


def test_analyze_trace_rejects_non_trace(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"traceEvents": []}))
    result = runner.invoke(app, ["analyze", "trace", str(f)])
    assert result.exit_code == 2 and "no complete" in result.output


def test_local_paths_resolve_tiny_models_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfleet.local.tinymodel import PRIMARY, build_tiny
    from llmfleet.local.train_cli import resolve_local_paths

    monkeypatch.chdir(tmp_path)
    doc = resolve_local_paths({"kind": "TrainingJob", "spec": {
        "data": {"path": "data", "tokenizer": "tiny://tiny-llama"},
        "distillation": {"teacher": "tiny://tiny-llama"}, "checkpoint": {"uri": "s3://bucket/ckpt"},
        "output": {"path": "./out"}}})
    spec = doc["spec"]
    assert spec["data"]["path"] == str(tmp_path / "data") and spec["output"]["path"] == str(tmp_path / "out")
    assert spec["data"]["tokenizer"] == spec["distillation"]["teacher"] == str(build_tiny(PRIMARY))
    assert spec["checkpoint"]["uri"] == "s3://bucket/ckpt"  # URIs are left alone


def test_train_rejects_an_unknown_tiny_model(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: {hidden: 128, heads: 4}\ndata: {path: /x}\ndistillation: {teacher: 'tiny://nope'}\n")
    result = runner.invoke(app, ["train", "-f", str(job)])
    assert result.exit_code == 2 and "unknown tiny model 'tiny://nope'" in result.output


def test_train_claims_free_gpus_of_its_type_and_refuses_when_too_few(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmfleet train` on a GPU machine claims its GPUs machine-wide (as `llmfleet up` does) and shows torchrun
    only those; with too few free it stops with one line naming who holds them."""
    from llmfleet.local.gpus import LOCK_DIR_ENV, DeviceLocks, parse_nvidia_smi_list
    from llmfleet.local.train_cli import _claim_gpus

    listing = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
               "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000001)\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'END'\n{listing}END\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    gpu0, gpu1 = parse_nvidia_smi_list(listing)

    env = dict(os.environ)
    ledger = _claim_gpus("job", 1, "H100", env)
    assert ledger is not None and env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    other = DeviceLocks(tmp_path / "locks")
    assert not other.free(gpu0) and other.free(gpu1)  # held machine-wide until the run ends
    ledger.release_all()
    assert other.free(gpu0)

    assert other.acquire(gpu1)  # e.g. a `llmfleet up` replica
    job = tmp_path / "job.yaml"
    job.write_text("model: {hidden: 64, heads: 4, seqLen: 64}\noptimization: {globalBatchTokens: 128}\n"
                   "data: {path: /x}\nworkers: {count: 1, gpusPerWorker: 2, gpuType: H100}\n")
    result = runner.invoke(app, ["train", "-f", str(job)])
    assert result.exit_code == 2, result.output
    assert "2 whole H100 GPUs wanted, too few free" in result.output
    assert "claimed by other llmfleet processes: 1" in result.output
