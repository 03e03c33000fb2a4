"""`llmfleet train`, `llmfleet data prepare` and `llmfleet analyze trace` (torch is imported inside commands)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from llmfleet.api.trainingjob import TrainingJobSpec


def _fail(msg: str) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(2)


def local_spec_file(file: Path, spec: TrainingJobSpec) -> Path:
    """The spec file the local workers read: `file` itself, or (with s3:// / hf:// inputs) a copy next to the
    checkpoints whose input locations are their fetched local folders. pvc:// raises FetchError."""
    import yaml

    from llmfleet.api.storage import parse_uri
    from llmfleet.storage import local_copy

    def local(raw: str) -> str:
        return raw if parse_uri(raw).scheme == "local" else str(local_copy(raw))

    update: dict[str, object] = {}
    data = {"path": local(spec.data.path)}
    if spec.data.tokenizer:
        data["tokenizer"] = local(spec.data.tokenizer)
    update["data"] = spec.data.model_copy(update=data)
    if spec.distillation is not None:
        update["distillation"] = spec.distillation.model_copy(update={"teacher": local(spec.distillation.teacher)})
    if spec.output is not None and parse_uri(spec.output.path).scheme == "pvc":
        local_copy(spec.output.path)  # raises: no claims on this machine
    resolved = spec.model_copy(update=update)
    if resolved == spec:
        return file
    out = Path(spec.checkpoint.uri) / "job.local.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump({"spec": resolved.to_wire()}, sort_keys=False))
    return out


def register(app: typer.Typer) -> None:
    @app.command("train", help="Run a TrainingJob on this machine (torchrun with one process per GPU, or gloo on CPU).")
    def train(
        file: Path = typer.Option(..., "-f", "--file", help="TrainingJob manifest (or bare spec) YAML."),
        nproc: int | None = typer.Option(
            None, "--nproc", min=1, help="Processes; default gpusPerWorker (or workers.count on CPU)."
        ),
    ) -> None:
        from pydantic import ValidationError

        from llmfleet.workers.train.__main__ import load_spec

        try:
            spec = load_spec(str(file))
        except (OSError, ValueError, ValidationError) as err:
            raise _fail(str(err).splitlines()[0]) from None
        from llmfleet.storage import FetchError

        try:
            spec_file = local_spec_file(file, spec)
        except FetchError as err:
            raise _fail(str(err)) from None
        n = nproc or (spec.workers.gpus_per_worker or spec.workers.count)
        cmd = [sys.executable, "-m", "llmfleet.workers.train", "--spec", str(spec_file)]
        if n > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                   "-m", "llmfleet.workers.train", "--spec", str(spec_file)]
        rc = subprocess.call(cmd, env=dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0")))
        if rc != 0:
            raise _fail(f"training exited with status {rc}")
        typer.echo(f"done; status in {Path(spec.checkpoint.uri) / 'status.json'}")

    data = typer.Typer(help="Training data.", no_args_is_help=True)

    @data.command("prepare", help="Tokenize text files into uint16/uint32 token shards with a manifest.json.")
    def prepare(
        inputs: list[str] = typer.Argument(..., help="Files, folders or glob patterns of text."),
        out: Path = typer.Option(..., "--out", "-o", help="Output folder."),
        tokenizer: str = typer.Option("bytes", help="'bytes', 'bpe' (train a byte-level BPE) or a tokenizer.json."),
        vocab_size: int = typer.Option(4096, min=260, help="Vocabulary size when training a BPE."),
    ) -> None:
        from llmfleet.workers.train.data import prepare as run_prepare

        try:
            m = run_prepare(inputs, out, tokenizer=tokenizer, vocab_size=vocab_size)
        except (OSError, ValueError) as err:
            raise _fail(str(err)) from None
        typer.echo(f"{m['tokens']} tokens from {m['files']} files, vocab {m['vocab']}, {len(m['shards'])} "
                   f"shard(s) ({m['dtype']}) in {out}")

    analyze = typer.Typer(help="Performance analysis.", no_args_is_help=True)

    @analyze.command("trace", help="Where a profiled step's time goes, and a one-line diagnosis.")
    def trace(
        file: Path = typer.Argument(..., help="torch.profiler Chrome trace (.json or .json.gz)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        from llmfleet.workers.train.analyze import analyze_trace, format_summary

        try:
            summary = analyze_trace(file)
        except (OSError, ValueError, KeyError) as err:
            raise _fail(f"{file}: {err}") from None
        typer.echo(json.dumps(summary.to_dict(), indent=2) if as_json else format_summary(summary))

    app.add_typer(data, name="data")
    app.add_typer(analyze, name="analyze")
