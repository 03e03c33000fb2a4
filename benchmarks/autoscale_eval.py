"""Autoscaling policies in the fleet simulator: slo vs queue vs static-at-peak, on every trace and a 10x spike.

    python benchmarks/autoscale_eval.py [--trace PATH ...] [--no-trace] [--spike 10] [--quick] [--time-scale K ...]

Workloads: every trace in ../shared/data/traces/ (Mooncake or Qwen-Bailian JSONL, Azure or BurstGPT CSV; or --trace) and a synthetic
multi-tenant workload with a 10x spike. Policies run through the production code: the InferenceService
(autoscale_setup.py) -> llmfleet.sim.production.simulate_service (PolicyConfig.from_service -> policy.decide every
15 s of simulated time, the production router with its fallback to the student pool).

- TTFT SLO per workload, by a rule fixed before any policy ran: max(1 s, 1.5 x the p99 TTFT of a
  64-replica static fleet), i.e. what the model/GPU can meet at all on that workload.
- static-at-peak: the fewest static replicas that meet the SLO for >= 99 % of requests (galloping + bisection).
- Attainment = requests with TTFT <= SLO / servable requests (those longer than the model's context are rejected
  by any engine and counted apart). GPU-seconds include every pool's replicas.
- Each policy runs with ROUTER_SEEDS router seeds (the table shows seed 0, the JSON all of them).
- Misses no fleet avoids (`unavoidableMisses`, also alone with --unavoidable): servable requests whose prefill
  alone, on an idle replica with every prefix the trace sent before cached, takes longer than the SLO.
Prints a table, writes benchmarks/results/autoscale_eval.json and docs/img/autoscale_eval_<workload>.png (with
--out elsewhere, the plots go beside that file).
Held-out variants: --time-scale K replays each workload at K x its rate (Workload.scaled), named <workload>-rate<K>x
(their results go to benchmarks/results/autoscale_eval_heldout.json with --out).

Analyses of the recorded runs, each merged into the JSON under its own key: --validation (another spike factor),
--queue-sweep (queue at several depths, for equal-GPU-seconds comparisons), --hindsight (the cheapest schedule
a clairvoyant search finds, llmfleet.sim.oracle; slow: one short workload at a time).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from autoscale_report import PlotRun, plot, plot_run, render
from autoscale_setup import (
    GPU,
    MAX_REPLICAS,
    PRIMARY_COLD_S,
    PRIMARY_MODEL,
    ROOT,
    ROUTER_SEEDS,
    STUDENT_COLD_S,
    STUDENT_MODEL,
    SeedRuns,
    check_trace_seconds,
    rate_variant,
    run_policy,
    run_static,
    service,
    student_hardware,
    student_mig,
    summary_row,
    trace_names,
    ttft_attainment,
    unavoidable_misses,
    use_student_mig,
    workloads,
)
from results_paths import IMG, RESULTS, plot_dir

from llmfleet.sim.oracle import Order, fewest_static, hindsight_schedule
from llmfleet.sim.production import pool_specs
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.traces import TIME_UNITS
from llmfleet.sim.types import SimResult
from llmfleet.sim.workload import Workload, WorkloadError, rate_scale


def progress(name: str, done: str, since: float) -> float:
    """One line on stderr per finished step of a workload's evaluation (a long trace takes minutes per step, hours in
    all); returns the time now, where the next step's clock starts."""
    now = time.time()
    print(f"{name}: {done} ({now - since:,.0f} s)", file=sys.stderr, flush=True)
    return now


def static_at_peak(w: Workload, slo_s: float) -> tuple[int, SimResult]:
    """Fewest static replicas with >= 99 % TTFT attainment (llmfleet.sim.oracle.fewest_static: galloping search,
    then bisection), and its run."""
    return fewest_static(lambda n, stop: run_static(w, n, slo_s, stop_below=stop), slo_s, target=0.99,
                         upper=MAX_REPLICAS)


