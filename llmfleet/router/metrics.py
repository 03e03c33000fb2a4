"""Prometheus metrics of the router (prefix llmfleet_router_), one registry per router instance.

Counters and histograms are updated on every request, on the event loop's thread only: they are plain
Python numbers here (`Counter`, `Histogram` below: no lock, a C bisect per observation), exposed as the same
Prometheus families as prometheus_client's classes (`name_total`; `_bucket`/`_count`/`_sum`) when the
registry is collected. prometheus_client's locked values cost a sixth of the router's Python time per
request. Gauges (set by the health loop and at scrape time) stay prometheus_client's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
_OVERHEAD = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3)


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative), the last one +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # the first bucket whose bound is >= amount (le)
        self.sum += amount


class _Family(Collector):
    """A labelled counter or histogram family; `labels(*values)` gives its child (with no labels: the family
    itself answers `inc`/`observe`)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry,
                 buckets: Sequence[float] | None = None) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.bounds = None if buckets is None else tuple(float(b) for b in buckets if b != float("inf"))
        self.children: dict[tuple[str, ...], Any] = {}
        # without labels: the one child, exposed from the start at zero (as prometheus_client does)
        self._only = self.labels() if not self.labelnames else None
        registry.register(self)

    def labels(self, *values: str) -> Any:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = _CounterChild() if self.bounds is None else _HistogramChild(self.bounds)
        return child

    def inc(self, amount: float = 1.0) -> None:
        (self._only or self.labels()).inc(amount)

    def observe(self, amount: float) -> None:
        (self._only or self.labels()).observe(amount)

    def collect(self) -> Iterator[Any]:
        if self.bounds is None:
            fam: Any = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
            for values, c in self.children.items():
                fam.add_metric(values, c.value)
        else:
            fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
            les = [floatToGoString(b) for b in (*self.bounds, float("inf"))]  # type: ignore[no-untyped-call]
            for values, h in self.children.items():
                cum, buckets = 0.0, []
                for le, n in zip(les, h.counts, strict=True):
                    cum += n
                    buckets.append((le, cum))
                fam.add_metric(values, buckets, h.sum)
        yield fam


def Counter(name: str, documentation: str, labelnames: Sequence[str] = (), *,  # noqa: N802 - prometheus_client's name
            registry: CollectorRegistry) -> Any:
    return _Family(name, documentation, labelnames, registry)


def Histogram(name: str, documentation: str, labelnames: Sequence[str] = (), *,  # noqa: N802
              buckets: Sequence[float], registry: CollectorRegistry) -> Any:
    return _Family(name, documentation, labelnames, registry, buckets)


# The powers of a request's prompt tokens the router sums (llmfleet_router_input_tokens_power_total{power}); the
# first is the input-token histogram's _sum.
INPUT_TOKEN_POWERS = (2, 3, 4)


class LatencyChildren(NamedTuple):
    """The per-(pool, model) histograms observed at the end of every request."""

    e2e: Any
    input_tokens: Any
    output_tokens: Any
    ttft: Any
    tpot: Any
    input_powers: tuple[Any, ...]  # Σ input_tokens^k for k in INPUT_TOKEN_POWERS


