"""The `llmfleet` command line.

Each component registers its own commands from `<package>/cli.py` through a `register(app)` function.
Those modules import only typer/rich at import time: heavy dependencies (torch, vllm, kopf) are imported
inside the command bodies, so `llmfleet --help` is fast and the operator image never imports torch.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
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
    "llmfleet.storage.cli",        # fetch
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
