"""The autoscaling benchmark's report: the plot per workload and the markdown tables of a results file
(autoscale_eval.py writes both; `--render` prints the tables)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmfleet.sim.types import SimResult


def ttft_series(res: SimResult, bucket_s: float = 30.0) -> tuple[list[float], list[float]]:
    rows = sorted((r["arrival"], r["ttft"]) for r in res.records if r["ttft"] is not None)
    if not rows:
        return [], []
    t0 = rows[0][0]
    buckets: dict[int, list[float]] = {}
    for a, ttft in rows:
        buckets.setdefault(int((a - t0) // bucket_s), []).append(ttft)
    keys = sorted(buckets)
    return [k * bucket_s for k in keys], [float(np.percentile(buckets[k], 95)) for k in keys]


@dataclass(frozen=True)
class PlotRun:
    """What the plot draws of one run: replicas per pool over time (the run's series) and TTFT p95 per 30 s. The
    evaluation keeps this instead of the run: a run's per-request records take ~200 bytes a request, and on a
    week-long trace several runs' records at once exceed a large machine's memory."""

    t: list[float]  # seconds since the run's first sample
    replicas: dict[str, list[int]]  # pool name -> replicas at each t
    ttft_t: list[float]
    ttft_p95: list[float]


def plot_run(res: SimResult) -> PlotRun:
    t0 = res.series[0]["t"] if res.series else 0.0
    pools = [p for p in ("primary", "small") if res.series and p in res.series[0]]
    xs, ys = ttft_series(res)
    return PlotRun([s["t"] - t0 for s in res.series], {p: [s[p]["replicas"] for s in res.series] for p in pools},
                   xs, ys)


def plot(name: str, slo_s: float, runs: dict[str, PlotRun], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for label, run in runs.items():
        line = ax1.plot(run.t, run.replicas.get("primary", []), label=f"{label} primary")[0]
        if "small" in run.replicas:
            ax1.plot(run.t, run.replicas["small"], "--", color=line.get_color(), label=f"{label} student")
        ax2.plot(run.ttft_t, run.ttft_p95, label=label)
    ax1.set_ylabel("replicas")
    ax1.legend(fontsize=8, ncol=2)
    ax2.axhline(slo_s, color="k", ls=":", label="TTFT SLO")
    ax2.set_yscale("log")
    ax2.set_ylabel("TTFT p95 per 30 s (s)")
    ax2.set_xlabel("time (s)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"autoscale_eval: {name}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def render(doc: dict[str, Any]) -> str:
    """Markdown tables of a results file: per workload and policy, then the targets and any hindsight results."""
    out = ["| workload (TTFT SLO) | policy | TTFT attainment | misses | GPU-s (primary + student) | vs static-at-peak "
           "| degraded | peak primary | router seeds: attainment, GPU-s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc.get("results", []):
        static = r["policies"]["static-at-peak"]["gpuSeconds"]
        for i, (name, row) in enumerate(r["policies"].items()):
            pools = row.get("gpuSecondsByPool", {})
            split = " + ".join(f"{v:,.0f}" for v in pools.values()) if len(pools) > 1 else ""
            label = {"static-at-peak": f"static-at-peak ({r['staticAtPeakReplicas']})",
                     "static-planner-peak": f"static-planner-peak ({r['plannerPeakReplicas']})"}.get(name, name)
            sd = row.get("seeds")
            seeds = (f"{min(sd['attainment']):.2%}–{max(sd['attainment']):.2%}, {min(sd['gpuSeconds']):,.0f}–"
                     f"{max(sd['gpuSeconds']):,.0f}" if sd else "")
            head = f"{r['workload']} ({r['ttftSloS']:.2f} s)" if i == 0 else ""
            out.append(f"| {head} | {label} | "
                       f"{row['attainment']:.2%} | {row['misses']} | {row['gpuSeconds']:,.0f}"
                       f"{f' ({split})' if split else ''} | {row['gpuSeconds'] / static:.2f}x | "
                       f"{row['degradedFraction']:.1%} | {row['peakPrimaryReplicas']} | {seeds} |")
    # The hindsight schedules do not depend on the policy: each workload's cheapest one (any window) is compared with
    # the current slo run here, not with the slo run recorded beside the search.
    hindsight_runs = doc.get("hindsight", {}).get("results", [])
    cheapest: dict[str, float] = {}
    for h in hindsight_runs:
        g = h["withColdStart"]["gpuSeconds"]
        cheapest[h["workload"]] = min(g, cheapest.get(h["workload"], g))
    names = list(dict.fromkeys(k for r in doc.get("results", []) for k in r.get("targets", {})))
    out += ["", "| workload | " + " | ".join([*names, "sloWithin15PctOfHindsight"]) + " |", "|---" * (2 + len(names)) + "|"]
    for r in doc.get("results", []):
        slo_gpu, hs = r["policies"]["slo"]["gpuSeconds"], cheapest.get(r["workload"])
        within = "not measured" if hs is None else f"{'met' if slo_gpu <= 1.15 * hs else '**not met**'} ({slo_gpu / hs:.2f}x)"
        marks = ("n/a" if v is None else "met" if v else "**not met**" for v in (r["targets"].get(n) for n in names))
        out.append(f"| {r['workload']} | " + " | ".join(marks) + f" | {within} |")
    slo_now = {r["workload"]: r["policies"]["slo"]["gpuSeconds"] for r in doc.get("results", [])}
    for h in hindsight_runs:
        c, slo_gpu = h["withColdStart"], slo_now.get(h["workload"], h["slo"]["gpuSeconds"])
        out += ["", f"Hindsight ({h['workload']}, {h['windowS']:g} s windows): {c['gpuSeconds']:,.0f} GPU-s "
                    f"({c['vsStaticAtPeak']:+.1%} vs static-at-peak), attainment {c['attainment']:.2%}, "
                    f"{c['simulations']} replays; slo {slo_gpu:,.0f} GPU-s ({slo_gpu / c['gpuSeconds'] - 1:+.1%} vs "
                    f"hindsight); schedule {c['replicas']}"]
        if "instant" in h:
            i = h["instant"]
            out.append(f"  without cold start: {i['gpuSeconds']:,.0f} GPU-s ({i['vsStaticAtPeak']:+.1%} vs "
                       f"static-at-peak), schedule {i['replicas']}")
    for r in doc.get("results", []):
        if r.get("unavoidableMisses"):
            out += ["", f"Misses no fleet avoids ({r['workload']}): {r['unavoidableMisses']:,} of the "
                        f"{r['servableRequests'] // 100:,} that 99 % of {r['servableRequests']:,} servable requests "
                        f"allows (prefill alone, on an idle replica with every earlier prefix cached, over "
                        f"{r['ttftSloS']:.2f} s)"]
    for f in doc.get("fixedFleets", {}).get("results", []):
        out += ["", f"Fixed fleets ({f['workload']}, primaries+warm students): " + "; ".join(
            f"{k}: {x['attainment']:.2%}, {x['gpuSeconds']:,.0f} GPU-s ({x['vsStaticAtPeak']:.2f}x), degraded "
            f"{x['degradedFraction']:.1%}" for k, x in f["fleets"].items())]
    return "\n".join(out)
