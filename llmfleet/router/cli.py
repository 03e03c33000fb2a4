"""`llmfleet router --config router.yaml [--port P]` (also `python -m llmfleet.router`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer


def serve(config: Path, port: int | None = None, host: str | None = None, log_level: str = "info") -> None:
    """Load the config and serve until interrupted (uvloop when installed)."""
    import asyncio
    import logging

    from pydantic import ValidationError

    from llmfleet.router.config import load_router_config

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_router_config(config)
    except OSError as e:
        typer.echo(f"llmfleet router: cannot read {config}: {e.strerror}", err=True)
        raise typer.Exit(2) from None
    except (ValidationError, ValueError) as e:
        typer.echo(f"llmfleet router: invalid config {config}: {str(e).splitlines()[0]} {_first_error(e)}", err=True)
        raise typer.Exit(2) from None
    updates = {k: v for k, v in {"port": port, "host": host}.items() if v is not None}
    if updates:
        cfg = cfg.model_copy(update=updates)
    try:
        lookup = _make_lookup(cfg)
    except ValueError as e:  # the store's URL variable (from a Secret) is missing
        typer.echo(f"llmfleet router: {e}", err=True)
        raise typer.Exit(2) from None

    from llmfleet.router.http_server import run_router

    runner: Callable[..., Any] = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass
    try:
        runner(run_router(cfg, lookup, config_path=str(config)))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        typer.echo(f"llmfleet router: cannot listen on {cfg.host}:{cfg.port}: {e.strerror}", err=True)
        raise typer.Exit(1) from None
    except ValueError as e:  # config that validates but cannot run, e.g. prefixMode tokens without a tokenizer
        typer.echo(f"llmfleet router: {e}", err=True)
        raise typer.Exit(2) from None


def _first_error(e: Exception) -> str:
    errs = getattr(e, "errors", None)
    if callable(errs):
        first = errs()[0]
        return f"({'.'.join(str(p) for p in first['loc'])}: {first['msg']})"
    return ""


def _make_lookup(cfg: object) -> object | None:
    from llmfleet.router.config import RouterConfig

    if not isinstance(cfg, RouterConfig) or not cfg.feature_store.enabled:
        return None
    try:
        from llmfleet.store.lookup import FeatureStoreLookup
    except ImportError as e:
        typer.echo(f"llmfleet router: feature store lookups disabled ({e})", err=True)
        return None
    fs = cfg.feature_store
    return FeatureStoreLookup(fs.resolved_url(os.environ), cfg.primary().served_names[0], semantic_threshold=fs.semantic_threshold,
                              timeout_ms=fs.lookup_timeout_ms)


def register(app: typer.Typer) -> None:
    @app.command("router", help="Run the OpenAI-compatible router of one InferenceService.")
    def router(
        config: Path = typer.Option(..., "--config", "-c", help="router.yaml (RouterConfig)."),
        port: int | None = typer.Option(None, "--port", "-p", min=0, max=65535,
                                        help="Listen port (overrides the config; 0 = any)."),
        host: str | None = typer.Option(None, "--host", help="Listen address (overrides the config)."),
        log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
    ) -> None:
        serve(config, port, host, log_level)
