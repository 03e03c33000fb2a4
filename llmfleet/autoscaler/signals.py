"""Signals: per-pool PoolSignals from Prometheus (PromQL via prometheus-api-client) or by scraping directly.

Series read (router series are the llmfleet router's; `vllm:` are vLLM's own, passed through):

| signal               | series                                                                              |
|----------------------|-------------------------------------------------------------------------------------|
| arrival rate         | `llmfleet_router_requests_total{pool, degraded}` (counter)                          |
| TTFT / TPOT p95      | `llmfleet_router_ttft_seconds` / `llmfleet_router_tpot_seconds` (histograms), else   |
|                      | vLLM's `vllm:time_to_first_token_seconds` / `vllm:time_per_output_token_seconds`    |
| mean in/out tokens   | `llmfleet_router_input_tokens` / `llmfleet_router_output_tokens` (histogram sum/count) |
| prompt-length spread | `llmfleet_router_input_tokens_power_total{power="2"|"3"|"4"}` / the histogram's count  |
| degraded fraction    | `llmfleet_router_requests_total{degraded="true"}` / all                              |
| error rate           | `llmfleet_router_upstream_attempts_total{pool, outcome="error"}` / all outcomes      |
| held requests        | `llmfleet_router_held_requests{pool}` (gauge: waiting for a pool at zero replicas)   |
| queue-time p95       | `vllm:request_queue_time_seconds` (histogram: waiting before the prefill starts)     |
| queue, running       | `vllm:num_requests_waiting`, `vllm:num_requests_running` (gauges, summed per pool)   |
| KV utilization       | `vllm:kv_cache_usage_perc` (or the older `vllm:gpu_cache_usage_perc`), averaged      |
| prefix hit rate      | `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`                     |
| prefill/decode tok/s | `vllm:prompt_tokens_total` x (1 - hit rate), `vllm:generation_tokens_total`          |
| model shape          | `llmfleet:model_shape{dim}` (the serving wrapper's gauges, from config.json), where   |
|                      | every replica of the pool reports the same shape (one `count_values` query)          |

A pool is `stale` when the newest sample of its series is older than `stale_after_s`, or the
query fails: the policy then holds it (never scales it down).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llmfleet.api.contracts import (
    INFERENCESERVICE_LABEL,
    MODEL_SHAPE_DIM_LABEL,
    MODEL_SHAPE_METRIC,
    POOL_LABEL,
    prometheus_label,
)
from llmfleet.api.trainingjob import ModelShape
from llmfleet.autoscaler.policy import PoolSignals, Role
from llmfleet.plan.models import shape_from_dims
from llmfleet.router.metrics import INPUT_TOKEN_POWERS
from llmfleet.util.prom_text import Sample, parse_samples


@dataclass(frozen=True)
class PoolRef:
    """A pool to collect signals for, with what the runtime knows about its size."""

    name: str
    role: Role
    replicas: int
    ready_replicas: int


@dataclass(frozen=True)
class Selectors:
    """Label matchers (PromQL syntax without braces); `{service}`, `{namespace}` and `{pool}` are filled in.

    Defaults assume the usual Kubernetes relabelling (`labelmap` of pod labels), which turns the contract
    label `llmfleet.io/inferenceservice` into `llmfleet_io_inferenceservice`.
    """

    router: str = f'{prometheus_label(INFERENCESERVICE_LABEL)}="{{service}}"'
    replica: str = f'{prometheus_label(INFERENCESERVICE_LABEL)}="{{service}}",{prometheus_label(POOL_LABEL)}="{{pool}}"'


def build_queries(service: str, namespace: str, pool: str, role: Role, sel: Selectors, window: str) -> dict[str, str]:
    """PromQL per signal for one pool (pure; tested)."""
    r = sel.router.format(service=service, namespace=namespace, pool=pool)
    v = sel.replica.format(service=service, namespace=namespace, pool=pool)
    rp = f'{r},pool="{pool}"' if r else f'pool="{pool}"'
    total = f"sum(rate(llmfleet_router_requests_total{{{r}}}[{window}]))"
    # The primary is sized for the whole service's demand; a student for what it receives.
    arrival = total if role == "primary" else f"sum(rate(llmfleet_router_requests_total{{{rp}}}[{window}]))"

    def vs(name: str) -> str:
        """Selector of a vLLM series: its names contain ':', which some scrapers store escaped to '_'."""
        return "{" + f'__name__=~"vllm[:_]{name}",{v}' + "}"

    def q95(metric: str, sel_: str) -> str:
        # vLLM's names contain ':'; some scrapers store them escaped to '_': match both.
        name = f'__name__=~"{metric.replace("vllm:", "vllm[:_]")}_bucket"'
        return f"histogram_quantile(0.95, sum by (le) (rate({{{name},{sel_}}}[{window}]))) * 1000"

    def mean(metric: str) -> str:
        return f"sum(rate({metric}_sum{{{rp}}}[{window}])) / sum(rate({metric}_count{{{rp}}}[{window}]))"

    return {
        "arrival_rate": arrival,
        "degraded_fraction": f'sum(rate(llmfleet_router_requests_total{{{r},degraded="true"}}[{window}])) / {total}',
        "error_rate": (f'sum(rate(llmfleet_router_upstream_attempts_total{{{rp},outcome="error"}}[{window}])) / '
                       f"sum(rate(llmfleet_router_upstream_attempts_total{{{rp}}}[{window}]))"),
        "held_requests": f"sum(llmfleet_router_held_requests{{{rp}}})",
        "ttft_p95_ms": q95("llmfleet_router_ttft_seconds", rp),
        "tpot_p95_ms": q95("llmfleet_router_tpot_seconds", rp),
        "ttft_p95_ms_engine": q95("vllm:time_to_first_token_seconds", v),
        "queue_time_p95_ms": q95("vllm:request_queue_time_seconds", v),
        "tpot_p95_ms_engine": q95("vllm:time_per_output_token_seconds", v),
        "mean_input_tokens": mean("llmfleet_router_input_tokens"),
        "mean_output_tokens": mean("llmfleet_router_output_tokens"),
        **{f"input_tokens_power_{k}": (f'sum(rate(llmfleet_router_input_tokens_power_total{{{rp},power="{k}"}}[{window}])) / '
                                       f"sum(rate(llmfleet_router_input_tokens_count{{{rp}}}[{window}]))")
           for k in INPUT_TOKEN_POWERS},
        "queue_depth": f"sum({vs('num_requests_waiting')})",
        "min_queue_depth": f"min(min_over_time({vs('num_requests_waiting')}[{window}]))",
        "running": f"sum({vs('num_requests_running')})",
        "kv_utilization": f"avg({vs('kv_cache_usage_perc')}) or avg({vs('gpu_cache_usage_perc')})",
        "kv_full_sequences": (f"sum({vs('num_requests_running')}) / "
                              f"(sum({vs('kv_cache_usage_perc')}) or sum({vs('gpu_cache_usage_perc')}))"),
        "prefix_hit_rate": (
            f"sum(rate({vs('prefix_cache_hits_total')}[{window}])) / "
            f"sum(rate({vs('prefix_cache_queries_total')}[{window}]))"
        ),
        "prompt_tokens_per_s": f"sum(rate({vs('prompt_tokens_total')}[{window}]))",
        "decode_tokens_per_s": f"sum(rate({vs('generation_tokens_total')}[{window}]))",
        "router_age_s": f"time() - max(timestamp(llmfleet_router_requests_total{{{r}}}))",
        "replica_age_s": f"time() - max(timestamp({vs('num_requests_running')}))",
    }


def shape_query(service: str, namespace: str, pool: str, sel: Selectors) -> str:
    """PromQL of each model-shape field's distinct values over the pool's replicas, one series per (dim, value),
    the value in label `value` (pure)."""
    v = sel.replica.format(service=service, namespace=namespace, pool=pool)
    name = MODEL_SHAPE_METRIC.replace(":", "[:_]")  # some scrapers store ':' escaped to '_'
    return f'count_values by ({MODEL_SHAPE_DIM_LABEL}) ("value", {{__name__=~"{name}",{v}}})'


def agreed_shape(per_replica: Sequence[Mapping[str, float]]) -> ModelShape | None:
    """The model shape the replicas that report one agree on, or None: none reports one, two disagree (a rollout
    to another model under way), or the numbers are no shape (plan.models.shape_from_dims). Pure."""
    reported = [dict(d) for d in per_replica if d]
    if not reported or any(d != reported[0] for d in reported[1:]):
        return None
    try:
        return shape_from_dims(reported[0])
    except ValueError:
        return None


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _moments(v: Mapping[str, float | None]) -> tuple[float, float, float] | None:
    """E[L^2], E[L^3], E[L^4] of the prompt lengths, where all three were measured."""
    m2, m3, m4 = (v.get(f"input_tokens_power_{k}") for k in INPUT_TOKEN_POWERS)
    return (m2, m3, m4) if m2 is not None and m3 is not None and m4 is not None else None


def assemble(
    pool: PoolRef, now: float, values: Mapping[str, float | None], *, stale_after_s: float, failed: bool = False,
    model_shape: ModelShape | None = None,
) -> PoolSignals:
    """PoolSignals from per-signal values (None = no data) and the replicas' agreed model shape. Pure."""
    v = {k: _finite(x) for k, x in values.items()}
    hit = v.get("prefix_hit_rate")
    prompt_tps = v.get("prompt_tokens_per_s")
    prefill = prompt_tps * (1.0 - (hit or 0.0)) if prompt_tps is not None else None
    router_age = v.get("router_age_s")
    replica_age = v.get("replica_age_s")
    stale = failed or router_age is None or router_age > stale_after_s
    # Replica series are needed only when the pool has replicas that should be reporting.
    if pool.ready_replicas > 0 and (replica_age is None or replica_age > stale_after_s):
        stale = True
    return PoolSignals(
        pool=pool.name,
        role=pool.role,
        now=now,
        replicas=pool.replicas,
        ready_replicas=pool.ready_replicas,
        arrival_rate=v.get("arrival_rate"),
        mean_input_tokens=v.get("mean_input_tokens"),
        mean_output_tokens=v.get("mean_output_tokens"),
        input_tokens_moments=_moments(v),
        ttft_p95_ms=v.get("ttft_p95_ms") if v.get("ttft_p95_ms") is not None else v.get("ttft_p95_ms_engine"),
        tpot_p95_ms=v.get("tpot_p95_ms") if v.get("tpot_p95_ms") is not None else v.get("tpot_p95_ms_engine"),
        queue_time_p95_ms=v.get("queue_time_p95_ms"),
        queue_depth=v.get("queue_depth"),
        min_queue_depth=v.get("min_queue_depth"),
        running=v.get("running"),
        kv_utilization=v.get("kv_utilization"),
        kv_full_sequences=v.get("kv_full_sequences"),
        prefix_hit_rate=hit,
        degraded_fraction=v.get("degraded_fraction"),
        error_rate=v.get("error_rate"),
        held_requests=v.get("held_requests"),
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=v.get("decode_tokens_per_s"),
        model_shape=model_shape,
        stale=stale,
    )


