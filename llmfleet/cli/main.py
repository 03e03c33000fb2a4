"""The `llmfleet` command line.

Each component registers its own commands from `<package>/cli.py` through a `register(app)` function.
Those modules import only typer/rich at import time: heavy dependencies (torch, vllm, kopf) are imported
inside the command bodies, so `llmfleet --help` is fast and the operator image never imports torch.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from llmfleet.api import cli as api_cli
from llmfleet.api.loader import InputFileError
from llmfleet.autoscaler import cli as autoscaler_cli
from llmfleet.local import cli as local_cli
from llmfleet.operator import cli as operator_cli
from llmfleet.plan import cli as plan_cli
from llmfleet.router import cli as router_cli
from llmfleet.sim import cli as sim_cli
from llmfleet.storage import cli as storage_cli
from llmfleet.store import cli as store_cli
from llmfleet.workers.train import cli as train_cli

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
        except InputFileError as err:
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
COMMAND_MODULES = (
    api_cli,         # crds generate, validate
    operator_cli,    # operator
    local_cli,       # up, down, model build-tiny
    storage_cli,     # fetch
    train_cli,       # train, data prepare, analyze trace
    router_cli,      # router
    autoscaler_cli,  # autoscaler
    store_cli,       # features ...
    plan_cli,        # plan
    sim_cli,         # sim
)

for _module in COMMAND_MODULES:
    _module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
