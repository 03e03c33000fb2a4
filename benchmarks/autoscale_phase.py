"""The autoscalers' results when the phase of their decisions against the traffic moves.

An autoscaler decides every interval (15 s) on a timer that has no relation to the traffic: the same burst may begin
just after a decision or just before one. autoscale_eval.py replays each workload at one phase (the first decision one
interval after the first arrival). This script replays `slo` and `queue` on the same workloads, fleets and SLOs (read
from the recorded results of autoscale_eval.py) with every regular decision `phase` seconds later, for several
phases, and prints each policy's attainment and GPU-seconds per phase with the worst phase and the spread. A target
met at one phase only is luck: real traffic picks its own phase.

    python benchmarks/autoscale_phase.py                                   # bursty-10x, azure, mooncake; 0-12 s
    python benchmarks/autoscale_phase.py --workload azure --phases 0 5 10
    python benchmarks/autoscale_phase.py --student-mig 3g.71gb --out /tmp/autoscale_phase_mig.json
    python benchmarks/autoscale_phase.py --trace mooncake-conversation.jsonl --workload mooncake-conversation-rate2x \
        --recorded benchmarks/results/autoscale_eval_public.json --out /tmp/autoscale_phase_public.json

Simulated time, router seed 0 (`--seed`): deterministic; the machine only sets the wall time.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autoscale_setup import (
    STUDENT_MODEL,
    TRACES,
    add_replay_options,
    misses,
    run_policy,
    service,
    shapes,
    spike,
    student_hardware,
    trace_names,
    ttft_attainment,
    use_student_mig,
)
from results_paths import RESULTS

from llmfleet.sim.traces import is_trace_file, load_trace
from llmfleet.sim.workload import Workload, WorkloadError

POLICIES = ("slo", "queue")


@functools.cache
def trace_files(extra: tuple[str, ...] = ()) -> dict[str, Path]:
    """The traces in ../shared/data/traces, or the `extra` files instead (`--trace`, as autoscale_eval.py's), by the
    workload names autoscale_eval.py records them under."""
    if extra:
        files = [Path(p) for p in extra]
    else:
        files = sorted(p for p in TRACES.glob("*") if is_trace_file(p)) if TRACES.exists() else []
    return dict(zip(trace_names(files), files, strict=True))


def spike_factor(name: str) -> float | None:
    """The factor of a synthetic spike's name (`bursty-10x`), None for any other name."""
    head, _, factor = name.partition("bursty-")
    try:
        return float(factor[:-1]) if not head and factor.endswith("x") else None
    except ValueError:
        return None


def split_rate(name: str) -> tuple[str, float]:
    """A held-out variant's workload and rate factor (`azure-rate3x` -> azure, 3.0); other names at 1.0."""
    base, _, factor = name.rpartition("-rate")
    try:
        return (base, float(factor[:-1])) if base and factor.endswith("x") and float(factor[:-1]) > 0 else (name, 1.0)
    except ValueError:
        return name, 1.0


def known(name: str, shape_names: set[str], extra: tuple[str, ...] = ()) -> bool:
    base, _ = split_rate(name)
    return base in trace_files(extra) or spike_factor(base) is not None or base in shape_names


def workload(name: str, extra: tuple[str, ...] = ()) -> Workload:
    """A workload autoscale_eval.py records under `name`: a trace (shared, or the `extra` files), the synthetic spike
    or a synthetic shape, or one of them at a rate factor (azure-rate3x: `Workload.scaled`, as --time-scale)."""
    base, k = split_rate(name)
    factor = spike_factor(base)
    if factor is not None:
        w = spike(factor, False)[1]
    elif base in (traces := trace_files(extra)):
        w = load_trace(traces[base])
    else:
        w = shapes()[base]
    return w.scaled(k) if k != 1.0 else w


def run_one(args: tuple[str, str, float, int, float, int, str | None, tuple[str, ...]]) -> dict[str, Any]:
    name, policy, slo_s, initial, phase, seed, mig, extra = args
    use_student_mig(mig)
    t0 = time.monotonic()
    res, hook = run_policy(workload(name, extra), policy, slo_s, initial, seed=seed, phase_s=phase)
    return {"workload": name, "policy": policy, "phaseS": phase, "attainment": round(ttft_attainment(res, slo_s), 5),
            "misses": misses(res, slo_s), "gpuSeconds": round(res.summary["gpuSeconds"], 1),
            "scalingActions": hook.actions, "wallSeconds": round(time.monotonic() - t0, 1)}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and policy: the worst attainment over the phases, its spread and the GPU-seconds' range."""
    out = []
    for key in dict.fromkeys((r["workload"], r["policy"]) for r in rows):
        mine = [r for r in rows if (r["workload"], r["policy"]) == key]
        att = [r["attainment"] for r in mine]
        gpu = [r["gpuSeconds"] for r in mine]
        out.append({"workload": key[0], "policy": key[1], "phases": len(mine), "worstAttainment": min(att),
                    "bestAttainment": max(att), "phasesAtLeast99": sum(a >= 0.99 for a in att),
                    "gpuSecondsMin": min(gpu), "gpuSecondsMax": max(gpu)})
    return out


def render(doc: dict[str, Any]) -> str:
    phases = sorted({r["phaseS"] for r in doc["runs"]})
    head = "| workload | policy | " + " | ".join(f"phase {p:g} s" for p in phases) + " | worst |"
    lines = [head, "|---|---|" + "---:|" * (len(phases) + 1)]
    for s in doc["summary"]:
        cells = []
        for p in phases:
            r = next((x for x in doc["runs"] if (x["workload"], x["policy"], x["phaseS"]) == (s["workload"],
                                                                                                 s["policy"], p)), None)
            cells.append(f"{100 * r['attainment']:.2f}% / {r['gpuSeconds']:,.0f}" if r else "")
        lines.append(f"| {s['workload']} | {s['policy']} | " + " | ".join(cells)
                     + f" | {100 * s['worstAttainment']:.2f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append",
                    help="a workload of --recorded: bursty-10x, azure, mooncake, a synthetic shape (shape-periodic) or "
                         "a rate variant (azure-rate3x); repeatable; default bursty-10x, azure and mooncake")
    ap.add_argument("--phases", type=float, nargs="+", default=[0.0, 3.0, 6.0, 9.0, 12.0], metavar="S",
                    help="seconds the regular decisions are shifted by (each below the decision interval, 15 s)")
    ap.add_argument("--trace", action="append", default=[], metavar="FILE",
                    help="trace files instead of ../shared/data/traces (repeatable), named as autoscale_eval.py names "
                         "them (mooncake-conversation.jsonl: mooncake-conversation)")
    ap.add_argument("--seed", type=int, default=0, help="the router's tie-breaking seed")
    ap.add_argument("--student-mig", metavar="PROFILE", help="students on MIG slices, as autoscale_eval.py's option")
    add_replay_options(ap, RESULTS / "autoscale_phase.json")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(args.out.read_text())))
        return
    interval = service("slo", 1.0, 1).spec.autoscaling.interval_seconds  # the benchmark's services' interval
    if any(not 0 <= p < interval for p in args.phases):
        raise SystemExit(f"autoscale_phase.py: each phase must be >= 0 and below the {interval:g} s interval")
    extra = tuple(str(p) for p in args.trace)
    absent = [p for p in extra if not Path(p).is_file()]
    if absent:
        raise SystemExit(f"autoscale_phase.py: no trace file {absent[0]}")
    try:
        traces = trace_files(extra)
    except WorkloadError as err:
        raise SystemExit(f"autoscale_phase.py: {err}") from None
    recorded = {r["workload"]: r for r in json.loads(args.recorded.read_text())["results"]}
    names = args.workload or ["bursty-10x", "azure", "mooncake"]
    shape_names = set(shapes()) if any(n.startswith("shape-") for n in names) else set()
    unknown = [n for n in names if not known(n, shape_names, extra)]
    if unknown:
        raise SystemExit(f"autoscale_phase.py: unknown workload {unknown[0]!r} ({', '.join(traces)}, "
                         "bursty-<factor>x or a synthetic shape, each optionally -rate<factor>x)")
    missing = [n for n in names if n not in recorded]
    if missing:
        raise SystemExit(f"autoscale_phase.py: {', '.join(missing)} not in {args.recorded}")
    tasks = [(n, pol, recorded[n]["ttftSloS"], recorded[n]["initialReplicas"], p, args.seed, args.student_mig, extra)
             for n in names for pol in POLICIES for p in args.phases]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
        runs = []
        for row in pool.map(run_one, tasks):
            print(f"{row['workload']:<11} {row['policy']:<5} phase {row['phaseS']:>4g} s  "
                  f"{100 * row['attainment']:7.3f}%  {row['gpuSeconds']:>8,.0f} GPU-s  ({row['wallSeconds']:g} s)",
                  file=sys.stderr, flush=True)
            runs.append(row)
    doc = {"benchmark": "autoscale_phase", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(UTC).isoformat(timespec="seconds"), "simulated": True,
           "machine": {"platform": platform.platform(), "python": platform.python_version(),
                       "processor": platform.processor() or platform.machine()},
           "student": {"model": STUDENT_MODEL, "hardware": student_hardware()}, "routerSeed": args.seed,
           "wallSeconds": round(time.monotonic() - t0, 1), "runs": runs, "summary": summarize(runs)}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(render(doc))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
