"""Start the operator: kopf with llmfleet's handlers, metrics and liveness endpoints, peering."""

from __future__ import annotations

import asyncio
import datetime
import gc
import getpass
import hashlib
import logging
import os
import secrets
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import kopf

from llmfleet.api.contracts import OPERATOR_LIVENESS_PORT, OPERATOR_METRICS_PORT
from llmfleet.operator.config import PRIORITY_MAX, PRIORITY_MIN, OperatorConfig

log = logging.getLogger("llmfleet.operator")

# kopf's peering resources (the Helm chart ships their CRDs: charts/llmfleet/crds/kopf.dev_peerings.yaml).
PEERING_GROUP_VERSION = "kopf.dev/v1"
PEERING_PLURALS = {True: "clusterkopfpeerings", False: "kopfpeerings"}  # by clusterwide


class PeeringUnavailable(RuntimeError):
    """Peering is mandatory but the API server does not serve kopf's peering resource: kopf would pause
    every handler silently and wait for it forever. The operator refuses to start instead."""


class PeeringConflict(RuntimeError):
    """A live peer already holds this operator's kopf priority: kopf would pause both (and every other peer of
    that priority) for good. The operator refuses to start instead."""


# kopf pauses *every* operator that sees a live peer of its own priority ("all operators freeze, leaving the
# cluster unserved"). So kopf never sees the --priority as given: it gets --priority in the high bits and a
# hash of the operator's identity in the low TIEBREAK_BITS. A higher --priority still always wins; replicas of
# equal --priority are ordered by identity, so exactly one of them acts. Only a hash collision of two
# identities (2^-32 per pair) can tie, and PeeringConflict refuses that at start with one log line.
TIEBREAK_BITS = 32


def operator_identity(explicit: str | None = None) -> str:
    """This operator's peering identity: `explicit`, else POD_ID (kopf's variable; the chart sets it to
    `<pod>.<namespace>`, stable across container restarts), else user@host/time/random as kopf makes it."""
    if explicit:
        return explicit
    if pod := os.environ.get("POD_ID"):
        return pod
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d%H%M%S")
    return f"{getpass.getuser()}@{socket.gethostname()}/{now}/{secrets.token_hex(2)}"


