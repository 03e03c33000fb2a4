"""The `slo` autoscaler on a primary that no model preset names, seeded three ways.

A fine-tune under another name, a copy on S3 or a volume, or a model family the planner has no preset for has no
`llmfleet.io/model-preset`. Its replicas report the model's shape from its config.json (llmfleet's serving wrapper,
`llmfleet:model_shape`), and the autoscaler seeds the pool from that shape. Replicas that report nothing (an engine
run without the wrapper, or a model the planner has no shape for) leave the pool the default seed (8,000 prefill / 1,500
decode tokens/s per replica), as every pool without a preset had before the report existed. This script replays autoscale_eval.py's workloads, TTFT SLOs
and starting fleets (read from its recorded results) with the primary as such a model, against the same model
under its preset:

- `preset`: the annotation names llama-3.1-8b (autoscale_eval.py's own `slo` run);
- `reported`: no annotation; the replicas report Llama-3.1-8B's shape and the autoscaler plans from it; the router,
  finding no preset, measures the pool's prefill rate;
- `default`: no annotation and no report: the default seed.

The student keeps its preset (Llama-3.2-1B) in every run.

    python benchmarks/autoscale_seed_source.py                    # azure, mooncake, bursty-10x
    python benchmarks/autoscale_seed_source.py --workload azure --out /tmp/seed_source.json

Simulated time, router seed 0: deterministic; the machine only sets the wall time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from typing import Any

from autoscale_phase import known, trace_files, workload
from autoscale_setup import PRIMARY_MODEL, add_replay_options, misses, service, ttft_attainment
from results_paths import RESULTS

from llmfleet.plan.models import get_model
from llmfleet.sim.production import simulate_service

VARIANTS = ("preset", "reported", "default")


def run_one(args: tuple[str, str, float, int]) -> dict[str, Any]:
    name, variant, slo_s, initial = args
    t0 = time.monotonic()
    shapes = {"primary": get_model(PRIMARY_MODEL)}
    isvc = service("slo", slo_s, initial, model=PRIMARY_MODEL if variant == "preset" else None)
    res, hook = simulate_service(workload(name), isvc, shapes=None if variant == "preset" else shapes,
                                 reported=variant == "reported")
    if hook is None:
        raise RuntimeError("the slo policy runs a hook")
    return {"workload": name, "variant": variant, "attainment": round(ttft_attainment(res, slo_s), 5),
            "misses": misses(res, slo_s), "gpuSeconds": round(res.summary["gpuSeconds"], 1),
            "peakPrimaries": max(d["primary"] for d in hook.timeline) if hook.timeline else initial,
            "scalingActions": hook.actions, "wallSeconds": round(time.monotonic() - t0, 1)}


def render(doc: dict[str, Any]) -> str:
    lines = ["| workload | seed from | TTFT attainment | GPU-seconds | vs preset | peak primaries | actions |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        ref = next(x for x in doc["runs"] if (x["workload"], x["variant"]) == (r["workload"], "preset"))
        lines.append(f"| {r['workload']} | {r['variant']} | {100 * r['attainment']:.2f}% | {r['gpuSeconds']:,.0f} | "
                     f"{r['gpuSeconds'] / ref['gpuSeconds']:.2f}x | {r['peakPrimaries']} | {r['scalingActions']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append",
                    help="a workload of --recorded (azure, mooncake, bursty-10x, ...); repeatable; default those three")
    add_replay_options(ap, RESULTS / "autoscale_seed_source.json")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(args.out.read_text())))
        return
    recorded = {r["workload"]: r for r in json.loads(args.recorded.read_text())["results"]}
    names = args.workload or ["azure", "mooncake", "bursty-10x"]
    unknown = [n for n in names if not known(n, set()) or n not in recorded]
    if unknown:
        raise SystemExit(f"autoscale_seed_source.py: unknown workload {unknown[0]!r} (the traces "
                         f"{', '.join(trace_files())} or bursty-<factor>x, recorded in {args.recorded})")
    tasks = [(n, v, recorded[n]["ttftSloS"], recorded[n]["initialReplicas"]) for n in names for v in VARIANTS]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
        runs = []
        for row in pool.map(run_one, tasks):
            print(f"{row['workload']:<11} {row['variant']:<8} {100 * row['attainment']:7.3f}%  "
                  f"{row['gpuSeconds']:>8,.0f} GPU-s  ({row['wallSeconds']:g} s)", file=sys.stderr, flush=True)
            runs.append(row)
    doc = {"benchmark": "autoscale_seed_source", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(UTC).isoformat(timespec="seconds"), "simulated": True,
           "machine": {"platform": platform.platform(), "python": platform.python_version(),
                       "processor": platform.processor() or platform.machine()},
           "primary": PRIMARY_MODEL, "policy": "slo", "routerSeed": 0,
           "wallSeconds": round(time.monotonic() - t0, 1), "runs": runs}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(render(doc))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
