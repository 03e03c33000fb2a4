"""The `llmfleet` command line.

Each component registers its own commands from `<package>/cli.py` through a `register(app)` function.
Those modules import only typer/rich at import time: heavy dependencies (torch, vllm, kopf) are imported
inside the command bodies, so `llmfleet --help` is fast and the operator image never imports torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperGroup

# Exit status of a command whose input file cannot be read or parsed (typer uses 2 for usage errors too).
INPUT_ERROR_EXIT = 2


class _RootGroup(TyperGroup):
    """Turns an unreadable input file, raised anywhere below as `InputFileError`, into one line + exit 2.

    Every command reads its files through llmfleet.api.loader (read_text, load_yaml_file, load_json_file,
    load_file), so this is the one place where decoding, syntax and nesting errors become messages.
    """

    def invoke(self, ctx: Any) -> Any:  # typer.Context (typer vendors click: no public base type)
        try:
            return super().invoke(ctx)
        except ValueError as err:
            # An InputFileError can only exist once its module is loaded: no import (and no pydantic) here.
            loader = sys.modules.get("llmfleet.api.loader")
            if loader is None or not isinstance(err, loader.InputFileError):
                raise
            typer.echo(f"llmfleet {ctx.invoked_subcommand or ''}: {err}".replace("  ", " "), err=True)
            raise typer.Exit(INPUT_ERROR_EXIT) from None


app = typer.Typer(
    cls=_RootGroup,
    name="llmfleet",
    help="Kubernetes operator and control plane for LLM fleets (training, serving, routing, autoscaling).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules that contribute commands, in the order they appear in --help.
COMMAND_MODULES = [
    "llmfleet.api.cli",            # crds generate, validate
    "llmfleet.operator.cli",       # operator
    "llmfleet.local.cli",          # up, down, model build-tiny
    "llmfleet.workers.train.cli",  # train, data prepare, analyze trace
    "llmfleet.router.cli",         # router
    "llmfleet.autoscaler.cli",     # autoscaler
    "llmfleet.store.cli",          # features ...
    "llmfleet.plan.cli",           # plan
    "llmfleet.sim.cli",            # sim
]

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