class PrometheusSignals:
    """Collects PoolSignals through prometheus-api-client (sync HTTP, run in a thread, with a timeout)."""

    def __init__(
        self,
        url: str,
        service: str,
        namespace: str = "default",
        *,
        window: str = "1m",
        stale_after_s: float = 60.0,
        timeout_s: float = 5.0,
        selectors: Selectors | None = None,
    ) -> None:
        from prometheus_api_client import PrometheusConnect

        self.service, self.namespace, self.window = service, namespace, window
        self.stale_after_s, self.timeout_s = stale_after_s, timeout_s
        self.selectors = selectors or Selectors()
        self._prom = PrometheusConnect(url=url, disable_ssl=True, timeout=max(1, math.ceil(timeout_s)))

    def _query(self, promql: str) -> float | None:
        result: Any = self._prom.custom_query(promql, timeout=max(1, math.ceil(self.timeout_s)))
        if not result:
            return None
        try:
            return float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            return None

    def _query_shape(self, promql: str) -> ModelShape | None:
        """The shape the replicas agree on from `shape_query`'s answer: each field's smallest and largest value
        (samples without the labels or with no number left out)."""
        lo: dict[str, float] = {}
        hi: dict[str, float] = {}
        for sample in self._prom.custom_query(promql, timeout=max(1, math.ceil(self.timeout_s))) or []:
            try:
                dim, value = str(sample["metric"][MODEL_SHAPE_DIM_LABEL]), float(sample["metric"]["value"])
            except (KeyError, TypeError, ValueError):
                continue
            lo[dim], hi[dim] = min(value, lo.get(dim, value)), max(value, hi.get(dim, value))
        return agreed_shape([lo, hi])

    def _collect_pool(self, pool: PoolRef, now: float) -> PoolSignals:
        from prometheus_api_client.exceptions import PrometheusApiClientException
        from requests.exceptions import RequestException

        queries = build_queries(self.service, self.namespace, pool.name, pool.role, self.selectors, self.window)
        values: dict[str, float | None] = {}
        try:
            for key, promql in queries.items():
                values[key] = self._query(promql)
            # replicas agree where each field has one value
            shape = self._query_shape(shape_query(self.service, self.namespace, pool.name, self.selectors))
        except (PrometheusApiClientException, RequestException, ValueError):
            return assemble(pool, now, values, stale_after_s=self.stale_after_s, failed=True)
        return assemble(pool, now, values, stale_after_s=self.stale_after_s, model_shape=shape)

    async def collect(self, pools: Sequence[PoolRef], now: float | None = None) -> list[PoolSignals]:
        t = time.monotonic() if now is None else now
        out = []
        for pool in pools:
            try:
                sig = await asyncio.wait_for(asyncio.to_thread(self._collect_pool, pool, t), self.timeout_s * 20)
            except TimeoutError:
                sig = assemble(pool, t, {}, stale_after_s=self.stale_after_s, failed=True)
            out.append(sig)
        return out


