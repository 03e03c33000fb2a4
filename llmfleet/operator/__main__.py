"""`python -m llmfleet.operator [options]`: the same as `llmfleet operator [options]`."""

from __future__ import annotations

import typer

from llmfleet.operator.cli import register


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)

    @app.callback()
    def _root() -> None:
        """llmfleet operator."""

    app(args=["operator", *__import__("sys").argv[1:]], prog_name="python -m llmfleet.operator")


if __name__ == "__main__":
    main()
