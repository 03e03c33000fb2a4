"""`llmfleet train`: run a TrainingJob on this machine, and promote its model into a local `llmfleet up`.

The worker is the one the operator runs in the Job's pods (`python -m llmfleet.workers.train`, under
torchrun for several processes). On top of that, for the local default:

- `tiny://<name>` in `distillation.teacher` and `data.tokenizer` is resolved to the cached tiny model,
  and relative paths become absolute;
- the metrics endpoint takes any free port (`LLMFLEET_METRICS_PORT`, default 0) instead of `metrics.port`;
- on CPU without a known peak, MFU is computed against this CPU's fp32 matmul rate measured at start
  (`LLMFLEET_PEAK_TFLOPS` for the worker);
- with `--promote-to SERVICE/POOL`, when that InferenceService runs locally (`.run/<name>`, or `--run-dir`),
  the exported model (a local folder) is promoted through llmfleet.local.promote (the operator's promotion
  logic) and the command waits for the rollout's verdict. (`output.promoteTo` is the cluster's way: it
  needs a pvc:// or s3:// output that the serving pods can read.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from llmfleet.api.cli import positive_number

if TYPE_CHECKING:
    from llmfleet.api.trainingjob import TrainingJobSpec
    from llmfleet.local.gpus import DeviceLedger


def _fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(code)


def measure_cpu_peak_tflops(seconds: float = 0.5, n: int = 512) -> float:
    """fp32 matmul rate of this machine with torch's threads (TFLOP/s): MFU's denominator on CPU."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, b)
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - t0) / 1e12


