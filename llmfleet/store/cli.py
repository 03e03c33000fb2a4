"""`llmfleet features ...`: migrate, generate, set-version, lookup, stats.

Only typer/rich at import time; SQLAlchemy, numpy and the embedder load inside the commands.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from llmfleet.api.cli import positive_number
from llmfleet.api.contracts import STORE_URL_ENV

features_app = typer.Typer(
    name="features",
    help="Feature store: prompt features, embeddings and precomputed responses (SQLite or PostgreSQL).",
    no_args_is_help=True,
)

URL_HELP = "SQLAlchemy URL (postgresql+psycopg://... or sqlite:///file); default: SQLite in the run folder."


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(1)


def _url(url: str | None) -> str:
    from llmfleet.store.db import StoreConfigError, normalize_url

    try:
        return normalize_url(url or os.environ.get(STORE_URL_ENV))
    except StoreConfigError as e:
        _fail(str(e))
        raise  # unreachable: _fail exits


def _open(url: str | None, migrate: bool = True) -> Any:
    from sqlalchemy.exc import SQLAlchemyError

    from llmfleet.store import db

    u = _url(url)
    try:
        if migrate:
            db.upgrade(u)
        return db.make_engine(u, writer=True)
    except SQLAlchemyError as e:
        _fail(f"database {db.redacted(u)}: {type(e).__name__}: {str(e).splitlines()[0]}")
        raise


@features_app.command("migrate")
def migrate_cmd(
    url: str | None = typer.Option(None, "--url", help=URL_HELP),
    revision: str = typer.Option("head", help="Target revision (upgrade)."),
    down: str | None = typer.Option(None, "--down", help="Downgrade to this revision instead (e.g. base)."),
) -> None:
    """Create or upgrade the schema (alembic)."""
    from sqlalchemy.exc import SQLAlchemyError

    from llmfleet.store import db

    u = _url(url)
    try:
        db.downgrade(u, down) if down else db.upgrade(u, revision)
        typer.echo(f"feature store at revision {db.current_revision(u) or 'base'}")
    except SQLAlchemyError as e:
        _fail(f"migration failed: {type(e).__name__}: {str(e).splitlines()[0]}")


@features_app.command("set-version")
def set_version_cmd(
    model: str = typer.Option(..., help="Served model name."),
    version: str = typer.Option(..., help="Model version (weights path or digest)."),
    url: str | None = typer.Option(None, "--url", help=URL_HELP),
) -> None:
    """Make a model version current; responses of every other version are invalidated."""
    from llmfleet.store import repo

    change = repo.set_current_version(_open(url), model, version)
    typer.echo(
        f"{model}: version {version} is current"
        + (f" ({change.invalidated} older responses invalidated)" if change.changed else " (unchanged)")
    )


class _Bar:
    """A rich progress bar with one task per stage."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            disable=not enabled,
        )
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, advance: int, total: int | None) -> None:
        if stage not in self.tasks:
            label = {"features": "log bytes"}.get(stage, stage)
            self.tasks[stage] = self.progress.add_task(label, total=total)
        elif total is not None:
            self.progress.update(self.tasks[stage], total=total)
        if advance:
            self.progress.advance(self.tasks[stage], advance)