def planner_peak_replicas(w: Workload, slo_s: float, first_minute: bool = False) -> tuple[int, float]:
    """What the planner provisions for the workload's busiest whole minute, each prompt's prefill priced on its own
    (llmfleet.sim.planning.plan_workload, what `llmfleet sim plan` prints), and that minute's rate.

    `first_minute`: for the first minute's rate and requests instead (what an operator deploys from the traffic
    seen before any history exists: the autoscaled fleets start there; nothing of the later trace is used).
    """
    from llmfleet.plan.hardware import get_gpu
    from llmfleet.plan.models import get_model
    from llmfleet.sim.planning import plan_workload

    found = plan_workload(w, get_model(PRIMARY_MODEL), get_gpu(GPU), ttft_slo_s=slo_s, tpot_slo_s=0.1,
                          first_minute=first_minute)
    return min(found.plan.replicas, MAX_REPLICAS), found.rate_rps


def evaluate(name: str, w: Workload, policies: tuple[str, ...] = ("slo", "queue"),
             known: tuple[float, int | None] | None = None, plot_it: bool = True,
             baselines: bool = True, seeds: int = 1, planner_static: bool = True,
             img_dir: Path | None = None, jobs: int | None = 0) -> dict[str, Any]:
    """`known` = (SLO s, static-at-peak replicas) from an earlier run: skips the reference and bisection runs.
    `img_dir`: where the plot goes (`plot_dir`; docs/img when None). `jobs`: processes for the runs of router seeds
    other than 0 (SeedRuns; 0: one after another here; None: as many as the CPUs and memory allow)."""
    clock = time.time()
    if known is None:
        ttfts = [r["ttft"] for r in run_static(w, MAX_REPLICAS, 1e9).records if r["ttft"] is not None]
        p99 = float(np.percentile(ttfts, 99))
        slo_s = max(1.0, 1.5 * p99)
        del ttfts
    else:
        slo_s, p99 = known[0], float("nan")
    # Autoscaled fleets start where the planner puts them for the first minute's traffic (no hindsight).
    initial = max(1, planner_peak_replicas(w, slo_s, first_minute=True)[0])
    rows: dict[str, dict[str, Any]] = {}
    # Each run is reduced to its row and what the plot draws as soon as it ends: no two runs' per-request records
    # are held at once (a week-long trace's records are gigabytes a run).
    runs: dict[str, PlotRun] = {}
    timelines: dict[str, list[dict[str, Any]]] = {}
    # The policies' runs with router seeds other than 0 (how much of a difference is luck) start now, in `jobs`
    # other processes, while this one searches the static fleets and runs seed 0 of each policy: every run is
    # deterministic, so where it runs changes nothing.
    with SeedRuns(w, jobs if seeds > 1 else 0) as other_seeds:
        pending = {p: [other_seeds.submit(p, slo_s, initial, k) for k in range(1, seeds)] for p in policies}
        static: SimResult | None = None
        if known is None or known[1] is None:
            n_peak, static = static_at_peak(w, slo_s)
        else:
            n_peak = known[1]
            if baselines:
                static = run_static(w, n_peak, slo_s)
        if static is not None:
            clock = progress(name, f"static-at-peak fleet of {n_peak}, {ttft_attainment(static, slo_s):.2%}", clock)
            runs[f"static-at-peak ({n_peak})"] = plot_run(static)
            rows["static-at-peak"] = summary_row(static, slo_s, actions=0, replicas=n_peak)
            static = None
        n_plan, peak_rps = planner_peak_replicas(w, slo_s)
        if baselines and planner_static:
            rows["static-planner-peak"] = summary_row(run_static(w, n_plan, slo_s), slo_s, actions=0, replicas=n_plan)
        for policy in policies:
            res, hook = run_policy(w, policy, slo_s, initial)
            clock = progress(name, f"{policy} {ttft_attainment(res, slo_s):.2%}, {res.summary['gpuSeconds']:,.0f} GPU-s",
                             clock)
            runs[policy], timelines[policy] = plot_run(res), hook.timeline
            rows[policy] = summary_row(res, slo_s, actions=hook.actions,
                                       replicas=max((x["primary"] for x in hook.timeline), default=initial))
            del res
        for policy in policies if seeds > 1 else ():
            others = [result() for result in pending[policy]]
            clock = progress(name, f"{policy} on router seeds 1-{seeds - 1}", clock)
            rows[policy]["seeds"] = {"attainment": [rows[policy]["attainment"], *(x[0] for x in others)],
                                     "misses": [rows[policy]["misses"], *(x[1] for x in others)],
                                     "gpuSeconds": [rows[policy]["gpuSeconds"], *(x[2] for x in others)]}
    # a run with students on MIG slices names its plots apart from the whole-GPU runs' of the same workloads
    img = (img_dir or IMG) / f"autoscale_eval_{name}{f'_mig-{mig}' if (mig := student_mig()) else ''}.png"
    if plot_it:
        plot(name, slo_s, runs, img)
    if "slo" not in rows or "queue" not in rows or not baselines:
        return {"workload": name, "ttftSloS": slo_s, "staticAtPeakReplicas": n_peak, "policies": rows,
                "targets": {}, "timelines": timelines}
    return {"workload": name, "requests": len(w.requests), "durationS": w.duration, "ttftSloS": slo_s,
            "referenceP99TtftS": p99, "staticAtPeakReplicas": n_peak, "plannerPeakReplicas": n_plan,
            "peakRps1m": round(peak_rps, 3), "initialReplicas": initial, **unavoidable_misses(w, slo_s),
            "policies": rows, "targets": targets_of(rows),
            "plot": str(img.relative_to(ROOT)) if img.is_relative_to(ROOT) else str(img)}


