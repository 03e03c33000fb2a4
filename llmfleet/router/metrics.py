"""Prometheus metrics of the router (prefix llmfleet_router_), one registry per router instance."""

from __future__ import annotations

from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
_OVERHEAD = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3)


class LatencyChildren(NamedTuple):
    """The per-(pool, model) histograms observed at the end of every request."""

    e2e: Any
    input_tokens: Any
    output_tokens: Any
    ttft: Any
    tpot: Any


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
            h = self._latency[(pool, model)] = LatencyChildren(*(
                metric.labels(pool, model) for metric in (self.e2e, self.input_tokens, self.output_tokens, self.ttft,
                                                          self.tpot)))
        return h