def kopf_priority(priority: int, identity: str) -> int:
    """The priority kopf compares: --priority first, then a hash of the identity (equal --priority values never
    tie). Raises ValueError outside PRIORITY_MIN..PRIORITY_MAX."""
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(f"--priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {priority}")
    tiebreak = int.from_bytes(hashlib.sha256(identity.encode()).digest()[: TIEBREAK_BITS // 8], "big")
    return (priority << TIEBREAK_BITS) + tiebreak


def _peer_alive(info: Any, now: datetime.datetime) -> bool:
    """A peer entry of kopf's peering status (lastseen + lifetime) that has not expired yet."""
    if not isinstance(info, dict):
        return False
    try:
        seen = datetime.datetime.fromisoformat(str(info.get("lastseen")))
        lifetime = datetime.timedelta(seconds=int(info.get("lifetime", 60)))
    except (TypeError, ValueError):
        return False
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=datetime.UTC)
    return seen + lifetime > now


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


# gc.set_threshold for the operator process: collect the youngest generation every 10,000 net allocations.
GC_THRESHOLDS = (10_000, 10, 10)


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


# kopf's peering kinds, for reading the peering object with llmfleet's Kubernetes client.
PEERING_KINDS = {True: "ClusterKopfPeering", False: "KopfPeering"}  # by clusterwide


def _peering_objects(settings: kopf.OperatorSettings, namespaces: Sequence[str]) -> list[str | None]:
    """Namespaces of the peering objects to read (None: the cluster-wide one)."""
    if settings.peering.clusterwide:
        return [None]
    # Globs (--namespace 'team-*') are left out: their peering objects are only known once kopf lists them.
    return [ns for ns in namespaces if not any(c in ns for c in "*?[!")]


async def check_priority_unique(
    settings: kopf.OperatorSettings, connection: kopf.ConnectionInfo, identity: str, namespaces: Sequence[str] = ()
) -> None:
    """Raise PeeringConflict when a live peer of another identity already has our kopf priority."""
    from llmfleet.kube.client import ApiError, KubeClient
    from llmfleet.kube.kinds import register_custom_kind

    clusterwide = bool(settings.peering.clusterwide)
    kind = PEERING_KINDS[clusterwide]
    register_custom_kind(PEERING_GROUP_VERSION, kind, PEERING_PLURALS[clusterwide], namespaced=not clusterwide)
    mine = settings.peering.priority
    client = KubeClient.from_connection_info(connection)
    client.timeout_seconds = 10.0
    now = datetime.datetime.now(datetime.UTC)
    try:
        for namespace in _peering_objects(settings, namespaces):
            try:
                # None: no peering object yet, so no peers either (kopf reports the missing object itself).
                found = await client.get(PEERING_GROUP_VERSION, kind, namespace, settings.peering.name)
            except ApiError as err:
                log.warning("could not read the peering object %s (%s); starting anyway", settings.peering.name, err)
                continue
            status = (found or {}).get("status")
            for peer, info in (status if isinstance(status, dict) else {}).items():
                if peer == identity or not _peer_alive(info, now):
                    continue
                try:
                    theirs = int(info.get("priority", 0))
                except (TypeError, ValueError):
                    continue
                if theirs == mine:
                    raise PeeringConflict(
                        f"peering {settings.peering.name}: live peer {peer!r} has the same kopf priority {mine} as "
                        f"this operator ({identity!r}), and kopf would pause both: start with another --priority "
                        f"or identity (POD_ID)"
                    )
    finally:
        await client.close()


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
    identity = operator_identity(opts.identity)
    if settings.peering.mandatory:
        settings.peering.priority = kopf_priority(opts.priority, identity)
        log.info("peering %s as %r: --priority %d, kopf priority %d (equal --priority values are ordered by "
                 "identity)", settings.peering.name, identity, opts.priority, settings.peering.priority)
        rt = memo.llmfleet
        if rt.connection is None:
            rt.connection = await asyncio.to_thread(_login, settings)  # kopf's login handler reuses it
        if rt.connection is not None:
            await check_peering(settings, rt.connection)
            await check_priority_unique(settings, rt.connection, identity, opts.namespaces)
    if opts.metrics_port is not None:
        from prometheus_client import start_http_server

        from llmfleet.operator.metrics import REGISTRY

        start_http_server(opts.metrics_port, registry=REGISTRY)
    # A reconcile allocates thousands of short-lived objects (dicts, HTTP requests and answers, kopf's causes):
    # with Python's default first-generation threshold (700) they reach the older generations, whose
    # collections then cost about a quarter of the operator's CPU at 1,000 CRs reconciled at once.
    gc.set_threshold(*GC_THRESHOLDS)
    clusterwide = opts.all_namespaces or not opts.namespaces
    await kopf.operator(
        settings=settings,
        memo=memo,
        clusterwide=clusterwide,
        namespaces=() if clusterwide else list(opts.namespaces),
        standalone=opts.standalone or not opts.peering,
        priority=settings.peering.priority,
        peering_name=opts.peering if not opts.standalone else None,
        identity=cast(Any, identity),
        liveness_endpoint=f"http://0.0.0.0:{opts.liveness_port}/healthz" if opts.liveness_port else None,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run(opts: RunOptions, verbose: bool = False, log_format: str = "json") -> int:
    """Blocking entry point of `llmfleet operator`: structured (JSON) logs by default. Returns the exit
    status: 0 after a clean stop, 1 when mandatory peering has no peering resource or a live peer holds this
    operator's priority (one error line)."""
    fmt = kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=verbose, log_format=fmt, log_refkey="object")
    try:
        asyncio.run(run_async(opts))
    except (PeeringUnavailable, PeeringConflict) as err:
        log.error("%s", err)
        return 1
    return 0
