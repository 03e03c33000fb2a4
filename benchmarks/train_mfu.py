"""MFU of the llmfleet FSDP2 training worker vs a plain-PyTorch torch.compile loop (issue 4 / issue 11).

    python benchmarks/train_mfu.py --cases plain-1,llmfleet-1 [--steps 30] [--json benchmarks/results/train_mfu.json]

Each case runs in its own process group (torchrun for the llmfleet worker) on synthetic uniform tokens, times
optimizer steps after a warm-up (compilation) window, and reports tokens/s, tokens/s per GPU, MFU/HFU (PaLM
appendix B against the GPU's dense bf16 peak, 989 TFLOP/s for H200), peak memory, and for profiled cases the
trace analyzer's summary of one step. Results are merged by case name into the JSON file, so a one-GPU call
and a two-GPU call of the device tool make one table; scaling efficiency = tokens/s/GPU of an N-GPU case over
the one-GPU llmfleet case of the same config. NCCL_NVLS_ENABLE=0 is always set.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    # ~0.9B reference config of issue 4.
    "0.9b": dict(layers=16, hidden=2048, heads=16, kvHeads=8, ffn=5632, vocab=32768, seqLen=4096),
    # Llama-3-8B shape of issue 11.
    "8b": dict(layers=32, hidden=4096, heads=32, kvHeads=8, ffn=14336, vocab=128256, seqLen=8192, ropeTheta=500000.0),
    # CPU smoke test of this script.
    "tiny": dict(layers=2, hidden=64, heads=4, kvHeads=2, ffn=128, vocab=512, seqLen=64),
}

CASES = {
    "plain-1": dict(mode="plain", nproc=1, config="0.9b", mb=4),
    "llmfleet-1": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4, profile=True),
    "llmfleet-1-accum2": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4, accum=2),
    "plain-1-accum2": dict(mode="plain", nproc=1, config="0.9b", mb=4, accum=2),
    "llmfleet-1-maxautotune": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4,
                                   env={"LLMFLEET_COMPILE_MODE": "max-autotune-no-cudagraphs"}),
    "llmfleet-1-eager": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4, compile=False),
    "llmfleet-2-fsdp": dict(mode="llmfleet", nproc=2, config="0.9b", mb=4, profile=True),
    "llmfleet-2-hsdp2x1": dict(mode="llmfleet", nproc=2, config="0.9b", mb=4, replicate=2),
    "llmfleet-2-fsdp-8b": dict(mode="llmfleet", nproc=2, config="8b", mb=1, ac="selective", profile=True),
    "llmfleet-2-fsdp-8b-noac": dict(mode="llmfleet", nproc=2, config="8b", mb=1),
    "tiny-plain-cpu": dict(mode="plain", nproc=1, config="tiny", mb=2, device="cpu"),
    "tiny-cpu-2": dict(mode="llmfleet", nproc=2, config="tiny", mb=2, device="cpu", profile=True),
}


def _spec(case: dict, data: str, ckpt: str, steps: int, log_every: int) -> dict:
    shape = CONFIGS[case["config"]]
    world, mb, accum = case["nproc"], case["mb"], case.get("accum", 1)
    cpu = case.get("device") == "cpu"
    spec = {
        "model": shape, "data": {"path": data},
        "optimization": {
            "globalBatchTokens": mb * shape["seqLen"] * world * accum, "microBatch": mb, "steps": steps,
            "precision": "bf16", "compile": case.get("compile", not cpu),
            "activationCheckpointing": case.get("ac", "none"), "lr": {"peak": 3e-4, "warmupSteps": 5},
        },
        "fsdp": {"replicateGroups": case.get("replicate", 1), "reshardAfterForward": case.get("raf", True)},
        "workers": {"count": world if cpu else 1, "gpusPerWorker": 0 if cpu else world},
        "checkpoint": {"uri": ckpt, "asyncSave": False},
        "metrics": {"logEvery": log_every},
    }
    if case.get("profile"):
        spec["profiling"] = {"startStep": steps - 1, "steps": 1, "path": str(Path(ckpt) / "traces")}
    return spec


def _window_times(history: list[dict], warmup: int, exclude_from: int | None) -> list[float]:
    """Per-step time of each logging window after warm-up and before the profiled step."""
    return [h["stepTime"] for h in history if h["step"] > warmup and (exclude_from is None or h["step"] < exclude_from)]


# ---------------------------------------------------------------------------------------------- workers
def run_llmfleet(case: dict, spec_dict: dict, warmup: int) -> dict | None:
    from llmfleet.api.trainingjob import TrainingJobSpec
    from llmfleet.workers.train.trainer import Trainer

    spec = TrainingJobSpec.model_validate(spec_dict)
    trainer = Trainer(spec)
    try:
        t0 = time.perf_counter()
        history = trainer.train(save_checkpoints=False)
        wall = time.perf_counter() - t0
        rank = trainer.rank
    finally:
        trainer.close(done=True)
    if rank != 0:
        return None
    prof_from = spec.profiling.start_step if spec.profiling else None
    # history has one entry per step; entries of one window share its stepTime: keep one per window.
    last_of_window = [h for h in history if h["step"] % spec.metrics.log_every == 0]
    times = _window_times(last_of_window, warmup, prof_from + 1 if prof_from is not None else None)
    return {"stepTimes": times, "wallSeconds": wall, "memoryPeakBytes": history[-1]["memoryPeakBytes"],
            "lossFirst": history[0]["loss"], "lossLast": history[-1]["loss"]}


def run_plain(case: dict, spec_dict: dict, warmup: int) -> dict:
    """The plain loop: one process, fp32 master weights, bf16 autocast, torch.compile of the whole model,
    fused AdamW. The same model file, so the only difference is the training harness."""
    import torch

    from llmfleet.api.trainingjob import ModelShape
    from llmfleet.workers.train.data import TokenData
    from llmfleet.workers.train.model import ModelArgs, Transformer

    cuda = torch.cuda.is_available() and case.get("device") != "cpu"
    dev = torch.device("cuda" if cuda else "cpu")
    args = ModelArgs.from_shape(ModelShape.model_validate(spec_dict["model"]))
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=dev)
    model.init_weights(0)
    cmodel = torch.compile(model) if spec_dict["optimization"]["compile"] else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    data = TokenData.open(spec_dict["data"]["path"], args.seq_len, 0)
    mb, steps, log_every, accum = case["mb"], spec_dict["optimization"]["steps"], 5, case.get("accum", 1)
    times, mem, first, loss = [], 0.0, None, None
    t = time.perf_counter()
    for step in range(steps):
        for micro in range(accum):
            x, y = data.batch(step, micro, micro_batch=mb, accum=accum, rank=0, world=1)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = cmodel(x, y)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if first is None:
            first = float(loss)
        if (step + 1) % log_every == 0:
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            if step + 1 > warmup:
                times.append((now - t) / log_every)
            t = now
    if cuda:
        mem = float(torch.cuda.max_memory_allocated())
    return {"stepTimes": times, "memoryPeakBytes": mem, "lossFirst": first, "lossLast": float(loss or 0)}


def worker_main(ns: argparse.Namespace) -> None:
    case = json.loads(ns.case)
    spec_dict = json.loads(ns.spec)
    out = run_plain(case, spec_dict, ns.warmup) if case["mode"] == "plain" else run_llmfleet(case, spec_dict, ns.warmup)
    if out is not None:
        Path(ns.result).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------- driver
def _synthetic_data(folder: Path, vocab: int, tokens: int) -> None:
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    np.random.default_rng(0).integers(0, vocab, tokens, dtype=np.int64).astype(dtype).tofile(folder / "shard-00000.bin")
    (folder / "manifest.json").write_text(json.dumps({"dtype": np.dtype(dtype).name, "vocab": vocab, "eos": vocab - 1,
                                                      "tokenizer": None, "tokens": tokens,
                                                      "shards": [{"file": "shard-00000.bin", "tokens": tokens}]}))


def _machine() -> dict:
    info = {"host": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["cuda"] = torch.version.cuda
    except ImportError:
        pass
    return info


def run_case(name: str, case: dict, steps: int, warmup: int, work: Path, timeout: int) -> dict:
    from llmfleet.api.trainingjob import ModelShape
    from llmfleet.plan.models import total_params
    from llmfleet.plan.training import hardware_flops_per_token, model_flops_per_token
    from llmfleet.workers.train.analyze import analyze_trace
    from llmfleet.workers.train.metrics import peak_tflops, utilization

    shape = CONFIGS[case["config"]]
    data = work / f"data-{case['config']}"
    if not data.exists():
        _synthetic_data(data, shape["vocab"], 64 * (shape["seqLen"] + 1) * 8)
    ckpt = work / f"ckpt-{name}"
    shutil.rmtree(ckpt, ignore_errors=True)
    spec = _spec(case, str(data), str(ckpt), steps, log_every=5)
    result_file = work / f"result-{name}.json"
    result_file.unlink(missing_ok=True)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               LLMFLEET_METRICS_PORT="-1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(case.get("env", {}))
    if case.get("device") == "cpu":
        env["LLMFLEET_DEVICE"] = "cpu"
    elif case["nproc"] == 1:
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    me = [str(Path(__file__).resolve()), "--worker", "--case", json.dumps(case), "--spec", json.dumps(spec),
          "--result", str(result_file), "--warmup", str(warmup)]
    if case["mode"] == "plain":
        cmd = [sys.executable, *me]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={case['nproc']}", *me]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    row: dict = {"case": name, **case, "seconds": round(time.perf_counter() - t0, 1),
                 "command": " ".join(cmd[:4] if case["mode"] != "plain" else cmd[:2]) + " ..."}
    if proc.returncode != 0 or not result_file.exists():
        row["error"] = (proc.stderr or proc.stdout)[-1500:]
        return row
    res = json.loads(result_file.read_text())
    model = ModelShape.model_validate(shape)
    tokens = case["mb"] * shape["seqLen"] * case["nproc"] * case.get("accum", 1)
    step = statistics.median(res["stepTimes"]) if res["stepTimes"] else float("nan")
    gpu_name = (_machine().get("gpus") or [None])[0] if case.get("device") != "cpu" else None
    peak = peak_tflops(gpu_name)
    tps = tokens / step
    row.update(
        params=total_params(model), stepSeconds=step, stepSecondsAll=res["stepTimes"], tokensPerSecond=tps,
        tokensPerSecondPerGpu=tps / case["nproc"], peakTflops=peak,
        mfu=utilization(model_flops_per_token(model), tps / case["nproc"], peak),
        hfu=utilization(hardware_flops_per_token(model, activation_checkpointing=case.get("ac", "none")),
                        tps / case["nproc"], peak),
        memoryPeakGiB=res["memoryPeakBytes"] / 2**30, lossFirst=res["lossFirst"], lossLast=res["lossLast"],
    )
    trace = ckpt / "traces" / "trace-rank0.json"
    if trace.exists():
        s = analyze_trace(trace)
        row["trace"] = s.to_dict()
        out = os.environ.get("OUT")
        if out:
            with open(trace, "rb") as src, gzip.open(Path(out) / f"trace-{name}.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
    return row


def baselines(rows: list[dict]) -> dict[str, dict]:
    """The one-GPU llmfleet run with default settings per (config, session): the denominator of scaling
    efficiency, taken on the same machine as the multi-GPU run it divides."""
    return {(r["config"], r.get("session")): r for r in rows
            if r.get("mode") == "llmfleet" and r["nproc"] == 1 and "error" not in r and r.get("accum", 1) == 1
            and r.get("compile", True) and r.get("raf", True) and not r.get("env")}


def _pct(v: float | None) -> str:
    return f"{v:6.1%}" if v is not None else "   n/a"


def print_table(rows: list[dict]) -> None:
    base = baselines(rows)
    hdr = f"{'session':8} {'case':24} {'GPUs':>4} {'mesh':>7} {'step s':>7} {'tok/s':>9} {'tok/s/GPU':>9} {'MFU':>6} {'HFU':>6} " \
          f"{'mem GiB':>7} {'scaling':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r.get("superseded"):
            continue
        if "error" in r:
            print(f"{str(r.get('session')):8} {r['case']:24} {r['nproc']:>4}  FAILED: {r['error'].strip().splitlines()[-1][:80]}")
            continue
        mesh = f"{r.get('replicate', 1)}x{r['nproc'] // r.get('replicate', 1)}" if r["mode"] == "llmfleet" else "-"
        b = base.get((r["config"], r.get("session")))
        scale = r["tokensPerSecondPerGpu"] / b["tokensPerSecondPerGpu"] if b and r["nproc"] > 1 else None
        pct = _pct
        print(f"{str(r.get('session')):8} {r['case']:24} {r['nproc']:>4} {mesh:>7} {r['stepSeconds']:7.3f} {r['tokensPerSecond']:9.0f} "
              f"{r['tokensPerSecondPerGpu']:9.0f} {pct(r['mfu'])} {pct(r['hfu'])} {r['memoryPeakGiB']:7.1f} "
              f"{(f'{scale:7.1%}' if scale else '      -')}")
    for r in rows:
        if "trace" in r:
            t = r["trace"]
            print(f"trace {r['case']}: compute {t['shares']['compute']:.0%}, NCCL {t['shares']['comm']:.0%} "
                  f"(exposed {t['shares']['commExposed']:.0%}), idle {t['shares']['idle']:.0%}; {t['diagnosis']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="plain-1,llmfleet-1", help=f"comma-separated, from {sorted(CASES)}")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10, help="steps excluded from timing (compilation)")
    p.add_argument("--json", default=str(ROOT / "benchmarks/results/train_mfu.json"))
    p.add_argument("--session", default=datetime.now(UTC).strftime("%Y%m%dT%H%M"),
                   help="label of this machine/run; scaling efficiency divides by the 1-GPU run of the same session")
    p.add_argument("--timeout", type=int, default=400, help="seconds per case")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.worker:
        worker_main(ns)
        return
    names = [c for c in ns.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        sys.exit(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    path = Path(ns.json)
    doc = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    work = Path(tempfile.mkdtemp(prefix="train_mfu-"))
    rows = []
    for name in names:
        row = run_case(name, CASES[name], ns.steps, ns.warmup, work, ns.timeout)
        row["machine"] = _machine()
        row["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        row["invocation"] = "python benchmarks/train_mfu.py " + " ".join(sys.argv[1:])
        row["session"] = ns.session
        rows.append(row)
        doc["runs"][name] = row
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2))
        print(f"[{name}] done in {row['seconds']}s" + (" (FAILED)" if "error" in row else ""), flush=True)
        if "error" in row:
            print(row["error"][-1200:], flush=True)
    doc["torchtitan"] = doc.get("torchtitan") or (
        "not run: torchtitan 0.3.0 (PyPI) needs spmd_types, torch_checkpointing, torchdata, datasets and its own "
        "config system; not carried to the device machine in this session")
    path.write_text(json.dumps(doc, indent=2))
    print_table(list(doc["runs"].values()))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
