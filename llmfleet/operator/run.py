"""Start the operator: kopf with llmfleet's handlers, metrics and liveness endpoints, peering."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import kopf

from llmfleet.api.contracts import OPERATOR_LIVENESS_PORT, OPERATOR_METRICS_PORT
from llmfleet.operator.config import OperatorConfig


@dataclass
class RunOptions:
    namespaces: Sequence[str] = ()
    all_namespaces: bool = False
    metrics_port: int | None = OPERATOR_METRICS_PORT
    liveness_port: int | None = OPERATOR_LIVENESS_PORT
    peering: str | None = "llmfleet"
    standalone: bool = False
    priority: int = 0
    identity: str | None = None
    connection: kopf.ConnectionInfo | None = None  # tests: skip kubeconfig/service-account login
    config: OperatorConfig | None = None
    autoscaler: bool = True  # also run the autoscaler's kopf timers
    runtime: Any = None  # a pre-made handlers.Runtime (tests inspect it)


def _settings(opts: RunOptions) -> kopf.OperatorSettings:
    from llmfleet.operator.handlers import configure

    settings = kopf.OperatorSettings()
    configure(settings)
    if opts.peering and not opts.standalone:
        settings.peering.name = opts.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = opts.all_namespaces or not opts.namespaces
        settings.peering.priority = opts.priority
    else:
        settings.peering.standalone = True
    return settings


async def run_async(
    opts: RunOptions,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run until `stop_flag` is set (or forever)."""
    from llmfleet.operator import handlers

    if opts.autoscaler:
        # Importing the module registers the autoscaler's kopf timers (they then lose their finalizer too,
        # configure_timers below); without it only the operator's handlers run.
        from llmfleet.autoscaler import kopf_handlers  # noqa: F401
    memo = kopf.Memo()
    memo.llmfleet = opts.runtime or handlers.Runtime(
        config=opts.config or OperatorConfig.from_env(), connection=opts.connection
    )
    handlers.configure_timers(memo.llmfleet.config.timer_interval_seconds)
    if opts.metrics_port is not None:
        from prometheus_client import start_http_server

        from llmfleet.operator.metrics import REGISTRY

        start_http_server(opts.metrics_port, registry=REGISTRY)
    clusterwide = opts.all_namespaces or not opts.namespaces
    await kopf.operator(
        settings=_settings(opts),
        memo=memo,
        clusterwide=clusterwide,
        namespaces=() if clusterwide else list(opts.namespaces),
        standalone=opts.standalone or not opts.peering,
        priority=opts.priority,
        peering_name=opts.peering if not opts.standalone else None,
        identity=cast(Any, opts.identity),
        liveness_endpoint=f"http://0.0.0.0:{opts.liveness_port}/healthz" if opts.liveness_port else None,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run(opts: RunOptions, verbose: bool = False, log_format: str = "json") -> None:
    """Blocking entry point of `llmfleet operator`: structured (JSON) logs by default."""
    fmt = kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=verbose, log_format=fmt, log_refkey="object")
    asyncio.run(run_async(opts))
