"""Operator metrics (llmfleet_operator_*), in their own registry served on --metrics-port."""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "llmfleet_operator_reconcile_total", "Reconciles by kind, trigger and result.", ["kind", "trigger", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "llmfleet_operator_reconcile_duration_seconds", "Wall time of one reconcile, API round trips included.", ["kind"],
    registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILE_CPU_SECONDS = Histogram(
    "llmfleet_operator_reconcile_compute_seconds",
    "CPU time inside one reconcile (validate, render, status): no API round trips, no event-loop waits.",
    ["kind"],
    registry=REGISTRY, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
ERRORS = Counter(
    "llmfleet_operator_reconcile_errors_total", "Failed reconciles by kind and reason.", ["kind", "reason"],
    registry=REGISTRY,
)
APPLIED = Counter(
    "llmfleet_operator_objects_applied_total", "Children applied by server-side apply.", ["kind"], registry=REGISTRY,
)

# Exact recent samples of (kind, compute s, wall s excluding API waits, wall s), for the scale benchmark.
SAMPLES: deque[tuple[str, float, float, float]] = deque(maxlen=200_000)


def observe(kind: str, trigger: str, result: str, total: float, local: float, compute: float, applied: int) -> None:
    RECONCILES.labels(kind, trigger, result).inc()
    RECONCILE_SECONDS.labels(kind).observe(total)
    RECONCILE_CPU_SECONDS.labels(kind).observe(compute)
    if applied:
        APPLIED.labels(kind).inc(applied)
    SAMPLES.append((kind, compute, local, total))
