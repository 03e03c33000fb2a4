"""Metrics of a simulation run (JSON-able summary) and PNG plots."""

from __future__ import annotations

from collections.abc import Container, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.workload import Request, Workload

if TYPE_CHECKING:
    from llmfleet.sim.types import Fleet, SimConfig, SimResult



def _finish(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, legend_size: int, path: Path) -> Path:
    """Label, grid and legend one plot, save it as PNG and free the figure."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

def _pct(a: np.ndarray) -> dict[str, float | None]:
    if a.size == 0:
        return {"p50": None, "p90": None, "p95": None, "p99": None, "mean": None}
    p = np.percentile(a, [50, 90, 95, 99])
    return {"p50": float(p[0]), "p90": float(p[1]), "p95": float(p[2]), "p99": float(p[3]), "mean": float(a.mean())}


def replica_gpu_seconds(fleet: Fleet, end: float) -> list[float]:
    """GPU-seconds of each of the fleet's replicas (in `fleet.replicas` order): from its start to its stop (or
    `end`), times the GPUs it occupies (tensor parallelism times a MIG slice's share)."""
    per_replica = {name: spec.gpus_per_replica() for name, spec in fleet.specs.items()}
    return [((r.stopped_at if r.stopped_at is not None else end) - r.started_at) * per_replica[r.pool]
            for r in fleet.replicas]


def summarize(reqs: Sequence[Request], fleet: Fleet, cfg: SimConfig, t0: float, end: float,
              rejected: Sequence[Request], pending: Sequence[Request]) -> dict[str, Any]:
    done = [r for r in reqs if r.finish >= 0]
    ttft = np.array([r.first_token - r.arrival for r in done])
    e2e = np.array([r.finish - r.arrival for r in done])
    tpot = np.array([(r.finish - r.first_token) / (r.output_len - 1) for r in done if r.output_len > 1])
    ok = [r for r in done if r.first_token - r.arrival <= cfg.ttft_slo_s and
          (r.output_len <= 1 or (r.finish - r.first_token) / (r.output_len - 1) <= cfg.tpot_slo_s)]
    duration = max(1e-9, end - t0)
    prompt = sum(r.prompt_len for r in done)
    hits = sum(r.hit_tokens for r in done)
    primary = [r for r in fleet.replicas if r.pool == fleet.primary]
    served = np.array([r.served for r in primary], dtype=float)
    busy = np.array([r.busy_s for r in primary], dtype=float)
    gpu_s = sum(replica_gpu_seconds(fleet, end))
    return {
        "requests": len(reqs), "completed": len(done), "rejected": len(rejected), "pending": len(pending),
        "durationS": duration,
        "ttft": _pct(ttft), "tpot": _pct(tpot), "e2e": _pct(e2e),
        "sloAttainment": len(ok) / len(reqs) if reqs else 0.0,
        "goodputRps": len(ok) / duration,
        "throughputRps": len(done) / duration,
        "prefixHitRate": hits / prompt if prompt else 0.0,
        # the part of the hits loaded from a host-memory KV tier (0 without one), over admitted prompt tokens
        "hostHitRate": (sum(r.host_hit_tokens for r in fleet.replicas) / admitted
                        if (admitted := sum(r.prompt_tokens for r in fleet.replicas)) else 0.0),
        "gpuSeconds": gpu_s,
        "degradedFraction": sum(1 for r in done if r.degraded) / len(done) if done else 0.0,
        "preemptions": sum(r.preemptions for r in reqs),
        "adapterLoads": sum(r.adapter_loads for r in fleet.replicas),  # LoRA adapters loaded on replicas
        "balance": {
            "servedCv": float(served.std() / served.mean()) if served.size and served.mean() > 0 else 0.0,
            "busyMaxOverMean": float(busy.max() / busy.mean()) if busy.size and busy.mean() > 0 else 0.0,
        },
        "replicasPeak": max(1, len(fleet.replicas)),
    }


def _cached_prefix_blocks(r: Request, cached: Container[int], block_size: int) -> int:
    """Leading full blocks of `r`'s prompt found in `cached` (the prompt's last token is always computed)."""
    limit = min(len(r.keys), (r.prompt_len - 1) // block_size)
    n = 0
    while n < limit and r.keys[n] in cached:
        n += 1
    return n


def oracle_hit_rate(w: Workload) -> float:
    """Perfect affinity and an infinite cache: every block any earlier request computed is a hit."""
    seen: set[int] = set()
    hit = total = 0
    bs = w.block_size
    for r in w.requests:
        hit += _cached_prefix_blocks(r, seen, bs) * bs
        total += r.prompt_len
        seen.update(r.keys)
    return hit / total if total else 0.0


def finite_cache_hit_bound(w: Workload, capacity_blocks: int, policy: str = "belady") -> float:
    """Hit rate of one pooled prefix cache of `capacity_blocks` (all replicas' caches together) with
    perfect affinity (no block is ever cached twice) — an upper bound for a fleet with finite caches.

    policy "belady": Belady's MIN with bypass (evict the block reused furthest in the future, or skip caching
    a block that is itself reused furthest); no online eviction does better, so no router can beat it.
    policy "lru": the same pooled cache with LRU eviction (what perfect routing gets from LRU engines).
    Blocks are accessed in arrival order; hits count leading blocks only, as in oracle_hit_rate.
    """
    import heapq
    from collections import OrderedDict

    if capacity_blocks <= 0:
        return 0.0
    bs = w.block_size
    reqs = w.requests
    total = sum(r.prompt_len for r in reqs)
    if not total:
        return 0.0
    hit = 0
    if policy == "lru":
        lru: OrderedDict[int, None] = OrderedDict()
        for r in reqs:
            hit += _cached_prefix_blocks(r, lru, bs) * bs
            for k in r.keys:
                if k in lru:
                    lru.move_to_end(k)
                else:
                    lru[k] = None
                    if len(lru) > capacity_blocks:
                        lru.popitem(last=False)
        return hit / total
    if policy != "belady":
        raise ValueError(f"unknown policy {policy!r}")
    accesses = [k for r in reqs for k in r.keys]
    nxt = [0] * len(accesses)  # position of the next access of the same key (inf: never)
    last: dict[int, int] = {}
    never = len(accesses) + 1
    for i in range(len(accesses) - 1, -1, -1):
        nxt[i] = last.get(accesses[i], never)
        last[accesses[i]] = i
    cached: dict[int, int] = {}  # key -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, key), stale entries skipped
    pos = 0
    for r in reqs:
        limit = min(len(r.keys), (r.prompt_len - 1) // bs)
        prefix = True
        for j, k in enumerate(r.keys):
            nu = nxt[pos]
            pos += 1
            if k in cached:
                if prefix and j < limit:
                    hit += bs
                cached[k] = nu
                heapq.heappush(heap, (-nu, k))
                continue
            prefix = False
            if len(cached) < capacity_blocks:
                cached[k] = nu
                heapq.heappush(heap, (-nu, k))
                continue
            while True:  # the cached block reused furthest in the future (skip stale heap entries)
                far, victim = heap[0]
                if cached.get(victim) == -far:
                    break
                heapq.heappop(heap)
            if -far > nu:
                heapq.heappop(heap)
                del cached[victim]
                cached[k] = nu
                heapq.heappush(heap, (-nu, k))
    return hit / total


def ttft_lower_bound(w: Workload, cost: StepCostModel, max_batched_tokens: int = 8192) -> list[float]:
    """Per request: its prefill alone on an idle replica with oracle cache hits (no queueing, no co-batched
    decodes), in chunks of `max_batched_tokens`. No router can beat these TTFTs."""
    seen: set[int] = set()
    out = []
    bs = w.block_size
    for r in w.requests:
        start, t = _cached_prefix_blocks(r, seen, bs) * bs, 0.0
        seen.update(r.keys)
        while start < r.prompt_len:
            c = min(max_batched_tokens, r.prompt_len - start)
            t += cost.prefill_time(c, start)
            start += c
        out.append(t)
    return out


def plot(results: Sequence[SimResult], out: Path, title: str = "") -> list[Path]:
    """TTFT CDF per router and replicas/queue over time; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for res in results:
        t = np.sort([r["ttft"] for r in res.records if r["ttft"] is not None])
        if t.size:
            ax.plot(t, np.arange(1, t.size + 1) / t.size, label=res.router)
    ax.set_xscale("log")
    paths.append(_finish(fig, ax, "TTFT (s)", "fraction of requests", title or "TTFT CDF", 8, out / "ttft_cdf.png"))
    fig, ax = plt.subplots(figsize=(7, 4))
    for res in results:
        pools = [k for k in (res.series[0] if res.series else {}) if k not in ("t", "pending")]
        for pool in pools:
            ts = [s["t"] for s in res.series]
            ax.plot(ts, [s[pool]["waiting"] for s in res.series], label=f"{res.router} {pool} waiting")
    paths.append(_finish(fig, ax, "time (s)", "waiting requests", title or "queue over time", 7, out / "queue.png"))
    return paths


def print_table(title: str, results: Sequence[SimResult], slo_s: float) -> None:
    """`llmfleet sim run`'s table: one row per result (router), TTFT attainment against `slo_s`."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in ("router", "hit rate", "TTFT p50", "TTFT p99", "TPOT p50", "e2e p99", "SLO att.", "TTFT att.",
              "goodput", "GPU-s", "degraded", "rejected", "preempt", "balance CV"):
        t.add_column(c)
    for res in results:
        s = res.summary

        def sec(v: float | None, fmt: str = ".3f") -> str:
            return "-" if v is None else f"{v:{fmt}}s"

        rejected = f"{s['rejected']}" + (f" ({s['rejectedContext']} > context)" if s.get("rejectedContext") else "")
        if s.get("clippedContext"):
            rejected += f", {s['clippedContext']} clipped"
        ttft_ok = sum(1 for r in res.records if r["ttft"] is not None and r["ttft"] <= slo_s) / max(1, s["requests"])
        t.add_row(res.router, f"{s['prefixHitRate']:.3f}", sec(s["ttft"]["p50"]), sec(s["ttft"]["p99"]),
                  f"{(s['tpot']['p50'] or 0) * 1e3:.1f}ms", sec(s["e2e"]["p99"], ".2f"), f"{s['sloAttainment']:.3f}",
                  f"{ttft_ok:.3f}", f"{s['goodputRps']:.2f}/s", f"{s['gpuSeconds']:.0f}",
                  f"{s['degradedFraction']:.3f}", rejected, str(s["preemptions"]), f"{s['balance']['servedCv']:.2f}")
    Console(width=220).print(t)