def targets_of(rows: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """The issue's targets for `slo` against the static-at-peak and `queue` rows of one workload."""
    s, q, st = rows["slo"], rows["queue"], rows["static-at-peak"]
    targets = {
        "sloAttainmentAtLeast99": s["attainment"] >= 0.99,
        "gpuSecondsAtMost90PctOfStaticAtPeak": s["gpuSeconds"] <= 0.9 * st["gpuSeconds"],
        "gpuSecondsAtMostQueueAtEqualOrBetterAttainment": s["attainment"] >= q["attainment"]
        and s["gpuSeconds"] <= q["gpuSeconds"],
    }
    if "seeds" in s:
        targets["sloAttainmentAtLeast99EverySeed"] = min(s["seeds"]["attainment"]) >= 0.99
    return targets


def slo_only(name: str, w: Workload, recorded: dict[str, Any], seeds: int, img_dir: Path | None = None,
             jobs: int | None = 0) -> dict[str, Any]:
    """Run `slo` again and keep every other row of the recorded result (each marked with the run it comes from):
    for a change that touches only the slo policy, on a workload too long to replay every fleet again."""
    fresh = evaluate(name, w, policies=("slo",), known=(recorded["ttftSloS"], recorded["staticAtPeakReplicas"]),
                     baselines=False, seeds=seeds, img_dir=img_dir, jobs=jobs)
    origin = {"fromRun": {"command": recorded.get("command"), "date": recorded.get("date")}}
    rows = {k: (v if "fromRun" in v else v | origin) for k, v in recorded["policies"].items() if k != "slo"}
    rows["slo"] = fresh["policies"]["slo"]
    keep = ("requests", "durationS", "referenceP99TtftS", "plannerPeakReplicas", "peakRps1m", "initialReplicas", "plot")
    return {"workload": name, "ttftSloS": recorded["ttftSloS"], "staticAtPeakReplicas": recorded["staticAtPeakReplicas"],
            **{k: recorded[k] for k in keep if k in recorded}, **unavoidable_misses(w, recorded["ttftSloS"]),
            "policies": rows, "targets": targets_of(rows)}


def queue_sweep(name: str, w: Workload, recorded: dict[str, Any], targets: list[float]) -> dict[str, Any]:
    """`queue` at several targetQueueDepth values (the spec default is 4), to compare `slo` with `queue` at
    equal GPU-seconds: misses of the queue policy interpolated linearly, over GPU-seconds, between the two
    sweep points that bracket the recorded `slo` run's GPU-seconds. Same SLO and start size as the recorded
    run (no new static search)."""
    slo_s = recorded["ttftSloS"]
    initial = recorded.get("initialReplicas") or max(1, planner_peak_replicas(w, slo_s, first_minute=True)[0])
    rows = {}
    for q in targets:
        res, hook = run_policy(w, "queue", slo_s, initial, target_queue_depth=q)
        rows[f"{q:g}"] = summary_row(res, slo_s, actions=hook.actions,
                                     replicas=max((x["primary"] for x in hook.timeline), default=initial))
    slo = recorded["policies"]["slo"]
    pts = sorted((r["gpuSeconds"], r["misses"]) for r in rows.values())
    at_slo_cost: float | None = None
    for (g0, m0), (g1, m1) in zip(pts, pts[1:], strict=False):
        if g0 <= slo["gpuSeconds"] <= g1:
            at_slo_cost = m0 if g1 == g0 else m0 + (m1 - m0) * (slo["gpuSeconds"] - g0) / (g1 - g0)
            break
    # The queue policy's misses do not fall monotonically with its cost (a lower target can scale later in a
    # burst), so also: the fewest misses of any queue setting that spent at least slo's GPU-seconds.
    costlier = [m for g, m in pts if g >= slo["gpuSeconds"]]
    best_costlier = min(costlier) if costlier else None
    return {"workload": name, "ttftSloS": slo_s, "slo": {"gpuSeconds": slo["gpuSeconds"], "misses": slo["misses"]},
            "queueByTargetQueueDepth": rows, "queueMissesAtSloGpuSeconds": at_slo_cost,
            "queueFewestMissesAtOrAboveSloGpuSeconds": best_costlier,
            "sloFewerMissesThanEveryQueueSettingAtEqualOrMoreGpuSeconds":
                None if best_costlier is None else slo["misses"] < best_costlier}


def hindsight(name: str, w: Workload, recorded: dict[str, Any], window_s: float,
              instant: bool = False, orders: tuple[Order, ...] = ("highest",)) -> dict[str, Any]:
    """The cheapest primary-only schedule found with hindsight (llmfleet.sim.oracle), with the pool's cold start
    (and, if `instant`, also without it), against the recorded static-at-peak and `slo` runs: roughly how much
    any policy could save on this workload without serving requests from the student."""
    slo_s, n_static = recorded["ttftSloS"], recorded["staticAtPeakReplicas"]
    static_gpu, slo_row = recorded["policies"]["static-at-peak"]["gpuSeconds"], recorded["policies"]["slo"]
    out: dict[str, Any] = {"workload": name, "ttftSloS": slo_s, "windowS": window_s,
                           "staticAtPeak": {"replicas": n_static, "gpuSeconds": static_gpu}, "orders": list(orders),
                           "slo": {"gpuSeconds": slo_row["gpuSeconds"], "attainment": slo_row["attainment"]}}
    for label, ready_at_once in (("withColdStart", False), ("instant", True))[: 2 if instant else 1]:
        started = time.time()
        found = hindsight_schedule(w, pool_specs(service("static", slo_s, n_static, with_student=False))[0], slo_s, n_static,
                                   router=LlmfleetRouter, window_s=window_s, instant=ready_at_once, orders=orders)
        out[label] = {"replicas": list(found.replicas), "attainment": round(found.attainment, 5),
                      "gpuSeconds": round(found.gpu_seconds, 1),
                      "vsStaticAtPeak": round(found.gpu_seconds / static_gpu - 1.0, 4),
                      "sloVsHindsight": round(slo_row["gpuSeconds"] / found.gpu_seconds - 1.0, 4),
                      "sloWithin15PctOfHindsight": slo_row["gpuSeconds"] <= 1.15 * found.gpu_seconds,
                      "simulations": found.simulations, "wallSeconds": round(time.time() - started, 1)}
    return out


def fixed_fleets(name: str, w: Workload, recorded: dict[str, Any], fleets: list[str]) -> dict[str, Any]:
    """Fixed fleets of P primaries + S always-warm students ("P+S"), with the recorded run's SLO: what holding
    capacity without any scaling costs and attains, e.g. to ask whether any causal schedule could reach a target."""
    slo_s, static_gpu = recorded["ttftSloS"], recorded["policies"]["static-at-peak"]["gpuSeconds"]
    rows = {}
    for fleet in fleets:
        p, s = (int(x) for x in fleet.split("+"))
        row = summary_row(run_static(w, p, slo_s, students=s), slo_s, actions=0, replicas=p)
        rows[fleet] = row | {"vsStaticAtPeak": round(row["gpuSeconds"] / static_gpu, 4)}
    return {"workload": name, "ttftSloS": slo_s, "fleets": rows}


def compare_hindsight(doc: dict[str, Any]) -> dict[str, Any]:
    """Each hindsight search's comparison with `slo` (`slo`, `sloVsHindsight`, `sloWithin15PctOfHindsight`) against
    the workload's current `slo` row: a search takes minutes to an hour and is not repeated when the policy's rows are
    rerun, but the comparison it stores must follow them. Entries of workloads with no row keep theirs."""
    rows = {r["workload"]: r["policies"]["slo"] for r in doc.get("results", []) if "slo" in r.get("policies", {})}
    for h in doc.get("hindsight", {}).get("results", []):
        row = rows.get(h["workload"])
        if row is None:
            continue
        h["slo"] = {"gpuSeconds": row["gpuSeconds"], "attainment": row["attainment"]}
        for label in ("withColdStart", "instant"):
            if label in h:
                found = h[label]["gpuSeconds"]
                h[label]["sloVsHindsight"] = round(row["gpuSeconds"] / found - 1.0, 4)
                h[label]["sloWithin15PctOfHindsight"] = row["gpuSeconds"] <= 1.15 * found
    return doc


def merge_results(prior: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorded workload results with `fresh` ones in place of those of the same workloads, in the recorded
    order (so a rerun of one workload leaves the file's and the rendered tables' order alone), new ones last."""
    by_name = {r["workload"]: r for r in fresh}
    kept = [by_name.pop(r["workload"], r) for r in prior]
    return kept + [r for r in fresh if r["workload"] in by_name]


def merge_section(out: Path, section: str, found: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> None:
    """Merge `found` under `section` of the results file, each result stamped with this command and date, in
    place of the recorded one with the same key (workload, window) and in the recorded order, new ones last (as
    merge_results); earlier results with other keys are kept. Reads the file again first: other runs may have
    written it while this one ran."""
    stamp = {"command": " ".join(["python", *sys.argv]), "date": datetime.now(UTC).isoformat(timespec="seconds")}
    doc = json.loads(out.read_text())
    fresh = {key(r): r | stamp for r in found}
    kept = [fresh.pop(key(r), r) for r in doc.get(section, {}).get("results", [])]
    doc[section] = {"results": kept + list(fresh.values())}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"merged into {out}")


def select(args: argparse.Namespace, recorded: dict[str, Any] | None) -> dict[str, Workload]:
    """The workloads asked for (--trace / --no-trace / --spike / --steady, each at every --time-scale factor; --workload
    names a workload or one of its variants), limited to `recorded` when given."""
    traces = [] if args.no_trace else args.trace
    wanted = set(args.workload or ())
    out: dict[str, Workload] = {}
    try:
        found = workloads(traces, args.quick, None if args.shapes else args.spike, args.steady, args.shapes,
                          args.trace_seconds, args.kv_block_size, args.time_unit)
    except WorkloadError as e:  # e.g. a --kv-block-size a trace's blocks do not divide: one line, exit 1
        raise SystemExit(f"autoscale_eval.py: {e}") from None
    for name, w in found.items():
        for k in args.time_scale or (None,):  # --time-scale: held-out variants instead of the workload itself
            label = name if k is None else rate_variant(name, k)
            if (not wanted or label in wanted or name in wanted) and (recorded is None or label in recorded):
                out[label] = w if k is None else w.scaled(k)
    for label, w in out.items():  # before hours of simulation: a week-long trace, or stamps read 1,000x off, show here
        print(f"{label}: {len(w.requests):,} requests{w.skipped_note} over {w.duration:,.0f} s, "
              f"{w.block_size}-token blocks",
              file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, action="append",
                    help="trace file (Mooncake or Qwen-Bailian JSONL, Azure or BurstGPT CSV; repeatable); default: every trace in "
                         "../shared/data/traces/")
    ap.add_argument("--trace-seconds", type=float, metavar="S",
                    help="only each trace's first S seconds (a day- or week-long trace: simulating all of it takes "
                         "hours per policy run)")
    ap.add_argument("--kv-block-size", type=int, metavar="N",
                    help="simulate the traces whose blocks are smaller on engines with N-token KV blocks (merged; "
                         "vLLM's --block-size): a 16-token-block trace runs several times faster at 64 or 128")
    ap.add_argument("--time-unit", choices=TIME_UNITS,
                    help="the JSONL traces' timestamp unit; default: the format's (Mooncake ms, Qwen-Bailian s), or s "
                         "where sub-unit gaps between stamps tell seconds")
    ap.add_argument("--quick", action="store_true", help="shorter synthetic workload")
    ap.add_argument("--spike", type=float, default=10.0, help="rate factor of the synthetic spike (validation)")
    ap.add_argument("--no-trace", action="store_true", help="only the synthetic workload")
    ap.add_argument("--steady", type=float, nargs="+", metavar="RATE",
                    help="also a steady synthetic workload (no burst) at each of these rates (req/s), named steady-RATE")
    ap.add_argument("--shapes", action="store_true",
                    help="synthetic traffic shapes no constant was chosen on (daily cycle, 30 s bursts every 5 min, "
                         "long prompts, on/off, long outputs, 40 req/s, short chat, short rises before a long or a large "
                         "one, reasoning-style answers, clumped API requests), named shape-*, instead of the spike; "
                         "e.g. with --no-trace")
    ap.add_argument("--out", type=Path, default=RESULTS / "autoscale_eval.json",
                    help="results file; plots go to docs/img for one in benchmarks/results, else beside it")
    ap.add_argument("--queue-sweep", type=float, nargs="+", metavar="DEPTH",
                    help="only run `queue` at these targetQueueDepth values against the recorded results in --out "
                         "(main and validation workloads) and merge an equal-GPU-seconds comparison under "
                         "`queueSweep`")
    ap.add_argument("--validation", action="store_true",
                    help="merge this run's results under `validation` in --out instead of replacing its main results")
    ap.add_argument("--hindsight", type=float, nargs="+", metavar="WINDOW_S",
                    help="only search the cheapest hindsight schedule (windows of these many seconds) for the recorded "
                         "workloads in --out and merge it under `hindsight`")
    ap.add_argument("--time-scale", type=float, nargs="+", metavar="K",
                    help="held-out variants: replay each workload at K x its rate instead (arrival times divided by K, "
                         "as `llmfleet sim run --time-scale`: 2 doubles the rate, 0.5 halves it), named "
                         "<workload>-rate<K>x (azure-rate2x); the SLO and static-at-peak are found again for each")
    ap.add_argument("--workload", action="append",
                    help="only these workloads (names as in the results: mooncake, azure, bursty-10x; with "
                         "--time-scale also a variant's name, azure-rate2x)")
    ap.add_argument("--seeds", type=int, default=ROUTER_SEEDS,
                    help="run each policy with this many router seeds (0 .. N-1); the table shows seed 0")
    ap.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="processes for the runs of router seeds other than 0, beside this one's searches and seed-0 "
                         "runs (default: the CPUs but one, fewer when the memory free does not hold that many runs "
                         "of a long trace; 0: all in this process, one after another; results are the same either "
                         "way)")
    ap.add_argument("--orders", nargs="+", choices=["highest", "forward", "backward"], default=["highest"],
                    help="with --hindsight: one descent per window order, keep the cheapest")
    ap.add_argument("--instant", action="store_true",
                    help="with --hindsight: also search with replicas ready at once (no cold start)")
    ap.add_argument("--fleets", nargs="+", metavar="P+S",
                    help="only run fixed fleets of P primaries and S always-warm student replicas (e.g. 2+0 2+1) "
                         "against the recorded workloads in --out and merge them under `fixedFleets`")
    ap.add_argument("--slo-only", action="store_true",
                    help="run only `slo` and keep the recorded result's other rows (static fleets, queue), each marked "
                         "with the run it comes from: for changes to the slo policy alone (the plot shows slo only)")
    ap.add_argument("--unavoidable", action="store_true",
                    help="only count, for the recorded workloads in --out, the requests no fleet serves within the "
                         "SLO (prefill alone on an idle replica, every earlier prefix cached) and record them")
    ap.add_argument("--render", action="store_true", help="print the markdown tables of --out and exit")
    ap.add_argument("--student-mig", metavar="PROFILE",
                    help=f"run each student replica on one MIG instance of this {GPU} profile (e.g. 3g.71gb) "
                         "instead of a whole GPU; its GPU-seconds count at the slice's share")
    ap.add_argument("--known", type=float, nargs=2, metavar=("SLO_S", "STATIC_REPLICAS"),
                    help="skip the SLO rule's 64-replica reference run and the static-at-peak search (and the "
                         "planner-peak static fleet): use this SLO and static-at-peak size from an earlier run")
    args = ap.parse_args()
    try:
        for k in args.time_scale or ():
            rate_scale(k, "--time-scale")
        check_trace_seconds(args.trace_seconds)
        if args.kv_block_size is not None and args.kv_block_size < 1:
            raise WorkloadError(f"--kv-block-size {args.kv_block_size}: it must be >= 1")
        trace_names(args.trace or [])  # distinct names, else one results row and plot for two traces
        if args.jobs is not None and args.jobs < 0:
            raise WorkloadError(f"--jobs {args.jobs}: it must be >= 0")
        use_student_mig(args.student_mig)
    except ValueError as e:  # WorkloadError and a MIG profile the GPU does not have
        ap.error(str(e))
    reads = [f for f, on in (("--render", args.render), ("--hindsight", args.hindsight), ("--fleets", args.fleets),
                             ("--queue-sweep", args.queue_sweep), ("--slo-only", args.slo_only),
                             ("--unavoidable", args.unavoidable)) if on]
    if reads and not args.out.is_file():
        ap.error(f"{reads[0]} reads the recorded results in --out, and {args.out} does not exist: "
                 "run the benchmark without it first")
    if args.render:
        print(render(json.loads(args.out.read_text())))
        return
    started = time.time()
    if args.unavoidable:
        doc = json.loads(args.out.read_text())
        everything = [*doc["results"], *doc.get("validation", {}).get("results", [])]
        ws = select(args, {r["workload"]: r for r in everything})
        for r in everything:
            if r["workload"] in ws:
                r |= unavoidable_misses(ws[r["workload"]], r["ttftSloS"])
                print(f"{r['workload']}: {r['unavoidableMisses']} of {r['servableRequests']} servable requests "
                      f"cannot meet the {r['ttftSloS']:.2f} s SLO on any fleet")
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        return
    if args.hindsight:
        doc = json.loads(args.out.read_text())
        recorded = {r["workload"]: r for r in [*doc["results"], *doc.get("validation", {}).get("results", [])]
                    if not args.workload or r["workload"] in args.workload}
        ws = select(args, recorded)
        found = [hindsight(name, w, recorded[name], win, args.instant, tuple(args.orders)) for win in args.hindsight
                 for name, w in ws.items() if name in recorded]
        for r in found:
            print(f"{r['workload']} ({r['windowS']:g} s windows): static-at-peak {r['staticAtPeak']['gpuSeconds']:.0f} "
                  f"GPU-s, slo {r['slo']['gpuSeconds']:.0f}; hindsight " + ", ".join(
                      f"{k} {r[k]['gpuSeconds']:.0f} ({r[k]['vsStaticAtPeak']:+.1%})"
                      for k in ("withColdStart", "instant") if k in r))
        merge_section(args.out, "hindsight", found, lambda r: (r["workload"], r["windowS"]))
        return
    if args.fleets:
        doc = json.loads(args.out.read_text())
        recorded = {r["workload"]: r for r in doc["results"]}
        found = [fixed_fleets(name, w, recorded[name], args.fleets) for name, w in select(args, recorded).items()]
        for r in found:
            print(f"{r['workload']}: " + "; ".join(f"{k}: {x['attainment']:.4f}, {x['misses']} misses, "
                                                  f"{x['gpuSeconds']:.0f} GPU-s ({x['vsStaticAtPeak']:.2f}x)"
                                                  for k, x in r["fleets"].items()))
        merge_section(args.out, "fixedFleets", found, lambda r: r["workload"])
        return
    if args.queue_sweep:
        doc = json.loads(args.out.read_text())
        recorded = {r["workload"]: r for r in [*doc["results"], *doc.get("validation", {}).get("results", [])]}
        ws = select(args, recorded)
        sweep = [queue_sweep(name, w, recorded[name], args.queue_sweep) for name, w in ws.items() if name in recorded]
        for r in sweep:
            print(f"{r['workload']}: slo {r['slo']['misses']} misses at {r['slo']['gpuSeconds']:.0f} GPU-s; queue "
                  + ", ".join(f"depth {q}: {x['misses']} misses at {x['gpuSeconds']:.0f} GPU-s ({x['attainment']:.4f})"
                              for q, x in r["queueByTargetQueueDepth"].items())
                  + f"; queue misses at slo's GPU-s (interpolated): {r['queueMissesAtSloGpuSeconds']}; fewest of any "
                  f"queue setting spending >= slo's GPU-s: {r['queueFewestMissesAtOrAboveSloGpuSeconds']}")
        doc = json.loads(args.out.read_text())  # again: other runs may have written it while this one ran
        doc["queueSweep"] = {"command": " ".join(["python", *sys.argv]), "date": datetime.now(UTC).isoformat(timespec="seconds"),
                             "wallSeconds": round(time.time() - started, 1), "results": sweep}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"merged into {args.out}")
        return
    known = (args.known[0], int(args.known[1])) if args.known else None
    if args.slo_only:
        recorded = {r["workload"]: r for r in json.loads(args.out.read_text())["results"]}
        results = [slo_only(name, w, recorded[name], args.seeds, plot_dir(args.out), args.jobs)
                   for name, w in select(args, recorded).items()]
    else:
        results = [evaluate(name, w, seeds=args.seeds, known=known, planner_static=known is None,
                            img_dir=plot_dir(args.out), jobs=args.jobs) for name, w in select(args, None).items()]
    for r in results:  # a held-out variant records what it varies
        base = r["workload"].rsplit("-rate", 1)[0]
        for k in args.time_scale or ():
            if rate_variant(base, k) == r["workload"]:
                r["heldOut"] = {"of": base, "rateScale": k}
    print(f"{'workload':12} {'policy':19} {'attain':>7} {'misses':>6} {'GPU-s':>9} {'degraded':>8} {'actions':>7} "
          f"{'peak':>4} {'p99 TTFT':>8}")
    for r in results:
        for policy, row in r["policies"].items():
            print(f"{r['workload']:12} {policy:19} {row['attainment']:7.4f} {row['misses']:6d} {row['gpuSeconds']:9.0f} "
                  f"{row['degradedFraction']:8.4f} {row['scalingActions']:7d} {row['peakPrimaryReplicas']:4d} "
                  f"{row['ttftP99S']:8.2f}")
            if "seeds" in row:
                sd = row["seeds"]
                print(f"{'':12} {'  router seeds':19} {min(sd['attainment']):.4f}-{max(sd['attainment']):.4f} "
                      f"misses {min(sd['misses'])}-{max(sd['misses'])} GPU-s {min(sd['gpuSeconds']):.0f}-"
                      f"{max(sd['gpuSeconds']):.0f}")
        print(f"  SLO {r['ttftSloS']:.2f} s; targets: " + ", ".join(f"{k}={'PASS' if v else 'FAIL'}"
                                                                     for k, v in r["targets"].items()))
    doc = {"benchmark": "autoscale_eval", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "python": platform.python_version(),
                       "processor": platform.processor() or platform.machine()},
           "simulated": {"primary": f"{PRIMARY_MODEL} on {GPU}", "student": f"{STUDENT_MODEL} on {student_hardware()}",
                         "coldStartS": {"primary": PRIMARY_COLD_S, "student": STUDENT_COLD_S}},
           "wallSeconds": round(time.time() - started, 1), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prior = json.loads(args.out.read_text()) if args.out.exists() else {}  # again: runs may run side by side
    if args.validation:  # the main results stay; this run is the validation shape
        doc = prior | {"validation": {k: doc[k] for k in ("command", "date", "wallSeconds", "results")}}
    else:  # keep the validation, queue sweep and hindsight sections (each records its own command and date)
        doc |= {k: prior[k] for k in ("validation", "queueSweep", "hindsight", "fixedFleets") if k in prior}
        if args.workload:  # a run of some workloads: the others' results stay, each stamped with its command
            stamp = {"command": doc["command"], "date": doc["date"], "wallSeconds": doc["wallSeconds"]}
            doc["results"] = merge_results(prior.get("results", []), [r | stamp for r in results])
            doc["command"] = "see each result's command"
    args.out.write_text(json.dumps(compare_hindsight(doc), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
