"""The router's lock-free counters and histograms expose what prometheus_client's classes would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram

from llmfleet.router.metrics import Counter, Histogram, RouterMetrics

BUCKETS = (0.01, 0.1, 1.0)


def samples(registry: CollectorRegistry) -> set[str]:
    """Exposition lines without comments and prometheus_client's `_created` series."""
    return {line for line in generate_latest(registry).decode().splitlines()
            if line and not line.startswith("#") and "_created" not in line}


def test_same_series_and_values_as_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    c = Counter("x_requests", "doc", ["pool", "status"], registry=ours)
    pc = PromCounter("x_requests", "doc", ["pool", "status"], registry=theirs)
    h = Histogram("x_seconds", "doc", ["pool"], buckets=BUCKETS, registry=ours)
    ph = PromHistogram("x_seconds", "doc", ["pool"], buckets=BUCKETS, registry=theirs)
    u = Histogram("x_overhead", "doc", buckets=BUCKETS, registry=ours)
    pu = PromHistogram("x_overhead", "doc", buckets=BUCKETS, registry=theirs)
    assert samples(ours) == samples(theirs)  # an unlabelled histogram is there at zero from the start
    for value in (0.005, 0.01, 0.05, 1.0, 7.0):
        h.labels("p").observe(value)
        ph.labels("p").observe(value)
        u.observe(value)
        pu.observe(value)
    c.labels("p", "200").inc()
    c.labels("p", "200").inc(2)
    pc.labels("p", "200").inc(3)
    assert samples(ours) == samples(theirs)
    assert 'x_seconds_bucket{le="0.01",pool="p"} 2.0' in samples(ours)  # `le` is inclusive
    assert 'x_requests_total{pool="p",status="200"} 3.0' in samples(ours)


def test_router_metrics_child_is_memoized() -> None:
    m = RouterMetrics()
    assert m.child(m.requests, "p", "m", "chat", "200", "false") is m.child(m.requests, "p", "m", "chat", "200", "false")