@features_app.command("generate")
def generate_cmd(
    log: Path = typer.Option(..., "--log", help="Request log (JSON lines written by the router)."),
    url: str | None = typer.Option(None, "--url", help=URL_HELP),
    model: str | None = typer.Option(None, help="Served model whose embeddings/responses to generate."),
    model_version: str | None = typer.Option(
        None, help="Model version; becomes current (older responses are invalidated). Default: the current one."
    ),
    endpoint: str | None = typer.Option(
        None, help="OpenAI-compatible base URL to precompute responses with (skipped when omitted)."
    ),
    served_model: str | None = typer.Option(None, help="`model` sent to the endpoint (default: --model)."),
    min_frequency: int = typer.Option(3, min=1, help="Precompute responses for prompts seen this often."),
    max_prompts: int | None = typer.Option(None, min=1, help="Cap on head prompts per run."),
    concurrency: int = typer.Option(8, min=1, max=1024, help="Concurrent requests to the endpoint."),
    ttl: float = typer.Option(7 * 86400, min=0, help="Response time to live in seconds (0: forever)."),
    embedder: str = typer.Option("minilm", help="minilm, hashing[:dim] or st:<folder>; 'none' to skip."),
    batch_lines: int = typer.Option(2000, min=1, help="Log lines per committed batch."),
    embed_batch: int = typer.Option(256, min=1, help="Prompts per embedding batch."),
    block_size: int = typer.Option(16, min=1, help="Prefix-block size in tokens."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", help="Environment variable holding the endpoint's API key."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Read a request log; compute features, embeddings and the head's responses (resumable)."""
    import asyncio
    import time

    from sqlalchemy.exc import SQLAlchemyError

    from llmfleet.store import generation, repo
    from llmfleet.store.embeddings import UnknownEmbedderError, get_embedder

    if endpoint and not model:
        _fail("--endpoint needs --model (the served model whose responses to precompute)")
    if not log.is_file():
        _fail(f"request log {log} does not exist")
    emb = None
    if embedder != "none":
        try:
            emb = get_embedder(embedder)
        except (UnknownEmbedderError, ImportError) as e:
            _fail(str(e))
    engine = _open(url)
    bar = _Bar(progress)
    report = generation.Report()
    t0 = time.perf_counter()
    try:
        with bar.progress:
            generation.ingest_log(engine, log, batch_lines=batch_lines, block_size=block_size, report=report,
                                  progress=bar)
            version_id = None
            if model and model_version:
                change = repo.set_current_version(engine, model, model_version)
                version_id, report.invalidated = change.version_id, change.invalidated
            elif model:
                with engine.connect() as conn:
                    cur = repo.current_version(conn, model)
                version_id = cur[0] if cur else None
            if emb is not None:
                generation.embed_features(engine, emb, model=model, batch_size=embed_batch, report=report,
                                          progress=bar)
            if endpoint and model:
                if version_id is None:
                    _fail(f"model {model} has no version yet: pass --model-version")
                asyncio.run(generation.precompute_responses(
                    engine, model=model, version_id=int(version_id or 0), endpoint_url=endpoint,
                    served_model=served_model, min_frequency=min_frequency, concurrency=concurrency,
                    ttl_seconds=ttl or None, api_key=os.environ.get(api_key_env), max_prompts=max_prompts,
                    report=report, progress=bar,
                ))
    except generation.GenerationError as e:
        _fail(str(e))
    except SQLAlchemyError as e:
        _fail(f"database error: {type(e).__name__}: {str(e).splitlines()[0]}")
    finally:
        engine.dispose()
    took = time.perf_counter() - t0
    typer.echo(
        f"lines {report.lines} (bad {report.bad_lines}), features {report.features}, embedded {report.embedded}, "
        f"head {report.head} (done before {report.responses_done_before}), responses ok {report.responses_ok} "
        f"failed {report.responses_failed}, invalidated {report.invalidated}, {took:.1f}s"
    )
    for err in report.errors:
        typer.echo(f"  {err}", err=True)
    if report.responses_failed:
        _fail(f"{report.responses_failed} responses failed; rerun to retry them (done ones are skipped)")


@features_app.command("lookup")
def lookup_cmd(
    model: str = typer.Option(..., help="Served model name."),
    prompt: str = typer.Option(..., help="Prompt text (chat: sent as one user message)."),
    tenant: str = typer.Option("default", help="Tenant."),
    endpoint: str = typer.Option("chat", help="chat or completions."),
    url: str | None = typer.Option(None, "--url", help=URL_HELP),
    semantic: bool = typer.Option(True, "--semantic/--exact-only", help="Also try a semantic match."),
    threshold: float = typer.Option(0.92, min=0.0, max=1.0, help="Cosine similarity needed."),
    embedder: str = typer.Option("minilm", help="Embedder used at generation time."),
    timeout_ms: float = typer.Option(30_000.0, callback=positive_number,
                                    help="Deadline (generous here: includes loading the model)."),
    params: str = typer.Option("{}", help='Sampling parameters as JSON, e.g. \'{"max_tokens": 16}\' (part of the key).'),
) -> None:
    """Look a prompt up the way the router does; prints the hit as JSON (exit 1 on a miss)."""
    import asyncio
    import json

    from llmfleet.store.lookup import FeatureStoreLookup

    if endpoint not in ("chat", "completions"):
        _fail("--endpoint must be chat or completions")
    try:
        extra = json.loads(params)
    except ValueError as e:
        _fail(f"--params is not JSON: {e}")
    if not isinstance(extra, dict):
        _fail("--params must be a JSON object")
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat" else {"prompt": prompt}
    )
    body.update(extra)

    async def go() -> Any:
        store = FeatureStoreLookup(_url(url), model, semantic_threshold=threshold, timeout_ms=timeout_ms,
                                   semantic=semantic, embedder=embedder)
        try:
            if semantic:
                await store.warmup()
            return await store.lookup(tenant, endpoint, body)
        finally:
            await store.close()

    from sqlalchemy.exc import SQLAlchemyError

    try:
        hit = asyncio.run(go())
    except SQLAlchemyError as e:
        _fail(f"database error: {type(e).__name__}: {str(e).splitlines()[0]}")
        return
    if hit is None:
        _fail("miss")
        return
    typer.echo(json.dumps({"kind": hit.kind, "similarity": round(hit.similarity, 4), "modelVersion": hit.model_version,
                           "ageSeconds": round(hit.age_s, 1), "response": hit.response}, indent=2))


@features_app.command("stats")
def stats_cmd(url: str | None = typer.Option(None, "--url", help=URL_HELP)) -> None:
    """Row counts of the feature store."""
    from llmfleet.store import repo

    for k, v in repo.counts(_open(url)).items():
        typer.echo(f"{k:16} {v}")


def register(app: typer.Typer) -> None:
    app.add_typer(features_app, name="features")
