"""The `llmfleet` command line.

Each component registers its own commands from `<package>/cli.py` through a `register(app)` function.
Those modules import only typer/rich at import time: heavy dependencies (torch, vllm, kopf) are imported
inside the command bodies, so `llmfleet --help` is fast and the operator image never imports torch.
"""

from __future__ import annotations

import typer

from llmfleet.api import cli as api_cli
from llmfleet.autoscaler import cli as autoscaler_cli
from llmfleet.local import cli as local_cli
from llmfleet.operator import cli as operator_cli
from llmfleet.plan import cli as plan_cli
from llmfleet.router import cli as router_cli
from llmfleet.sim import cli as sim_cli
from llmfleet.storage import cli as storage_cli
from llmfleet.store import cli as store_cli
from llmfleet.workers.train import cli as train_cli

app = typer.Typer(
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
