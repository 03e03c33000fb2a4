"""CLI commands of this component (placeholder until its issue lands)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("sim", help="(not built yet)")
    def _placeholder() -> None:
        typer.echo("llmfleet sim: not built yet", err=True)
        raise typer.Exit(2)
