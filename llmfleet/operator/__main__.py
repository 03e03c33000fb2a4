"""`python -m llmfleet.operator [options]`: the same as `llmfleet operator [options]`."""

from __future__ import annotations

import typer

from llmfleet.operator.cli import register


def main() -> None:
    # A Typer app with a single command runs it directly (no subcommand name needed).
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    app(prog_name="python -m llmfleet.operator")


if __name__ == "__main__":
    main()
