"""`llmfleet data prepare` and `llmfleet analyze trace` (torch is imported inside commands); `llmfleet train` is
llmfleet.local.train_cli (it runs a TrainingJob on this machine, like `llmfleet up` runs an InferenceService)."""

from __future__ import annotations

import json
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
