"""One request's state on its way through the router, and where its outcome is recorded.

`RequestContext` is built once per request by the server and handed to the proxy (`proxy.py`) or the
feature-store answer (`store_response.py`); `Accounting` records the end of every request that reached a
replica or the store: metrics, the fallback policy's SLO window (through `dispatch.on_done`), the request
log. Below both `server.py` and `proxy.py`, so the proxy never sees the server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from llmfleet.router.dispatch import Latency, on_done, record_attempt
from llmfleet.router.fallback import FallbackPolicy
from llmfleet.router.metrics import INPUT_TOKEN_POWERS, RouterMetrics
from llmfleet.router.outliers import OutlierDetector
from llmfleet.router.plugins.base import RequestInfo
from llmfleet.router.request_log import RequestLog
from llmfleet.router.requests import ParsedRequest
from llmfleet.router.respond import ClientRequest, Responder

log = logging.getLogger("llmfleet.router")


@dataclass(slots=True)
class RequestContext:
    """What the router knows about one request once it is parsed and routed to a pool."""

    request: ClientRequest
    out: Responder  # where the answer goes
    parsed: ParsedRequest
    tenant: str
    t0: float  # perf_counter at arrival
    body: bytes = b""  # what is sent upstream (the client's bytes unless the model name was rewritten)
    pool: str = ""
    degraded: bool = False
    input_tokens: int = 0
    info: RequestInfo | None = None  # the request as the plugins saw it (carries the prefill charge)
    headers: dict[str, str] = field(default_factory=dict)  # response headers for the client (x-llmfleet-*)
    replica: str = ""  # the replica of the current attempt ("" before any, or for a feature-store answer)
    t_sent: float = 0.0  # perf_counter when the current attempt was sent


class Accounting:
    """The end of a request: counters and histograms by pool and model, the fallback policy's latency windows
    (the primary pools' SLO window; the student pools' end-to-end latency, which prices their queues), the
    request log; the end of every attempt: the pool's outlier detector."""

    def __init__(self, metrics: RouterMetrics, policy: FallbackPolicy | None = None,
                 request_log: RequestLog | None = None, primary_pools: Collection[str] = (),
                 replica_pools: Collection[str] = (), outliers: Mapping[str, OutlierDetector] | None = None) -> None:
        self.metrics = metrics
        self.policy = policy
        self.request_log = request_log
        self.primary_pools = frozenset(primary_pools)
        self.replica_pools = frozenset(replica_pools)  # pools of replicas (not the feature store's answers)
        self.outliers = dict(outliers or {})

    def attempt_ended(self, pool: str, replica: str, *, failed: bool, seconds: float = 0.0,
                      output_tokens: int = 0) -> None:
        """One attempt on `replica` ended: the outlier detector learns it (and may eject the replica: one log
        line, the ejection counter and gauge)."""
        now = time.monotonic()
        for e in record_attempt(self.outliers.get(pool), replica, now, failed=failed, seconds=seconds,
                                output_tokens=output_tokens):
            log.warning("pool %s: replica %s ejected for %.0f s (%s: %s)", pool, e.replica, e.until - now, e.reason,
                        e.detail)
            self.metrics.child(self.metrics.outlier_ejections, pool, e.replica, e.reason).inc()
            self.metrics.child(self.metrics.replica_ejected, pool, e.replica).set(1)

    def finish(self, ctx: RequestContext, status: int, input_tokens: int, output_tokens: int, ttft: float | None,
               tpot: float | None, e2e: float) -> None:
        """Record a request that reached a replica or the store (seconds; ttft/tpot None when not seen)."""
        m = self.metrics
        pool, model = ctx.pool, ctx.parsed.model
        m.child(m.requests, pool, model, ctx.parsed.endpoint, str(status), "true" if ctx.degraded else "false").inc()
        if pool in self.replica_pools:  # a replica answered (502: its stream broke mid-response): the error rate
            m.child(m.upstream_attempts, pool, "error" if status >= 500 else "ok").inc()
            if ctx.replica and (status < 400 or status >= 500):  # not 499 (the client left) nor the client's 4xx
                self.attempt_ended(pool, ctx.replica, failed=status >= 500, seconds=ctx.t0 + e2e - ctx.t_sent,
                                   output_tokens=output_tokens)
        if status < 400:
            h = m.latency_children(pool, model)
            h.e2e.observe(e2e)
            h.input_tokens.observe(input_tokens)
            for k, power_sum in zip(INPUT_TOKEN_POWERS, h.input_powers, strict=True):
                power_sum.inc(float(input_tokens) ** k)
            h.output_tokens.observe(output_tokens)
            if ttft is not None:
                h.ttft.observe(ttft)
            if tpot is not None:
                h.tpot.observe(tpot)
            if pool in self.primary_pools or pool in self.replica_pools:  # a student pool's latency prices its queue
                on_done(None, None, self.policy, Latency(None if ttft is None else ttft * 1000,
                                                          None if tpot is None else tpot * 1000, e2e * 1000),
                        student_pool=None if pool in self.primary_pools else pool)
        if self.request_log is not None:
            self.request_log.write(tenant=ctx.tenant, model=model, parsed=ctx.parsed, input_tokens=input_tokens,
                                   output_tokens=output_tokens, pool=pool, degraded=ctx.degraded, ttft=ttft, e2e=e2e,
                                   status=status)

    def client_gone(self, pool: str) -> None:
        self.metrics.child(self.metrics.client_disconnects, pool).inc()