# -- direct scraping (no Prometheus configured) ------------------------------------------------------------------

def _sum(snap: Mapping[Sample, float], name: str, match: Mapping[str, str] | None = None) -> float | None:
    vals = [v for (n, labels), v in snap.items() if n == name and _matches(labels, match)]
    return sum(vals) if vals else None


def _min_of_two(prev: Mapping[Sample, float], cur: Mapping[Sample, float], name: str) -> float | None:
    """The smallest value of any series of `name` in either scrape (only series present in the current one)."""
    vals = [min(v, prev.get(k, v)) for k, v in cur.items() if k[0] == name]
    return min(vals) if vals else None


def _matches(labels: Iterable[tuple[str, str]], match: Mapping[str, str] | None) -> bool:
    if not match:
        return True
    d = dict(labels)
    return all(d.get(k) == v for k, v in match.items())


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts {le: count} (linear within a bucket)."""
    items = sorted(buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    total = items[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in items:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return items[-1][0]


def _bucket_deltas(prev: Mapping[Sample, float], cur: Mapping[Sample, float], name: str,
                   match: Mapping[str, str] | None) -> dict[float, float]:
    out: dict[float, float] = {}
    for (n, labels), v in cur.items():
        if n != name + "_bucket" or not _matches(labels, match):
            continue
        le = float(dict(labels)["le"])
        out[le] = out.get(le, 0.0) + max(v - prev.get((n, labels), 0.0), 0.0)
    return out


def _rate(prev: Mapping[Sample, float], cur: Mapping[Sample, float], name: str, dt: float,
          match: Mapping[str, str] | None = None) -> float | None:
    a, b = _sum(prev, name, match), _sum(cur, name, match)
    if b is None or dt <= 0:
        return None
    return max(b - (a or 0.0), 0.0) / dt


def values_from_scrapes(
    pool: PoolRef, router_prev: Mapping[Sample, float], router_cur: Mapping[Sample, float],
    replicas_prev: Mapping[Sample, float], replicas_cur: Mapping[Sample, float], dt: float,
) -> dict[str, float | None]:
    """Per-signal values from two consecutive scrapes of the router and the pool's replicas. Pure."""
    pm = {"pool": pool.name}
    total = _rate(router_prev, router_cur, "llmfleet_router_requests_total", dt)
    arrival = total if pool.role == "primary" else _rate(router_prev, router_cur, "llmfleet_router_requests_total", dt, pm)
    degraded = _rate(router_prev, router_cur, "llmfleet_router_requests_total", dt, {"degraded": "true"})
    tries = _rate(router_prev, router_cur, "llmfleet_router_upstream_attempts_total", dt, pm)
    failed = _rate(router_prev, router_cur, "llmfleet_router_upstream_attempts_total", dt, {**pm, "outcome": "error"})

    def p95(metric: str, prev: Mapping[Sample, float], cur: Mapping[Sample, float],
            match: Mapping[str, str] | None) -> float | None:
        q = histogram_quantile(0.95, _bucket_deltas(prev, cur, metric, match))
        return None if q is None else q * 1000.0

    def mean(metric: str, total: str | None = None, match: Mapping[str, str] = pm) -> float | None:
        """Per request: the rate of `total` (default the histogram's _sum) over the rate of the histogram's _count."""
        s = _rate(router_prev, router_cur, total or metric + "_sum", dt, match)
        c = _rate(router_prev, router_cur, metric + "_count", dt, pm)
        return s / c if s is not None and c else None

    hits = _rate(replicas_prev, replicas_cur, "vllm:prefix_cache_hits_total", dt)
    queries = _rate(replicas_prev, replicas_cur, "vllm:prefix_cache_queries_total", dt)
    kv = _sum(replicas_cur, "vllm:kv_cache_usage_perc")
    if kv is None:
        kv = _sum(replicas_cur, "vllm:gpu_cache_usage_perc")
    n_rep = max(pool.ready_replicas, 1)
    running = _sum(replicas_cur, "vllm:num_requests_running")
    return {
        "arrival_rate": arrival,
        "degraded_fraction": (degraded or 0.0) / total if total else None,
        "error_rate": (failed or 0.0) / tries if tries else None,
        "held_requests": _sum(router_cur, "llmfleet_router_held_requests", pm),
        "ttft_p95_ms": p95("llmfleet_router_ttft_seconds", router_prev, router_cur, pm),
        "tpot_p95_ms": p95("llmfleet_router_tpot_seconds", router_prev, router_cur, pm),
        "ttft_p95_ms_engine": p95("vllm:time_to_first_token_seconds", replicas_prev, replicas_cur, None),
        "queue_time_p95_ms": p95("vllm:request_queue_time_seconds", replicas_prev, replicas_cur, None),
        "tpot_p95_ms_engine": p95("vllm:time_per_output_token_seconds", replicas_prev, replicas_cur, None),
        "mean_input_tokens": mean("llmfleet_router_input_tokens"),
        "mean_output_tokens": mean("llmfleet_router_output_tokens"),
        **{f"input_tokens_power_{k}": mean("llmfleet_router_input_tokens", "llmfleet_router_input_tokens_power_total",
                                           {**pm, "power": str(k)}) for k in INPUT_TOKEN_POWERS},
        "queue_depth": _sum(replicas_cur, "vllm:num_requests_waiting"),
        "min_queue_depth": _min_of_two(replicas_prev, replicas_cur, "vllm:num_requests_waiting"),
        "running": running,
        "kv_utilization": kv / n_rep if kv is not None else None,
        "kv_full_sequences": running / kv if running is not None and kv else None,
        "prefix_hit_rate": hits / queries if hits is not None and queries else None,
        "prompt_tokens_per_s": _rate(replicas_prev, replicas_cur, "vllm:prompt_tokens_total", dt),
        "decode_tokens_per_s": _rate(replicas_prev, replicas_cur, "vllm:generation_tokens_total", dt),
    }


