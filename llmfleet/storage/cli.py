"""`llmfleet fetch URI DEST`: what the operator's init containers run to fill a model or data cache."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "fetch",
        help="Copy s3://bucket/prefix, hf://org/name (@revision optional) or a local folder into DEST: resumable, checksummed "
        "(S3 ETag and size, Hub file metadata), progress in the log. S3 endpoint and credentials come from "
        "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; the Hub token from HF_TOKEN.",
    )
    def fetch(
        uri: str = typer.Argument(..., help="Location to copy."),
        dest: Path = typer.Argument(..., help="Destination folder (created)."),
        include: list[str] = typer.Option(
            [], "--include", "-i", help="Only relative paths matching this fnmatch pattern (repeatable)."
        ),
        progress_every: float = typer.Option(5.0, "--progress-every", min=0.1, help="Seconds between progress lines."),
    ) -> None:
        import logging

        from llmfleet.storage import FetchError
        from llmfleet.storage import fetch as run_fetch

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        for noisy in ("botocore", "boto3", "urllib3", "huggingface_hub", "filelock", "httpx", "httpx2"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        try:
            result = run_fetch(uri, dest, include or None, progress_every_s=progress_every)
        except FetchError as err:
            typer.echo(f"llmfleet fetch: {err}", err=True)
            raise typer.Exit(1) from None
        typer.echo(
            f"{result.uri} -> {result.dest}: {result.files} files, {result.bytes_transferred} bytes transferred, "
            f"{result.skipped} already complete, {result.seconds:.1f}s"
        )
