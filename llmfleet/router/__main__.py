"""python -m llmfleet.router --config router.yaml [--port P]"""

from __future__ import annotations

import typer

from llmfleet.router.cli import register

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
register(app)

if __name__ == "__main__":
    app()