class RouterMetrics:
    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._latency: dict[tuple[str, str], LatencyChildren] = {}
        r = self.registry = CollectorRegistry()
        pm = ["pool", "model"]
        self.requests = Counter("llmfleet_router_requests", "Requests by outcome (pool that served, degraded or not).",
                                ["pool", "model", "endpoint", "status", "degraded"], registry=r)
        self.input_tokens = Histogram("llmfleet_router_input_tokens", "Prompt tokens per request.", pm,
                                      buckets=(16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 131072), registry=r)
        # The histogram's buckets are too coarse for the spread of prefill times (attention makes a prefill grow as
        # L + r*L^2, so its variance needs E[L^2..L^4]): exact sums of the powers, read by the autoscaler
        # (capacity.prefill_time_scv). Float counters hold 131k-token prompts to the fourth power without overflow.
        self.input_token_powers = Counter("llmfleet_router_input_tokens_power",
                                          "Sum over requests of prompt tokens raised to `power`.", [*pm, "power"],
                                          registry=r)
        self.output_tokens = Histogram("llmfleet_router_output_tokens", "Output tokens per request.", pm,
                                       buckets=(1, 4, 16, 64, 128, 256, 512, 1024, 4096), registry=r)
        self.ttft = Histogram("llmfleet_router_ttft_seconds", "Time to first token: streaming requests only (a non-streaming response arrives whole, at the end).", pm,
                              buckets=_LAT, registry=r)
        self.tpot = Histogram("llmfleet_router_tpot_seconds", "Time per output token: (last chunk - first chunk) / (tokens - 1), streaming requests only.", pm,
                              buckets=_TPOT, registry=r)
        self.e2e = Histogram("llmfleet_router_e2e_seconds", "End-to-end latency.", pm, buckets=_LAT, registry=r)
        self.overhead = Histogram("llmfleet_router_overhead_seconds",
                                  "Router time before the upstream request is sent (parse, auth, route).",
                                  buckets=_OVERHEAD, registry=r)
        self.route_decision = Histogram("llmfleet_router_route_decision_seconds",
                                        "Prefix hashing plus the plugin pipeline.", buckets=_OVERHEAD, registry=r)
        self.affinity_hits = Counter("llmfleet_router_prefix_affinity_hits",
                                     "Requests sent to a replica believed to hold some of their prefix.", ["pool"],
                                     registry=r)
        self.prefix_blocks = Counter("llmfleet_router_prefix_blocks", "Prompt blocks routed (matched or not).",
                                     ["pool", "matched"], registry=r)
        self.session_hits = Counter("llmfleet_router_session_affinity_hits", "Requests kept on their session's replica.",
                                    ["pool"], registry=r)
        self.fallbacks = Counter("llmfleet_router_fallbacks", "Requests sent to a student pool.", ["pool", "reason"],
                                 registry=r)
        self.degraded = Counter("llmfleet_router_degraded_requests", "Requests served degraded.", ["tenant"], registry=r)
        # The promotion rollback's error rate: error / all, per pool. Every try counts, retried ones included, so
        # one failing replica among healthy ones shows although the retries hide it from clients.
        self.upstream_attempts = Counter(
            "llmfleet_router_upstream_attempts",
            "Requests sent to a replica, by outcome: ok, error (HTTP 5xx, connection failure, timeout, broken "
            "stream) or overloaded (HTTP 429).", ["pool", "outcome"], registry=r)
        self.stream_errors = Counter(
            "llmfleet_router_stream_errors",
            "Streams a replica failed after their first byte (cut, timed out): ended with an OpenAI-style error "
            "event and no [DONE].", ["pool", "replica"], registry=r)
        self.outlier_ejections = Counter(
            "llmfleet_router_outlier_ejections",
            "Replicas taken out of rotation by outlier detection, by reason: failures (in a row) or slow.",
            ["pool", "replica", "reason"], registry=r)
        self.replica_ejected = Gauge("llmfleet_router_replica_ejected", "1 while ejected as an outlier.",
                                     ["pool", "replica"], registry=r)
        self.server_timeouts = Counter(
            "llmfleet_router_client_timeouts",
            "Client connections closed by the server's deadlines: header (request headers too slow), body "
            "(request body too slow).", ["phase"], registry=r)
        self.held_requests = Gauge("llmfleet_router_held_requests",
                                   "Requests waiting for a pool at zero replicas to get one (scale from zero).",
                                   ["pool"], registry=r)
        self.retries = Counter("llmfleet_router_retries", "Retries on another replica before the first byte.",
                               ["pool"], registry=r)
        self.lookups = Counter("llmfleet_router_lookups", "Feature-store lookups.", ["result"], registry=r)
        self.adapter_loads = Counter("llmfleet_router_adapter_loads", "LoRA adapter loads and unloads on replicas.",
                                     ["adapter", "outcome"], registry=r)
        self.rejected = Counter("llmfleet_router_rejected", "Requests rejected at the router.", ["reason"], registry=r)
        self.client_disconnects = Counter("llmfleet_router_client_disconnects", "Clients gone before the end.",
                                          ["pool"], registry=r)
        self.in_flight = Gauge("llmfleet_router_in_flight", "Open upstream requests.", ["pool", "replica"], registry=r)
        self.replica_up = Gauge("llmfleet_router_replica_up", "1 healthy, 0 not.", ["pool", "replica"], registry=r)
        self.replica_draining = Gauge("llmfleet_router_replica_draining", "1 while draining.", ["pool", "replica"],
                                      registry=r)
        self.replica_stale = Gauge("llmfleet_router_replica_stale", "1 when scraped load is stale.",
                                   ["pool", "replica"], registry=r)
        self.exclusive_blocks = Gauge("llmfleet_router_replica_exclusive_blocks",
                                      "Indexed prefix blocks only this replica holds (lost if it scales in).",
                                      ["pool", "replica"], registry=r)
        self.kv_events = Counter("llmfleet_router_kv_events", "vLLM KV-cache events applied to the prefix index.",
                                 ["pool"], registry=r)
        self.index_blocks = Gauge("llmfleet_router_prefix_index_blocks", "Entries in the prefix index.", ["pool"],
                                  registry=r)

    def child(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), memoized: the hot path calls this several times per request."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def latency_children(self, pool: str, model: str) -> LatencyChildren:
        h = self._latency.get((pool, model))
        if h is None:
            h = self._latency[(pool, model)] = LatencyChildren(
                self.e2e.labels(pool, model), self.input_tokens.labels(pool, model),
                self.output_tokens.labels(pool, model), self.ttft.labels(pool, model), self.tpot.labels(pool, model),
                tuple(self.input_token_powers.labels(pool, model, str(k)) for k in INPUT_TOKEN_POWERS))
        return h