def resolve_local_paths(doc: dict[str, Any]) -> dict[str, Any]:
    """A TrainingJob document with tiny:// resolved and relative local paths made absolute."""
    from llmfleet.local.tinymodel import tiny_path

    spec = doc.get("spec", doc)

    def local(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = tiny_path(value)
        return value if "://" in value else str(Path(value).expanduser().resolve())

    for section, key in (("data", "path"), ("data", "tokenizer"), ("distillation", "teacher"),
                         ("checkpoint", "uri"), ("output", "path")):
        part = spec.get(section)
        if isinstance(part, dict) and key in part:
            part[key] = local(part[key])
    return doc


def register_train(app: typer.Typer) -> None:
    @app.command("train", help="Run a TrainingJob on this machine (torchrun with one process per GPU, or gloo on "
                               "CPU); promote its model into a local `llmfleet up` when output.promoteTo says so.")
    def train(
        file: Path = typer.Option(..., "-f", "--file", help="TrainingJob manifest (or bare spec) YAML."),
        nproc: int | None = typer.Option(
            None, "--nproc", min=1, help="Processes; default gpusPerWorker (or workers.count on CPU)."
        ),
        run_dir: Path | None = typer.Option(None, "--run-dir", help="Run folder of the local InferenceService to "
                                                                    "promote into; .run/<promoteTo name> by default."),
        promote_timeout: float = typer.Option(600.0, "--promote-timeout", callback=positive_number,
                                               help="Seconds to wait for the rollout."),
        promote_to: str | None = typer.Option(
            None, "--promote-to", metavar="SERVICE/POOL",
            help="Promote the exported model (a local folder) into this pool of a local `llmfleet up`; the spec's "
                 "output.promoteTo needs a pvc:// or s3:// output, which only a cluster serves from."),
    ) -> None:
        import yaml

        from llmfleet.api.loader import load_yaml_file

        # Unreadable, undecodable, malformed or too deeply nested files raise InputFileError: the CLI root prints
        # it as one line with the file name and exits 2.
        doc = load_yaml_file(file)
        if not isinstance(doc, dict):
            raise _fail(f"{file}: not a YAML mapping")
        try:
            doc = resolve_local_paths(doc)
        except (OSError, ValueError) as err:
            raise _fail(str(err).splitlines()[0]) from None
        name = str((doc.get("metadata") or {}).get("name") or file.stem)
        # the resolved spec lives as long as the run needs it, and goes however the command ends (a refused spec too)
        with tempfile.TemporaryDirectory(prefix="llmfleet-train-") as tmp:
            resolved = Path(tmp) / file.name
            resolved.write_text(yaml.safe_dump(doc, sort_keys=False))
            spec, rc = _run_spec(resolved, name, nproc)
        if rc != 0:
            raise _fail(f"training exited with status {rc}")
        typer.echo(f"done; status in {Path(spec.checkpoint.uri) / 'status.json'}")
        if promote_to is None or spec.output is None:
            return
        service, _, pool = promote_to.partition("/")
        if not service or not pool or "://" in spec.output.path:
            raise _fail(f"--promote-to {promote_to!r}: give SERVICE/POOL, with output.path a local folder")
        if spec.method == "lora":  # an adapter, not a pool's model: `llmfleet up` applies spec.adapters edits live
            typer.echo(f"--promote-to: add the adapter {spec.output.path} to spec.adapters of {service}'s manifest "
                       "(`llmfleet up` applies adapter edits live)")
            return
        _promote_locally(name, spec.output.path, service, pool, run_dir, promote_timeout)


def _run_spec(resolved: Path, name: str, nproc: int | None) -> tuple[TrainingJobSpec, int]:
    """Validate the resolved spec file, fetch its remote inputs, claim GPUs and run job `name`'s workers: (spec,
    exit status)."""
    from pydantic import ValidationError

    from llmfleet.workers.train.__main__ import load_spec

    try:
        spec = load_spec(str(resolved))
    except (OSError, ValueError, ValidationError) as err:
        raise _fail(str(err).splitlines()[0]) from None
    from llmfleet.storage import FetchError
    from llmfleet.workers.train.cli import local_spec_file

    try:
        spec_file = local_spec_file(resolved, spec)  # s3:// and hf:// inputs fetched into the cache
    except FetchError as err:
        raise _fail(str(err)) from None
    n = nproc or (spec.workers.gpus_per_worker or spec.workers.count)
    cmd = [sys.executable, "-m", "llmfleet.workers.train", "--spec", str(spec_file)]
    if n > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
               "-m", "llmfleet.workers.train", "--spec", str(spec_file)]
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    # On a shared machine the spec's fixed metrics port may be taken: any free port (0) unless one is given.
    env.setdefault("LLMFLEET_METRICS_PORT", "0")
    if spec.workers.gpus_per_worker == 0 and not spec.metrics.peak_tflops and "LLMFLEET_PEAK_TFLOPS" not in env:
        peak = measure_cpu_peak_tflops()
        env["LLMFLEET_PEAK_TFLOPS"] = f"{peak:.6f}"
        typer.echo(f"MFU is against this CPU's measured fp32 matmul rate: {peak * 1e3:.1f} GFLOP/s")
    priority = spec.scheduling.priority
    gpus = _claim_gpus(name, n, spec.workers.gpu_type, env, priority=priority) if spec.workers.gpus_per_worker else None
    try:
        rc = (subprocess.call(cmd, env=env) if gpus is None
              else _run_yielding(cmd, env, gpus, name, spec.workers.gpu_type, priority))
    finally:
        if gpus is not None:
            gpus.release_all()
    return spec, rc


def _claim_gpus(job: str, n: int, gpu_type: str | None, env: dict[str, str], *, priority: int = 0
                ) -> DeviceLedger | None:
    """Claim `n` free whole GPUs of `gpu_type` on this machine for the run (llmfleet.local.gpus: the claims a
    `llmfleet up` on the same machine respects, and whose GPUs training then keeps away from) and show torchrun
    only those (`env`). Each claim carries a note with the job's `priority`: a `llmfleet up` of higher priority
    whose replicas wait may ask for the GPUs back (gpu_arbitration.py). None without nvidia-smi: every process sees
    every GPU, as before devices were counted."""
    from llmfleet.local.gpus import GpuRequest, device_env, machine_ledger

    ledger, said = machine_ledger(env)
    if ledger.devices is None:
        typer.echo(said)
        return None
    want = GpuRequest(count=n, gpu_type=gpu_type)
    got = ledger.claim(job, want)
    if got is None:
        raise _fail(f"{want.describe()} wanted, too few free on this machine ({said}; {ledger.holders()})")
    _note_claims(ledger, job, priority)
    env.update(device_env(got))
    typer.echo(f"training on GPU {','.join(d.id for d in got)} (claimed for this run)")
    return ledger


