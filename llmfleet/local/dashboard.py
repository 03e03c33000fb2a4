"""Live numbers for `llmfleet up`: scraped from the replicas' vLLM /metrics and the router's /metrics.

Windowed values come from the difference of two scrapes (counters and histogram buckets), so they
describe the last few seconds, not the whole run. Values that could not be scraped are None (shown "-").
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmfleet.util.prom_text import Sample, parse_samples

Samples = dict[Sample, float]


def total(snap: Samples, name: str) -> float | None:
    vals = [v for (n, _), v in snap.items() if n == name]
    return sum(vals) if vals else None


def buckets(snap: Samples, name: str) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for (n, labels), v in snap.items():
        if n == name + "_bucket":
            le = dict(labels).get("le", "+Inf")
            out[math.inf if le == "+Inf" else float(le)] += v
    return dict(out)


def quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus-style histogram_quantile over cumulative bucket counts (linear within a bucket)."""
    if not cumulative:
        return None
    bounds = sorted(cumulative)
    count = cumulative[bounds[-1]]
    if count <= 0:
        return None
    rank, prev_b, prev_c = q * count, 0.0, 0.0
    for b in bounds:
        c = cumulative[b]
        if c >= rank:
            if math.isinf(b):
                return prev_b
            return prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0.0)
        prev_b, prev_c = b, c
    return prev_b


def _delta(cur: Mapping[float, float], prev: Mapping[float, float]) -> dict[float, float]:
    return {b: max(0.0, v - prev.get(b, 0.0)) for b, v in cur.items()}


@dataclass
class Window:
    """Service-wide numbers over the last scrape interval."""

    qps: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    hit_rate: float | None = None
    degraded_fraction: float | None = None
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None


@dataclass
class Collector:
    """Keeps the previous scrape and turns two scrapes into a Window."""

    prev: Samples | None = None
    prev_router: Samples | None = None
    prev_t: float = 0.0
    history: list[tuple[float, Window]] = field(default_factory=list)

    def update(self, replica_texts: Iterable[str], router_text: str | None, now: float | None = None) -> Window:
        now = time.time() if now is None else now
        merged: Samples = {}
        for i, text in enumerate(replica_texts):
            for (name, labels), v in parse_samples(text).items():
                merged[(name, (*labels, ("_replica", str(i))))] = v
        router = parse_samples(router_text) if router_text else {}
        w = Window()
        w.running = total(merged, "vllm:num_requests_running")
        w.waiting = total(merged, "vllm:num_requests_waiting")
        kv = [v for (n, _), v in merged.items() if n == "vllm:kv_cache_usage_perc"]
        w.kv_usage = max(kv) if kv else None
        if self.prev is not None and now > self.prev_t:
            dt = now - self.prev_t
            ok, ok0 = total(merged, "vllm:request_success_total"), total(self.prev, "vllm:request_success_total")
            if ok is not None and ok0 is not None:
                w.qps = max(0.0, ok - ok0) / dt
            h, h0 = total(merged, "vllm:prefix_cache_hits_total"), total(self.prev, "vllm:prefix_cache_hits_total")
            qy, qy0 = total(merged, "vllm:prefix_cache_queries_total"), total(self.prev, "vllm:prefix_cache_queries_total")
            if None not in (h, h0, qy, qy0) and (qy - qy0) > 0:  # type: ignore[operator]
                w.hit_rate = (h - h0) / (qy - qy0)  # type: ignore[operator]
            ttft = _delta(buckets(merged, "vllm:time_to_first_token_seconds"),
                          buckets(self.prev, "vllm:time_to_first_token_seconds"))
            tpot = _delta(buckets(merged, "vllm:inter_token_latency_seconds"),
                          buckets(self.prev, "vllm:inter_token_latency_seconds"))
            w.ttft_p50_ms, w.ttft_p95_ms = _ms(quantile(0.5, ttft)), _ms(quantile(0.95, ttft))
            w.tpot_p50_ms, w.tpot_p95_ms = _ms(quantile(0.5, tpot)), _ms(quantile(0.95, tpot))
        if self.prev_router is not None and router:
            d = total(router, "llmfleet_router_degraded_requests_total")
            d0 = total(self.prev_router, "llmfleet_router_degraded_requests_total")
            r = total(router, "llmfleet_router_requests_total")
            r0 = total(self.prev_router, "llmfleet_router_requests_total")
            if r is not None and r0 is not None and r - r0 > 0:
                w.degraded_fraction = max(0.0, (d or 0.0) - (d0 or 0.0)) / (r - r0)
        self.prev, self.prev_router, self.prev_t = merged, (router or None), now
        self.history.append((now, w))
        return w


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1000.0


def fmt(v: float | None, spec: str = ".0f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


async def scrape_texts(urls: Iterable[str], timeout_s: float = 1.5) -> list[str]:
    import asyncio

    import httpx

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        async def one(u: str) -> str | None:
            try:
                r = await client.get(u.rstrip("/") + "/metrics")
            except httpx.HTTPError:
                return None
            return r.text if r.status_code == 200 else None
        got = await asyncio.gather(*(one(u) for u in urls))
    return [t for t in got if t is not None]


def _replica_status(r: Mapping[str, Any]) -> str:
    gpus = f" GPU {','.join(r['devices'])}" if r.get("devices") else ""
    if r["ready"]:
        return f"[green]ready[/]{gpus}"
    if r["running"]:
        return f"[yellow]starting[/]{gpus}"
    return "[red]waits for a GPU[/]" if r.get("waiting_for") else "[dim]off[/]"


def render(state: Mapping[str, Any], w: Window | None) -> Any:
    """A rich renderable: the endpoint, pools and replicas, live metrics, recent events."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    head = f"[bold]{state.get('name')}[/] at [cyan]{state.get('url')}/v1[/]   run folder {state.get('runDir')}"
    pools = Table(title="pools", expand=True)
    for col in ("pool", "desired", "ready", "replicas (port: status)", "restarts"):
        pools.add_column(col)
    by_pool: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in state.get("replicas", []):
        by_pool[r["pool"]].append(r)
    for pool, rs in by_pool.items():
        cells = [f"{r['port']}: " + _replica_status(r) for r in rs if r["running"] or r["wanted"]]
        pools.add_row(pool, str(state.get("desired", {}).get(pool, "?")), str(sum(1 for r in rs if r["ready"])),
                      "  ".join(cells) or "-", str(sum(r["restarts"] for r in rs)))
    m = Table(title="last interval", expand=True)
    for col in ("qps", "TTFT p50/p95 ms", "TPOT p50/p95 ms", "prefix hit rate", "KV usage", "running/waiting",
                "degraded"):
        m.add_column(col)
    w = w or Window()
    m.add_row(fmt(w.qps, ".2f"), f"{fmt(w.ttft_p50_ms)} / {fmt(w.ttft_p95_ms)}",
              f"{fmt(w.tpot_p50_ms, '.1f')} / {fmt(w.tpot_p95_ms, '.1f')}",
              fmt(None if w.hit_rate is None else w.hit_rate * 100, ".0f", "%"),
              fmt(None if w.kv_usage is None else w.kv_usage * 100, ".0f", "%"),
              f"{fmt(w.running)}/{fmt(w.waiting)}",
              fmt(None if w.degraded_fraction is None else w.degraded_fraction * 100, ".0f", "%"))
    events = "\n".join(time.strftime("%H:%M:%S ", time.localtime(e["ts"])) + e["message"]
                       for e in state.get("events", [])[-6:])
    return Group(head, pools, m, Panel(events or "-", title="events"))