@dataclass
class _Snapshot:
    at: float
    router: dict[Sample, float] = field(default_factory=dict)
    replicas: dict[str, dict[Sample, float]] = field(default_factory=dict)


# Scrapes in flight at once (sockets the operator holds open during a decision): a fleet's replicas, up to this.
SCRAPE_CONNECTIONS = 256


class ScrapeSignals:
    """Collects PoolSignals by scraping the router's and replicas' /metrics (rates between two calls)."""

    def __init__(self, router_url: str, *, timeout_s: float = 2.0, stale_after_s: float = 60.0) -> None:
        self.router_url = router_url.rstrip("/")
        self.timeout_s, self.stale_after_s = timeout_s, stale_after_s
        self._prev: _Snapshot | None = None

    @property
    def last_router(self) -> dict[Sample, float]:
        """The router's series from the last `collect` (empty before the first)."""
        return self._prev.router if self._prev is not None else {}

    async def _scrape(self, client: Any, url: str) -> dict[Sample, float] | None:
        import httpx

        try:
            resp = await client.get(url.rstrip("/") + "/metrics")
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        try:
            return parse_samples(resp.text)
        except ValueError:
            return None

    async def collect(self, pools: Sequence[PoolRef], replica_urls: Mapping[str, Sequence[str]],
                      now: float | None = None) -> list[PoolSignals]:
        """`replica_urls`: pool name -> its ready replicas' base URLs."""
        import httpx

        t = time.monotonic() if now is None else now
        urls_all = list(dict.fromkeys(u for pool in pools for u in replica_urls.get(pool.name, ())))
        # All at once: one slow replica costs the decision one timeout, not one per replica behind it. Past
        # SCRAPE_CONNECTIONS the rest wait for a connection without a deadline of their own (httpx's default pool
        # wait is the request timeout, which failed every scrape queued behind two rounds of slow replicas, and
        # with it the pool's signals); each request still has its connect and read timeouts.
        limits = httpx.Limits(max_connections=SCRAPE_CONNECTIONS, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, pool=None), limits=limits) as client:
            router, *pages = await asyncio.gather(self._scrape(client, self.router_url),
                                                  *(self._scrape(client, u) for u in urls_all))
        got = dict(zip(urls_all, pages, strict=True))
        snap = _Snapshot(at=t, router=router or {})
        scraped_ok: dict[str, bool] = {}
        for pool in pools:
            ok = True
            for url in replica_urls.get(pool.name, ()):
                ok = ok and got[url] is not None
                snap.replicas[url] = got[url] or {}
            scraped_ok[pool.name] = ok
        prev, self._prev = self._prev, snap
        out = []
        for pool in pools:
            urls = list(replica_urls.get(pool.name, ()))
            failed = router is None or prev is None or not scraped_ok[pool.name]
            cur_rep = _merge({u: snap.replicas.get(u, {}) for u in urls})
            prev_rep = _merge({u: prev.replicas.get(u, {}) for u in urls}) if prev else {}
            values = values_from_scrapes(pool, prev.router if prev else {}, snap.router, prev_rep, cur_rep,
                                         t - prev.at if prev else 0.0)
            values["router_age_s"] = 0.0
            values["replica_age_s"] = 0.0
            shape = agreed_shape([shape_samples(snap.replicas.get(u, {})) for u in urls])
            sig = assemble(pool, t, values, stale_after_s=self.stale_after_s, failed=failed, model_shape=shape)
            # rates between two scrapes: over the seconds since the last one (a step a wake-up brought forward: fewer)
            out.append(replace(sig, stale=sig.stale or failed, window_s=t - prev.at if prev else None))
        return out


def shape_samples(snap: Mapping[Sample, float]) -> dict[str, float]:
    """{dim: value} of one replica's `llmfleet:model_shape` samples (empty when it reports none)."""
    return {dict(labels)[MODEL_SHAPE_DIM_LABEL]: v for (name, labels), v in snap.items()
            if name == MODEL_SHAPE_METRIC and MODEL_SHAPE_DIM_LABEL in dict(labels)}


def _merge(snaps: Mapping[str, Mapping[Sample, float]]) -> dict[Sample, float]:
    """One snapshot of several replicas (a `__replica` label keeps their series apart)."""
    out: dict[Sample, float] = {}
    for url, snap in snaps.items():
        for (name, labels), v in snap.items():
            out[(name, labels + (("__replica", url),))] = v
    return out