YIELD_POLL_S = 1.0  # how often a run looks for a request to let go of its GPUs (and, suspended, for free GPUs)
STOP_WAIT_S = 120.0  # how long a suspended run's workers may take to checkpoint before they are killed


def _note_claims(ledger: DeviceLedger, job: str, priority: int) -> None:
    from llmfleet.local.gpu_arbitration import training_note

    for d in ledger.held.get(job, []):
        ledger.locks.note(d, training_note(job, priority))


def _run_yielding(cmd: list[str], env: dict[str, str], ledger: DeviceLedger, job: str, gpu_type: str | None,
                  priority: int) -> int:
    """Run the training command on the claimed GPUs; when a `llmfleet up` of higher priority asks for them
    (gpu_arbitration.py), suspend as a TrainingJob is suspended on a cluster: SIGTERM (the workers finish their
    step, flush a checkpoint and exit), let go of the GPUs, wait until enough are free and asked for by no one,
    claim them and start again (the trainer resumes from the checkpoint). The command's exit status once it ends
    on its own."""
    import signal

    from llmfleet.local.gpus import GpuRequest, device_env

    def stop(proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM (the graceful stop: step, checkpoint, exit), then SIGKILL after STOP_WAIT_S."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    want = GpuRequest(count=len(ledger.held.get(job, [])), gpu_type=gpu_type)
    while True:
        proc = subprocess.Popen(cmd, env=env)
        asked: str | None = None
        try:
            while proc.poll() is None:
                if (asked := ledger.asked_of(job)) is not None:
                    break
                time.sleep(YIELD_POLL_S)
        finally:
            if asked is None and proc.poll() is None:  # Ctrl-C here: the workers stop before the GPUs are let go
                stop(proc)
        if asked is None:
            return proc.returncode
        typer.echo(f"suspending: {asked} asks for GPU {','.join(d.id for d in ledger.held.get(job, []))}; "
                   "the workers finish their step and save a checkpoint")
        stop(proc)
        ledger.release(job)
        typer.echo(f"suspended (exit {proc.returncode}); resumes from its last checkpoint when "
                   f"{want.describe()} are free")
        while (got := ledger.claim(job, want)) is None:
            time.sleep(YIELD_POLL_S)
        _note_claims(ledger, job, priority)
        env.update(device_env(got))
        typer.echo(f"resuming on GPU {','.join(d.id for d in got)}")


def _promote_locally(job: str, model: str, service: str, pool: str, run_dir: Path | None, timeout_s: float) -> None:
    from llmfleet.local.promote import request_promotion, wait_promotion
    from llmfleet.local.run_state import pid_alive, read_state, run_dir_for

    rdir = (run_dir or run_dir_for(service)).resolve()
    state = read_state(rdir)
    if not state or not pid_alive(state.get("supervisorPid")):
        typer.echo(f"--promote-to: {service} is not running here ({rdir}); the exported model is in {model}")
        return
    deadline = time.monotonic() + timeout_s
    while not (read_state(rdir) or {}).get("ready") and time.monotonic() < deadline:
        time.sleep(1.0)  # still starting: promote once it serves, so the rollout has a live baseline to watch
    request_promotion(rdir, job, pool, model)
    typer.echo(f"promoting {model} into {service}/{pool} (the operator's promotion: rollout, then the SLO watch)")
    promo = wait_promotion(rdir, timeout_s, on_change=lambda p: typer.echo(f"  promotion {p.state}: {p.message}"))
    if promo is None or promo.state != "Succeeded":
        raise _fail(f"promotion did not succeed: {promo.message if promo else 'the supervisor never started it'}", 1)
