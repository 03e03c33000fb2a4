"""The routing core: pick a pool, pick a replica, commit the choice, and the request's first byte and end.

Pure and synchronous (no I/O, no clock of its own unless `now` is left out), so the router's HTTP server
(`server.py`, `proxy.py`) and the simulator (`sim/routers.py`) run the same decisions on the same state:

    decision = pick_pool(policy, now, primary, students, ...)   # only for a primary pool with students
    choice = pick_replica(pipeline, info, replicas, tried,     # plugins' filters, scorers, picker;
                          outliers, now)                        #   ejected outliers left out
    commit(pipeline, info, choice.replica)                      # once the request is on its way
    on_first_byte(info, now)                                    # the replica is through the prefill
    on_done(info, now, policy, latency)                         # release what routing charged; SLO window
    record_attempt(outliers, replica, now, ...)                 # passive health: may eject the replica

`info` is the request as the plugins see it (`RequestInfo`); it carries the prefill charged at routing
(estimated-ttft scorer) until the first byte or the end releases it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

from llmfleet.router.fallback import FallbackDecision, FallbackPolicy, FallbackSignals
from llmfleet.router.outliers import Ejection, OutlierDetector
from llmfleet.router.plugins.base import Pipeline, ReplicaState, RequestInfo, RoutingDecision, release_prefill


class Latency(NamedTuple):
    """A finished request's latencies in milliseconds (ttft/tpot None when not seen: non-streaming)."""

    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float


def pick_pool(policy: FallbackPolicy, now: float, primary: FallbackSignals, students: Sequence[FallbackSignals], *,
              tenant: str, input_tokens: int, request_class: str | None) -> FallbackDecision:
    """The fallback policy's choice between the primary pool and its students, recorded in the tenant's window
    (the degraded-fraction cap counts it)."""
    decision = policy.decide(now, primary, list(students), tenant=tenant, input_tokens=input_tokens,
                             request_class=request_class)
    policy.record(now, tenant, decision, input_tokens=input_tokens)
    return decision


def pick_replica(pipeline: Pipeline, info: RequestInfo, replicas: Iterable[ReplicaState],
                 tried: Collection[str] = (), outliers: OutlierDetector | None = None,
                 now: float | None = None) -> RoutingDecision:
    """The pool pipeline's choice among `replicas` not yet `tried` (earlier attempts of this request) and not
    ejected by `outliers` (whose due ejections end at `now` first). When every replica left is ejected, the
    ejected ones are candidates again: an outlier is a better answer than none.
    Nothing is learned yet: `commit` does that once the request is sent."""
    ejected: Collection[str] = ()
    if outliers is not None:
        if now is not None:
            outliers.release_due(now)
        ejected = outliers.ejected
    if tried or ejected:
        cands: Sequence[ReplicaState] = [r for r in replicas if r.id not in tried and r.id not in ejected]
        if not cands and ejected:
            cands = [r for r in replicas if r.id not in tried]
    else:  # (no isinstance check against the Sequence ABC: it cost more than the rest of this function)
        cands = replicas if isinstance(replicas, list) else list(replicas)
    return pipeline.pick(info, cands, commit=False)


def record_attempt(outliers: OutlierDetector | None, replica: str, now: float, *, failed: bool,
                   seconds: float = 0.0, output_tokens: int = 0) -> Sequence[Ejection]:
    """One attempt on `replica` ended (failed, or served `output_tokens` in `seconds`): the outlier detector's
    ejections it causes (none without a detector)."""
    if outliers is None:
        return ()
    return outliers.record(replica, now, failed=failed, seconds=seconds, output_tokens=output_tokens)


def commit(pipeline: Pipeline, info: RequestInfo, replica: ReplicaState) -> None:
    """The request went to `replica`: the plugins learn it (prefix index insert, session pin)."""
    pipeline.commit(info, replica)


def on_first_byte(info: RequestInfo | None, now: float | None = None) -> None:
    """The replica answered the first byte: its queue of prefill work shrinks by this request's."""
    if info is not None:
        release_prefill(info, now)


def on_done(info: RequestInfo | None, now: float | None = None, policy: FallbackPolicy | None = None,
            latency: Latency | None = None, student_pool: str | None = None) -> None:
    """The request (or this attempt of it) ended. Releases a prefill charge no first byte released
    (idempotent); with `policy` and the `latency` of a request the primary pool served, feeds the policy's SLO
    window (`student_pool`: served by that student pool, which prices its queue). `now` None: time.monotonic()
    (the production clock; the simulator passes its own)."""
    if info is not None:
        release_prefill(info, now, first_byte=False)
    if policy is not None and latency is not None:
        t = time.monotonic() if now is None else now
        if student_pool is None:
            policy.observe_primary(t, latency.ttft_ms, latency.tpot_ms, latency.e2e_ms)
        else:
            policy.observe_student(student_pool, t, latency.ttft_ms, latency.tpot_ms, latency.e2e_ms)
