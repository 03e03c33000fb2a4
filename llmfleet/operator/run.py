"""Start the operator: kopf with llmfleet's handlers, metrics and liveness endpoints, peering."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import kopf

from llmfleet.api.contracts import OPERATOR_LIVENESS_PORT, OPERATOR_METRICS_PORT
from llmfleet.operator.config import OperatorConfig

log = logging.getLogger("llmfleet.operator")

# kopf's peering resources (the Helm chart ships their CRDs: charts/llmfleet/crds/kopf.dev_peerings.yaml).
PEERING_GROUP_VERSION = "kopf.dev/v1"
PEERING_PLURALS = {True: "clusterkopfpeerings", False: "kopfpeerings"}  # by clusterwide


class PeeringUnavailable(RuntimeError):
    """Peering is mandatory but the API server does not serve kopf's peering resource: kopf would pause
    every handler silently and wait for it forever. The operator refuses to start instead."""


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


def _login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """The same credentials kopf's login handler finds (in-cluster service account, else kubeconfig); None
    when there are none or they cannot be read (kopf's own login then reports it)."""
    import yaml

    try:
        return kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    except (kopf.LoginError, OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as err:
        log.debug("no credentials for the peering check: %s", err)
        return None


async def check_peering(settings: kopf.OperatorSettings, connection: kopf.ConnectionInfo) -> None:
    """Raise PeeringUnavailable when mandatory peering's resource is not served. An unreachable or
    refusing API server is left to kopf (it retries and logs); only a definite "not served" stops us."""
    from llmfleet.kube.client import ApiError, KubeClient

    plural = PEERING_PLURALS[bool(settings.peering.clusterwide)]
    client = KubeClient.from_connection_info(connection)
    client.timeout_seconds = 10.0
    try:
        served = await client.crd_served(PEERING_GROUP_VERSION, plural)
    except ApiError as err:
        log.warning("could not check for kopf's peering resource (%s); starting anyway", err)
        return
    finally:
        await client.close()
    if not served:
        raise PeeringUnavailable(
            f"peering is mandatory (--peering {settings.peering.name}) but the API server does not serve "
            f"{PEERING_GROUP_VERSION} {plural}: apply charts/llmfleet/crds/kopf.dev_peerings.yaml (the Helm chart "
            f"installs it), or run a single replica with --standalone"
        )


async def run_async(
    opts: RunOptions,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run until `stop_flag` is set (or forever)."""
    from llmfleet.operator import handlers

    memo = kopf.Memo()
    memo.llmfleet = opts.runtime or handlers.Runtime(
        config=opts.config or OperatorConfig.from_env(), connection=opts.connection
    )
    if opts.autoscaler:
        # Importing the module registers the autoscaler's kopf timers (they then lose their finalizer too,
        # configure_timers below); without it only the operator's handlers run.
        from llmfleet.autoscaler import kopf_handlers

        kopf_handlers.share_client(memo, memo.llmfleet.kube)  # one client (and credentials) for both
    handlers.configure_timers(memo.llmfleet.config.timer_interval_seconds)
    settings = _settings(opts)
    if settings.peering.mandatory:
        rt = memo.llmfleet
        if rt.connection is None:
            rt.connection = await asyncio.to_thread(_login, settings)  # kopf's login handler reuses it
        if rt.connection is not None:
            await check_peering(settings, rt.connection)
    if opts.metrics_port is not None:
        from prometheus_client import start_http_server

        from llmfleet.operator.metrics import REGISTRY

        start_http_server(opts.metrics_port, registry=REGISTRY)
    clusterwide = opts.all_namespaces or not opts.namespaces
    await kopf.operator(
        settings=settings,
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


def run(opts: RunOptions, verbose: bool = False, log_format: str = "json") -> int:
    """Blocking entry point of `llmfleet operator`: structured (JSON) logs by default. Returns the exit
    status: 0 after a clean stop, 1 when mandatory peering has no peering resource (one error line)."""
    fmt = kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=verbose, log_format=fmt, log_refkey="object")
    try:
        asyncio.run(run_async(opts))
    except PeeringUnavailable as err:
        log.error("%s", err)
        return 1
    return 0
