"""MFU of the llmfleet FSDP2 training worker vs a plain-PyTorch torch.compile loop and torchtitan, bf16 and fp8.

    python benchmarks/train_mfu.py --cases plain-bf16,llmfleet-bf16,llmfleet-fp8,torchtitan-bf16,torchtitan-fp8
    python benchmarks/train_mfu.py --cases conv-bf16,conv-fp8 --corpus DIR    # 300 steps on stdlib source
    python benchmarks/train_mfu.py --plot docs/img/train_convergence.png      # loss curves from the JSON

Each case runs in its own process group (torchrun for the llmfleet worker and torchtitan) on synthetic uniform
tokens (or, for conv-* cases, a BPE-tokenized corpus of the Python standard library's source built on the
machine), times optimizer steps after a warm-up (compilation) window, and reports tokens/s, tokens/s per GPU,
MFU/HFU (PaLM appendix B against the GPU's dense bf16 peak, 989 TFLOP/s for H200; fp8 runs are measured
against the same bf16 peak, so their MFU says how much faster than bf16 they go), the causal convention's MFU
beside it, peak memory, and for profiled cases the trace analyzer's summary of one step. Results are merged by
case name into the JSON file; scaling efficiency = tokens/s/GPU of an N-GPU case over the one-GPU llmfleet case
of the same config and session. `--smoke` runs the chosen cases on a small model for a few steps (a check of
the wiring, results to a separate JSON). NCCL_NVLS_ENABLE=0 is always set.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
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

from train_mfu_report import plot, print_table, targets  # noqa: E402

CONFIGS = {
    # ~0.9B reference config.
    "0.9b": dict(layers=16, hidden=2048, heads=16, kvHeads=8, ffn=5632, vocab=32768, seqLen=4096),
    # Llama-3-8B shape.
    "8b": dict(layers=32, hidden=4096, heads=32, kvHeads=8, ffn=14336, vocab=128256, seqLen=8192, ropeTheta=500000.0),
    # CPU smoke test of this script.
    "tiny": dict(layers=2, hidden=64, heads=4, kvHeads=2, ffn=128, vocab=512, seqLen=64),
    # GPU smoke test (--smoke): every case's code path in seconds; dims multiples of 16 for fp8.
    "smoke": dict(layers=2, hidden=256, heads=4, kvHeads=2, ffn=768, vocab=2048, seqLen=512),
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
    # One GPU, 8 sequences x 4096 tokens per optimizer step (32,768 tokens) in every case.
    "plain-bf16": dict(mode="plain", nproc=1, config="0.9b", mb=4, accum=2),
    "plain-bf16-mb8": dict(mode="plain", nproc=1, config="0.9b", mb=8),
    "llmfleet-bf16": dict(mode="llmfleet", nproc=1, config="0.9b", mb="auto", seqs=8),
    "llmfleet-fp8": dict(mode="llmfleet", nproc=1, config="0.9b", mb="auto", seqs=8, precision="fp8", profile=True),
    "torchtitan-bf16": dict(mode="torchtitan", nproc=1, config="0.9b", mb=8),
    "torchtitan-fp8": dict(mode="torchtitan", nproc=1, config="0.9b", mb=8, precision="fp8"),
    # What each part of the lean step buys (same 8-sequence step).
    "llmfleet-bf16-mb4": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4, accum=2),
    "llmfleet-bf16-mb4-noclipfold": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4, accum=2,
                                         env={"LLMFLEET_CLIP_IN_OPTIMIZER": "0"}),
    "llmfleet-fp8-rowwise": dict(mode="llmfleet", nproc=1, config="0.9b", mb="auto", seqs=8, precision="fp8",
                                 scaling="rowwise"),
    # Convergence on real text: 300 steps of 4 x 4096 tokens, same seed and data order.
    "conv-bf16": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4, steps=300, corpus=True),
    "conv-fp8": dict(mode="llmfleet", nproc=1, config="0.9b", mb=4, steps=300, corpus=True, precision="fp8"),
    # Micro-batch 8 fixed (no probe): what the bf16 residual stream buys on one GPU.
    "llmfleet-fp8-mb8": dict(mode="llmfleet", nproc=1, config="0.9b", mb=8, precision="fp8"),
    "llmfleet-fp8-mb8-fp32residual": dict(mode="llmfleet", nproc=1, config="0.9b", mb=8, precision="fp8",
                                          env={"LLMFLEET_RESIDUAL_BF16": "0"}),
    "llmfleet-bf16-mb8": dict(mode="llmfleet", nproc=1, config="0.9b", mb=8),
    "llmfleet-bf16-mb8-fp32residual": dict(mode="llmfleet", nproc=1, config="0.9b", mb=8,
                                           env={"LLMFLEET_RESIDUAL_BF16": "0"}),
    "tiny-plain-cpu": dict(mode="plain", nproc=1, config="tiny", mb=2, device="cpu"),
    "tiny-cpu-2": dict(mode="llmfleet", nproc=2, config="tiny", mb=2, device="cpu", profile=True),
}


def sequences_per_rank(case: dict) -> int:
    """Sequences per rank per optimizer step (micro-batch x accumulation, or the case's `seqs` for auto)."""
    return int(case.get("seqs") or case["mb"] * case.get("accum", 1))


def _spec(case: dict, data: str, ckpt: str, steps: int, log_every: int) -> dict:
    shape = CONFIGS[case["config"]]
    world = case["nproc"]
    cpu = case.get("device") == "cpu"
    warm = 30 if case.get("corpus") else 5
    spec = {
        "model": shape, "data": {"path": data},
        "optimization": {
            "globalBatchTokens": sequences_per_rank(case) * shape["seqLen"] * world, "microBatch": case["mb"],
            "steps": steps, "precision": case.get("precision", "bf16"),
            "float8": {"scaling": case.get("scaling", "tensorwise")}, "compile": case.get("compile", not cpu),
            "activationCheckpointing": case.get("ac", "none"), "lr": {"peak": 3e-4, "warmupSteps": warm},
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
            "lossFirst": history[0]["loss"], "lossLast": history[-1]["loss"], "losses": [h["loss"] for h in history],
            "microBatch": trainer.micro_batch, "gradAccumulation": trainer.accum,
            "microBatchReason": trainer.status.get("microBatchReason")}


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


TT_LINE = re.compile(r"step:\s*(\d+).*?loss:\s*([\d.]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+)%")


def torchtitan_command(case: dict, steps: int, log_every: int) -> list[str]:
    """torchtitan's own trainer (its llama3 + parallelize_llama + AdamW + loss) on the llmfleet shape."""
    shape = CONFIGS[case["config"]]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={case['nproc']}",
           "-m", "torchtitan.train", "--experimental.custom_import", "benchmarks.torchtitan_llmfleet",
           "--model.name", "llmfleet_llama3", "--model.flavor", "ref",
           "--training.local_batch_size", str(case["mb"]), "--training.seq_len", str(shape["seqLen"]),
           "--training.steps", str(steps), "--training.max_norm", "1.0", "--optimizer.lr", "3e-4",
           "--lr_scheduler.warmup_steps", "5", "--metrics.log_freq", str(log_every), "--checkpoint.no-enable",
           "--activation_checkpoint.mode", "none", "--compile.enable", "--compile.components", "model,loss"]
    if case.get("precision") == "fp8":
        # Like llmfleet: the blocks' linears in float8 (tensorwise), the output projection left in bf16.
        cmd += ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.filter_fqns", "output"]
    return cmd


def parse_torchtitan(log: str, warmup: int, tokens_per_step: int) -> dict:
    """Step times from torchtitan's metric lines (tps = tokens/s per device over each logging window)."""
    rows = [(int(m[1]), float(m[2]), float(m[3]), float(m[4].replace(",", "")), float(m[5]))
            for m in TT_LINE.finditer(re.sub(r"\x1b\[[0-9;]*m", "", log))]
    if not rows:
        raise RuntimeError("no metric lines in torchtitan's output")
    timed = [r for r in rows if r[0] > warmup]
    return {"stepTimes": [tokens_per_step / r[3] for r in timed], "memoryPeakBytes": max(r[2] for r in rows) * 2**30,
            "lossFirst": rows[0][1], "lossLast": rows[-1][1], "torchtitanMfu": [r[4] / 100 for r in timed]}


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


def run_case(name: str, case: dict, steps: int, warmup: int, work: Path, timeout: int, corpus: Path | None) -> dict:
    from llmfleet.api.trainingjob import ModelShape
    from llmfleet.plan.models import total_params
    from llmfleet.plan.training import causal_flops_per_token, hardware_flops_per_token, model_flops_per_token
    from llmfleet.workers.train.analyze import analyze_trace, format_summary
    from llmfleet.workers.train.metrics import peak_tflops, utilization

    shape = CONFIGS[case["config"]]
    steps = case.get("steps", steps)
    if case.get("corpus"):
        if corpus is None or not (corpus / "manifest.json").exists():
            return {"case": name, **case, "error": "conv cases need --corpus DIR (built with --build-corpus DIR)"}
        data = corpus
    else:
        data = work / f"data-{case['config']}"
        if not data.exists():
            _synthetic_data(data, shape["vocab"], 64 * (shape["seqLen"] + 1) * 8)
    ckpt = work / f"ckpt-{name}"
    shutil.rmtree(ckpt, ignore_errors=True)
    log_every = 5
    spec = _spec(case, str(data), str(ckpt), steps, log_every)
    result_file = work / f"result-{name}.json"
    result_file.unlink(missing_ok=True)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               LLMFLEET_METRICS_PORT="-1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LLMFLEET_TT_DATA=str(data), LLMFLEET_TT_SHAPE=json.dumps(shape))
    env.update(case.get("env", {}))
    if case.get("device") == "cpu":
        env["LLMFLEET_DEVICE"] = "cpu"
    elif case["nproc"] == 1:
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    me = [str(Path(__file__).resolve()), "--worker", "--case", json.dumps(case), "--spec", json.dumps(spec),
          "--result", str(result_file), "--warmup", str(warmup)]
    if case["mode"] == "plain":
        cmd = [sys.executable, *me]
    elif case["mode"] == "torchtitan":
        cmd = torchtitan_command(case, steps, log_every)
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={case['nproc']}", *me]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"case": name, **case, "error": f"timed out after {timeout}s"}
    row: dict = {"case": name, **case, "seconds": round(time.perf_counter() - t0, 1),
                 "command": " ".join(cmd[:4] if case["mode"] == "llmfleet" else cmd[:2]) + " ..."}
    if case["mode"] == "torchtitan":
        row["command"] = " ".join(cmd[2:])
    tokens = sequences_per_rank(case) * shape["seqLen"] * case["nproc"]
    try:
        if case["mode"] == "torchtitan":
            if proc.returncode != 0:
                raise RuntimeError(f"exit {proc.returncode}")
            res = parse_torchtitan(proc.stdout + proc.stderr, warmup, tokens // case["nproc"])
        else:
            res = json.loads(result_file.read_text())
    except (OSError, ValueError, RuntimeError) as err:
        row["error"] = f"{err}: " + (proc.stderr or proc.stdout)[-2500:]
        return row
    m = ModelShape.model_validate(shape)
    step = statistics.median(res["stepTimes"]) if res["stepTimes"] else float("nan")
    gpu_name = (_machine().get("gpus") or [None])[0] if case.get("device") != "cpu" else None
    peak = peak_tflops(gpu_name)
    tps = tokens / step
    per_gpu = tps / case["nproc"]

    row.update(
        params=total_params(m), stepSeconds=step, stepSecondsAll=res["stepTimes"], tokensPerSecond=tps,
        tokensPerSecondPerGpu=per_gpu, peakTflops=peak, mfu=utilization(model_flops_per_token(m), per_gpu, peak),
        mfuCausal=utilization(causal_flops_per_token(m), per_gpu, peak),
        hfu=utilization(hardware_flops_per_token(m, activation_checkpointing=case.get("ac", "none")), per_gpu, peak),
        memoryPeakGiB=res["memoryPeakBytes"] / 2**30,
        **{k: res[k] for k in ("lossFirst", "lossLast", "losses", "microBatch", "gradAccumulation",
                               "microBatchReason", "torchtitanMfu") if k in res},
    )
    trace = ckpt / "traces" / "trace-rank0.json"
    if trace.exists():
        s = analyze_trace(trace)
        row["trace"] = s.to_dict()
        row["traceText"] = format_summary(s)  # what `llmfleet analyze trace` prints
        out = os.environ.get("OUT")
        if out:
            with open(trace, "rb") as src, gzip.open(Path(out) / f"trace-{name}.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
    return row


def build_corpus(out: Path) -> dict:
    """All of this Python's standard-library .py files, BPE-tokenized (vocabulary 32,768) by `data prepare`."""
    import sysconfig

    from llmfleet.workers.train.data import prepare

    def utf8(q: Path) -> bool:  # a few test files are deliberately not UTF-8
        try:
            q.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return False
        return True

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(q) for q in root.rglob("*.py") if "site-packages" not in q.parts and utf8(q))
    manifest = prepare(files, out, tokenizer="bpe", vocab_size=32768)
    return {"python": platform.python_version(), "files": len(files), "tokens": manifest["tokens"],
            "vocab": manifest["vocab"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="plain-bf16,llmfleet-bf16", help=f"comma-separated, from {sorted(CASES)}")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10, help="steps excluded from timing (compilation)")
    p.add_argument("--json", default=str(ROOT / "benchmarks/results/train_mfu.json"))
    p.add_argument("--session", default=datetime.now(UTC).strftime("%Y%m%dT%H%M"),
                   help="label of this machine/run; scaling efficiency divides by the 1-GPU run of the same session")
    p.add_argument("--timeout", type=int, default=400, help="seconds per case")
    p.add_argument("--corpus", type=Path, help="token folder for the conv-* cases (see --build-corpus)")
    p.add_argument("--build-corpus", type=Path, help="tokenize this Python's stdlib source into DIR and exit")
    p.add_argument("--smoke", action="store_true", help="small model, few steps: check every case's code path")
    p.add_argument("--plot", type=Path, help="write the conv-bf16/conv-fp8 loss curves from --json to this PNG")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.worker:
        worker_main(ns)
        return
    path = Path(ns.json)
    doc = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    if ns.build_corpus:
        print(json.dumps(build_corpus(ns.build_corpus)))
        return
    if ns.plot:
        plot(doc, ns.plot)
        return
    names = [c for c in ns.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        sys.exit(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    work = Path(tempfile.mkdtemp(prefix="train_mfu-"))
    rows = []
    for name in names:
        case = dict(CASES[name])
        if ns.smoke:
            case.update(config="smoke", corpus=False, steps=min(case.get("steps", ns.steps), ns.steps))
        row = run_case(name, case, ns.steps, ns.warmup, work, ns.timeout, ns.corpus)
        row["machine"] = _machine()
        row["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        row["invocation"] = "python benchmarks/train_mfu.py " + " ".join(sys.argv[1:])
        row["session"] = ns.session
        if ns.corpus and case.get("corpus") and (ns.corpus / "manifest.json").exists():
            row["corpus"] = {k: v for k, v in json.loads((ns.corpus / "manifest.json").read_text()).items()
                             if k != "shards"}
        rows.append(row)
        doc["runs"][name] = row
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2))
        print(f"[{name}] done in {row.get('seconds')}s" + (" (FAILED)" if "error" in row else ""), flush=True)
        if "error" in row:
            print(row["error"][-2500:], flush=True)
    session_runs = {k: v for k, v in doc["runs"].items() if v.get("session") == ns.session}
    doc.setdefault("targets", {})[ns.session] = targets(session_runs)
    path.write_text(json.dumps(doc, indent=2))
    print_table(rows)
    print(json.dumps(doc["targets"][ns.session], indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
