"""Prometheus metrics of the feature store (prefix llmfleet_store_), created once per process."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from prometheus_client import Counter, Gauge, Histogram


@dataclass(frozen=True)
class StoreMetrics:
    lookups: Counter
    lookup_seconds: Histogram
    errors: Counter
    cache_hits: Counter
    index_vectors: Gauge
    fast_path_fallbacks: Counter
    generated: Counter


@lru_cache(maxsize=1)
def store_metrics() -> StoreMetrics:
    return StoreMetrics(
        lookups=Counter("llmfleet_store_lookups_total", "Feature-store lookups by kind and result.",
                        ["kind", "result"]),
        lookup_seconds=Histogram(
            "llmfleet_store_lookup_seconds", "Time of one online lookup, deadline included.",
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
        ),
        errors=Counter("llmfleet_store_lookup_errors_total",
                       "Lookups that failed open (timeout, database error, busy, ...).", ["reason"]),
        cache_hits=Counter("llmfleet_store_cache_hits_total", "Lookups answered by the in-process LRU."),
        index_vectors=Gauge("llmfleet_store_index_vectors", "Vectors in the in-memory semantic index."),
        fast_path_fallbacks=Counter("llmfleet_store_fast_path_fallbacks_total",
                                    "Exact lookups SQLite could not answer on the event loop (a lock, or the "
                                    "on-loop budget spent) and handed to the thread pool.", ["reason"]),
        generated=Counter("llmfleet_store_generated_total", "Offline generation items by stage and result.",
                          ["stage", "result"]),
    )
