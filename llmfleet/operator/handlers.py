"""kopf registration: create/update/resume handlers and a timer per kind, all calling the same reconcile.

Importing this module registers the handlers on kopf's default registry (and the autoscaler's timers,
when that package provides them). `llmfleet.operator.run` starts kopf with them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from llmfleet.api.contracts import (
    GROUP,
    INFERENCESERVICE_PLURAL,
    MANAGED_BY_LABEL,
    MANAGED_LABELS,
    TRAININGJOB_PLURAL,
    VERSION,
    now_iso,
)
from llmfleet.kube.client import ApiError, KubeClient, start_api_timer
from llmfleet.operator.config import Capabilities, OperatorConfig
from llmfleet.operator.metrics import ERRORS, observe
from llmfleet.operator.reconcile_isvc import ReconcileError, reconcile_inferenceservice
from llmfleet.operator.reconcile_tj import reconcile_trainingjob
from llmfleet.operator.status import ReconcileOutcome, status_of
from llmfleet.operator.worker_status import HttpStatusReader, StatusReader

ISVC = (GROUP, VERSION, INFERENCESERVICE_PLURAL)
TJ = (GROUP, VERSION, TRAININGJOB_PLURAL)
# Read once at import: kopf fixes a timer's interval when it is registered.
TIMER_INTERVAL = float(os.environ.get("LLMFLEET_RECONCILE_INTERVAL") or 30.0)
RETRY_DELAY = float(os.environ.get("LLMFLEET_RETRY_DELAY") or 10.0)

log = logging.getLogger("llmfleet.operator")


@dataclass
class Runtime:
    """Per-operator state kept in kopf's memo: config, API client, per-object locks and written status."""

    config: OperatorConfig
    connection: kopf.ConnectionInfo | None = None
    client: KubeClient | None = None
    status_reader: StatusReader | None = None
    capabilities_known: bool = False
    _discovering: asyncio.Lock = field(default_factory=asyncio.Lock)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # Owners with a child-triggered reconcile already queued (coalesces bursts of child events).
    pending: set[str] = field(default_factory=set)
    # resourceVersion of each child as our last apply returned it: watch events of our own writes are skipped.
    applied_rv: dict[tuple[str, str, str], str] = field(default_factory=dict)
    # When each object's last reconcile finished (monotonic): a timer tick right after one is skipped.
    last_done: dict[str, float] = field(default_factory=dict)
    # Status this operator wrote last, per object uid: the next reconcile must not act on a body that
    # the watch stream has not refreshed yet (e.g. count a restart twice).
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Set when the operator stops: a timer kopf spawned during shutdown must not write anything (another
    # replica may already lead) nor reopen the closed API client.
    stopping: bool = False

    def kube(self) -> KubeClient:
        if self.client is None:
            if self.connection is None:
                raise kopf.TemporaryError("not logged in to the API server yet", delay=1)
            self.client = KubeClient.from_connection_info(self.connection)
            self.client.on_applied = self.remember_applied
            # A child's apply identical to its last one (same owner generation) is not re-sent within one timer
            # interval: a watched child (Deployment, Job) that someone else changes re-arms it at once
            # (on_child_event); a change nobody signals (e.g. a hand edit of a Service) is still undone within
            # two intervals (llmfleet/kube/applied.py).
            self.client.unchanged_apply_ttl_seconds = self.config.timer_interval_seconds
        return self.client

    def remember_applied(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if obj.get("kind") and meta.get("name") and meta.get("resourceVersion"):
            key = (str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))
            self.applied_rv[key] = str(meta["resourceVersion"])

    def reader(self) -> StatusReader:
        if self.status_reader is None:
            self.status_reader = HttpStatusReader(self.config.status_timeout_seconds)
        return self.status_reader

    async def discover(self) -> None:
        """Find optional APIs once (PodGroup, PodMonitor); builders emit those objects only when served."""
        if self.capabilities_known:
            return
        async with self._discovering:  # one discovery, not one per concurrent reconcile
            if not self.capabilities_known:
                await self._discover()

    async def _discover(self) -> None:
        caps = Capabilities(
            pod_group=await self._served("scheduling.x-k8s.io/v1alpha1", "podgroups"),
            pod_monitor=await self._served("monitoring.coreos.com/v1", "podmonitors"),
        )
        self.config = OperatorConfig(**{**self.config.__dict__, "capabilities": caps})
        self.capabilities_known = True
        log.info("optional APIs: PodGroup=%s PodMonitor=%s", caps.pod_group, caps.pod_monitor)

    async def _served(self, group_version: str, plural: str) -> bool:
        """Whether an optional API's CRD is installed; an unanswered check counts as not installed."""
        try:
            return await self.kube().crd_served(group_version, plural)
        except ApiError as err:
            log.warning("cannot tell whether %s %s is served (%s); not using it", group_version, plural, err)
            return False


def runtime(memo: Any) -> Runtime:
    rt = getattr(memo, "llmfleet", None)
    if not isinstance(rt, Runtime):
        rt = Runtime(config=OperatorConfig.from_env())
        memo.llmfleet = rt
    return rt


SHUTDOWN_DEADLINE_SECONDS = 20.0


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings shared by the CLI and tests."""
    # Progress and the last-handled spec live in llmfleet.io annotations, keeping status for llmfleet.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Only our explicit Events and warnings become Kubernetes Events, not every handler log line.
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 30
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # On SIGTERM kopf waits for its tasks (5 s for stragglers, then cancels them); should anything still
    # hang, it SIGKILLs itself after this long: inside the chart's terminationGracePeriodSeconds (30).
    settings.process.ultimate_exiting_timeout = SHUTDOWN_DEADLINE_SECONDS


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    runtime(memo)


@kopf.on.login()
def _login(memo: kopf.Memo, settings: kopf.OperatorSettings, **kwargs: Any) -> kopf.ConnectionInfo | None:
    rt = runtime(memo)
    if rt.connection is None:
        rt.connection = kopf.login_with_service_account(settings=settings, **kwargs) or kopf.login_with_kubeconfig(
            settings=settings, **kwargs
        )
    return rt.connection


@kopf.on.cleanup()
async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    rt = runtime(memo)
    rt.stopping = True
    if rt.client is not None:
        await rt.client.close()
    if isinstance(rt.status_reader, HttpStatusReader):
        await rt.status_reader.close()


Reconciler = Callable[[Mapping[str, Any], Runtime], Awaitable[ReconcileOutcome]]


def _post(body: Mapping[str, Any], outcome: ReconcileOutcome) -> None:
    for ev in outcome.events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message[:1000])  # type: ignore[arg-type]
    for obj, ev in outcome.other_events:
        kopf.event(obj, type=ev.type, reason=ev.reason, message=ev.message[:1000])  # type: ignore[arg-type]


async def run_reconcile(
    kind: str, trigger: str, body: Mapping[str, Any], patch: dict[str, Any], memo: Any, reconcile: Reconciler
) -> None:
    """Lock per object, time it (API waits excluded), record status and Events, classify errors."""
    rt = runtime(memo)
    uid = str(body.get("metadata", {}).get("uid", ""))
    lock = rt.locks.setdefault(uid, asyncio.Lock())
    async with lock:
        if rt.stopping:
            return
        await rt.discover()
        old = status_of(body)
        merged = {**body, "status": {**old, **rt.written.get(uid, {})}}
        # The timer is a safety net: skip it when another trigger reconciled the object less than half an
        # interval ago, or when none has yet (kopf runs the object's create or resume handler, which is still
        # queued): under a backlog, timers would otherwise reconcile everything twice. A running TrainingJob's
        # tick is never skipped: it reads rank 0's status.
        last = rt.last_done.get(uid)
        settled = last is None or time.monotonic() - last < rt.config.timer_interval_seconds / 2
        if trigger == "timer" and settled and merged["status"].get("phase") != "Running":
            return
        api = start_api_timer()
        started = time.perf_counter()
        result: str = "ok"
        error: ReconcileError | ApiError | None = None
        try:
            outcome = await reconcile(merged, rt)
        except ReconcileError as err:
            outcome, result, error = err.outcome, "error", err
        except ApiError as err:
            outcome, result, error = ReconcileOutcome(), "error", err
            outcome.event("Warning", "ApiError", str(err)[:500])
        total = time.perf_counter() - started
        observe(kind, trigger, result, total, max(0.0, total - api.seconds), outcome.compute_seconds, outcome.applied)
        rt.last_done[uid] = time.monotonic()
        current = merged["status"]
        changed = {k: v for k, v in outcome.status.items() if current.get(k) != v}
        if changed:
            patch.setdefault("status", {}).update(changed)
            rt.written[uid] = {**rt.written.get(uid, {}), **changed}
        _post(body, outcome)
        if error is not None:
            transient = getattr(error, "transient", True)
            ERRORS.labels(kind, type(error).__name__).inc()
            if transient:
                raise kopf.TemporaryError(str(error)[:500], delay=RETRY_DELAY)
            raise kopf.PermanentError(str(error)[:500])


async def _isvc(body: Mapping[str, Any], rt: Runtime) -> ReconcileOutcome:
    return await reconcile_inferenceservice(body, rt.kube(), rt.config, now_iso())


def _tj(read: bool) -> Reconciler:
    async def _run(body: Mapping[str, Any], rt: Runtime) -> ReconcileOutcome:
        return await reconcile_trainingjob(body, rt.kube(), rt.config, now_iso(), rt.reader() if read else None)

    return _run


def _register(resource: tuple[str, str, str], kind: str, name: str, on_change: Reconciler,
              on_tick: Reconciler) -> Callable[..., Awaitable[None]]:
    """create/update/resume handlers and a timer for one kind, all running its reconcile; returns the timer.

    The handler ids (kopf keeps progress under them) are those of the module-level functions this replaced."""

    async def reconcile_handler(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, reason: str, **_: Any) -> None:
        await run_reconcile(kind, str(reason), body, patch, memo, on_change)

    async def timer(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        await run_reconcile(kind, "timer", body, patch, memo, on_tick)

    for on in (kopf.on.update, kopf.on.create, kopf.on.resume):
        on(*resource, id=f"reconcile_{name}_handler")(reconcile_handler)
    kopf.timer(*resource, id=f"{name}_timer", interval=TIMER_INTERVAL, initial_delay=TIMER_INTERVAL)(timer)
    return timer


inferenceservice_timer = _register(ISVC, "InferenceService", "inferenceservice", _isvc, _isvc)
# The timer's tick also reads rank 0's /status while the job runs.
trainingjob_timer = _register(TJ, "TrainingJob", "trainingjob", _tj(read=False), _tj(read=True))


# ---- children: a change made by someone else (a controller's status, a hand edit or deletion) reconciles
# the owner right away instead of at the next timer tick.
OWNER_KINDS = {"InferenceService": _isvc, "TrainingJob": _tj(read=False)}
MANAGED = {MANAGED_BY_LABEL: MANAGED_LABELS[MANAGED_BY_LABEL]}


async def on_child_event(event: Mapping[str, Any], memo: Any) -> None:
    rt = runtime(memo)
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    owner = next(
        (r for r in meta.get("ownerReferences") or [] if r.get("controller") and r.get("kind") in OWNER_KINDS), None
    )
    if owner is None or event.get("type") is None:
        return
    key = (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
    if event.get("type") != "DELETED" and rt.applied_rv.get(key) == meta.get("resourceVersion"):
        return  # our own write
    if event.get("type") == "DELETED":
        rt.applied_rv.pop(key, None)
    if rt.client is not None:
        rt.client.forget(*key)  # someone else changed or deleted it: the next reconcile re-applies it
    uid = str(owner.get("uid"))
    if uid in rt.pending:
        return
    rt.pending.add(uid)
    try:
        async with rt.locks.setdefault(uid, asyncio.Lock()):
            pass  # wait for a running reconcile of the owner to finish before reading it
        rt.pending.discard(uid)
        if event.get("type") != "DELETED" and rt.applied_rv.get(key) == meta.get("resourceVersion"):
            return  # that reconcile wrote this very version
        kind = str(owner["kind"])
        ns = meta.get("namespace")
        try:
            body = await rt.kube().get(str(owner["apiVersion"]), kind, ns, str(owner["name"]))
        except ApiError as err:
            log.warning("cannot read owner %s/%s of %s: %s", kind, owner.get("name"), key, err)
            return
        if body is None or (body.get("metadata") or {}).get("uid") != uid:
            return
        patch: dict[str, Any] = {}
        try:
            await run_reconcile(kind, "child", body, patch, memo, OWNER_KINDS[kind])
        except (kopf.TemporaryError, kopf.PermanentError) as err:
            log.warning("reconcile of %s/%s after a child change failed: %s", kind, owner.get("name"), err)
        if patch.get("status"):
            try:
                await rt.kube().merge_patch(
                    str(owner["apiVersion"]), kind, ns, str(owner["name"]), {"status": patch["status"]}, "status"
                )
            except ApiError as err:
                log.warning("status of %s/%s not written: %s", kind, owner.get("name"), err)
    finally:
        rt.pending.discard(uid)


# Deployments and Jobs: the children whose status feeds the owner's status (and restarts). Other kinds
# deleted or edited by hand are restored by the next timer tick; watching them too would double the
# watch traffic at scale for little gain.
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
async def child_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await on_child_event(event, memo)


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event(*ISVC, when=_deleted)
@kopf.on.event(*TJ, when=_deleted)
async def _forget(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Drop per-object state. Children go by owner references: no finalizer is needed."""
    rt = runtime(memo)
    uid = str(body.get("metadata", {}).get("uid", ""))
    rt.locks.pop(uid, None)
    rt.written.pop(uid, None)
    rt.last_done.pop(uid, None)


def configure_timers(interval: float, registry: kopf.OperatorRegistry | None = None) -> None:
    """Set our timers' interval, and let them run without a finalizer.

    kopf gives every timer a finalizer so it can stop it before the object goes; ours only reconcile, so a
    deleted CR needs no cleanup and must not hang on a stopped operator. kopf handlers are frozen
    dataclasses: replace them in the registry (a private list; checked by the integration tests).
    """
    reg = registry or kopf.get_default_registry()
    ours = {inferenceservice_timer, trainingjob_timer}
    handlers: list[Any] = reg._spawning._handlers
    for i, handler in enumerate(handlers):
        if getattr(handler, "fn", None) in ours:
            handlers[i] = dataclasses.replace(
                handler, requires_finalizer=False, interval=interval, initial_delay=interval
            )
        elif type(handler).__name__ == "TimerHandler" and handler.requires_finalizer:
            # Other timers in this process (the autoscaler's) clean nothing up either: no finalizer.
            handlers[i] = dataclasses.replace(handler, requires_finalizer=False)


configure_timers(TIMER_INTERVAL)
