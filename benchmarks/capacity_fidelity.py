"""The autoscaler's per-replica model against one simulated replica, at each trace's request mix.

    python benchmarks/capacity_fidelity.py [--trace PATH ...] [--mix IN:OUT ...] [--requests N] [--clip-prompts N ...]
                                           [--out PATH]

`slo` sizes a pool from a model of one replica (llmfleet.autoscaler.capacity): the planner's roofline at the
interval's mean request gives prefill and decode seconds per request, their sum is the replica's service time, and
an Erlang-C queue over prefill work gives the TTFT p95 at a rate. Its learned efficiency corrects the model only
from saturated intervals, which a policy that keeps TTFT headroom seldom produces, so the model's own error is
what the fleet carries most of the time. This script measures that error on the engine model the simulator runs
(StepCostModel steps with chunked prefill and continuous batching), one replica at a time:

- Requests: the trace's own (prompt, output) length pairs, drawn at random, arriving as a Poisson process; prefix
  contents dropped, so no prefix hits on either side (the model is evaluated at hit rate 0). `--mix IN:OUT`: every
  request IN prompt and OUT output tokens (named `fixed IN/OUT`), to see the model's error per request shape.
  `--clip-prompts N ...`: instead of each trace as it is, the trace with every prompt longer than N tokens cut to N
  (named `<trace> clipped N`), once per N, to see how much of the error the longest prompts make.
- Saturated throughput: arrivals at twice the model's capacity; the completions per second between the first and
  the third quartile of the finish times, while the replica has a backlog all along, are its capacity at that mix.
- TTFT p95 at 50, 70 and 85 % of the simulated capacity: the simulator's (and its preemptions: running requests
  the replica evicted when its KV cache ran out, recomputed later as vLLM does) against the model's
  (prefill + the policy's queueing wait p95 at efficiency 1, with the decodes' compute share and the spread of
  the mix's prefill times; null past the model's capacity), and the planner's capacity with each prompt priced on its own
  (llmfleet.plan.capacity.replica_capacity with `prompts`) beside the mean prompt's.

Prints a table and writes benchmarks/results/capacity_fidelity.json (simulated time: deterministic).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autoscale_setup import GPU, PRIMARY_MODEL, TRACES, run_static, service, trace_names
from results_paths import RESULTS

from llmfleet.autoscaler.capacity import (
    RequestCost,
    decode_compute_seconds,
    prefill_seconds,
    prefill_time_scv,
    prompt_length_moments,
    service_seconds,
    wait_p95_seconds,
)
from llmfleet.autoscaler.seeds import seeds_for_service
from llmfleet.plan.capacity import TrafficShape, replica_capacity
from llmfleet.plan.hardware import get_gpu
from llmfleet.plan.models import get_model
from llmfleet.sim.traces import is_trace_file, load_trace
from llmfleet.sim.workload import Request, Workload, WorkloadError

RESULT = RESULTS / "capacity_fidelity.json"
LOADS = (0.5, 0.7, 0.85)  # fractions of the simulated capacity the TTFT p95 is compared at
OVERLOAD = 2.0  # arrival rate, in model capacities, of the saturated-throughput run
PLANNER_SAMPLE = 2000  # prompts the planner's per-prompt figure is taken over (a request log's worth)


def poisson(pairs: Sequence[tuple[int, int]], rate: float, requests: int, seed: int = 1) -> Workload:
    """`requests` requests with lengths drawn from `pairs`, Poisson arrivals at `rate` req/s, no prefix contents."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(requests):
        t += rng.expovariate(rate)
        prompt, output = rng.choice(pairs)
        out.append(Request(i, t, prompt, output))
    return Workload("poisson", out, 64)


@dataclass(frozen=True)
class Saturated:
    """One replica with a backlog all along (`saturated_rps`)."""

    rps: float  # completions per second between the first and the third quartile of the finish times
    preemptions_per_1000: float  # running requests evicted (KV cache full) per 1,000 requests, to be recomputed
    prefill_per_prompt_token: float  # prefill tokens computed per prompt token: 1 + the recomputed share


def saturated_rps(pairs: Sequence[tuple[int, int]], model_rps: float, requests: int) -> Saturated:
    """Completions per second of one replica with a backlog all along: arrivals at OVERLOAD x `model_rps`, and the
    rate of completions between the first and the third quartile of the finish times. The replica fills its batch
    before the first quartile, and at twice its capacity about half the requests are still queued when the last
    arrives, so it is backlogged until well after the third. Also what the run recomputed: the preemptions and the
    prefill tokens computed per prompt token (no prefix hits here, so 1.0 when nothing was preempted)."""
    res = run_static(poisson(pairs, OVERLOAD * model_rps, requests), 1, 1.0)
    finish = sorted(r["arrival"] + r["e2e"] for r in res.records if r["e2e"] is not None)
    lo, hi = len(finish) // 4, (3 * len(finish)) // 4
    if hi <= lo or finish[hi] <= finish[lo]:
        raise ValueError(f"{len(finish)} of {requests} requests finished: too few to measure a rate")
    prompt = sum(r["promptTokens"] for r in res.replicas)
    computed = sum(r["computedPromptTokens"] for r in res.replicas)
    return Saturated(float((hi - lo) / (finish[hi] - finish[lo])), 1000 * int(res.summary["preemptions"]) / requests,
                     computed / prompt if prompt else 1.0)


def at_load(pairs: Sequence[tuple[int, int]], rate: float, requests: int) -> tuple[float, int]:
    """The simulated replica's TTFT p95 at `rate`, and how many running requests it preempted (its KV cache full:
    vLLM recomputes them)."""
    res = run_static(poisson(pairs, rate, requests), 1, 1.0)
    ttft = sorted(r["ttft"] for r in res.records if r["ttft"] is not None)
    p95 = float(ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))]) if ttft else float("nan")
    return p95, int(res.summary["preemptions"])


def evaluate(name: str, pairs: Sequence[tuple[int, int]], requests: int) -> dict[str, Any]:
    """One mix: the model's capacity and TTFT p95 (at the mean request) against the simulated replica's."""
    mean_in = sum(p for p, _ in pairs) / len(pairs)
    mean_out = sum(o for _, o in pairs) / len(pairs)
    seed = seeds_for_service(service("slo", 1.0, 1))["primary"].for_mix(mean_in, mean_out, 0.0)
    prefill = prefill_seconds(seed, 1.0, mean_in, 0.0)
    decode = service_seconds(seed, 1.0, mean_in, mean_out, 0.0) - prefill
    scv = prefill_time_scv(prompt_length_moments([p for p, _ in pairs]), seed.prefill_attention_ratio)
    cost = RequestCost(prefill, decode, decode_compute_seconds(seed, 1.0, mean_out), scv)
    model_rps = 1.0 / (prefill + decode)
    sample = [p for p, _ in random.Random(0).sample(list(pairs), min(PLANNER_SAMPLE, len(pairs)))]
    shape = TrafficShape(input_tokens=round(mean_in), output_tokens=round(mean_out))
    per_prompt = replica_capacity(get_model(PRIMARY_MODEL), get_gpu(GPU), shape, prompts=sample).requests_per_s
    sat = saturated_rps(pairs, model_rps, requests)
    sim_rps = sat.rps
    loads = []
    for frac in LOADS:
        rate = frac * sim_rps
        predicted = prefill + wait_p95_seconds(1, rate, cost)  # inf: past the model's capacity
        p95, preempted = at_load(pairs, rate, requests)
        loads.append({"fraction": frac, "rateRps": round(rate, 3), "simTtftP95S": round(p95, 3),
                      "modelTtftP95S": round(predicted, 3) if math.isfinite(predicted) else None,
                      "preemptionsPer1000Requests": round(1000 * preempted / requests, 1)})
    return {"workload": name, "requests": len(pairs), "meanInput": round(mean_in), "meanOutput": round(mean_out),
            "modelPrefillS": round(prefill, 4), "modelDecodeS": round(decode, 4),
            "modelDecodeComputeS": round(cost.decode_compute_s or 0.0, 4), "prefillTimeScv": round(scv, 3),
            "modelRps": round(model_rps, 3), "plannerPerPromptRps": round(per_prompt, 3),
            "simulatedRps": round(sim_rps, 3), "modelOverSimulated": round(model_rps / sim_rps, 3),
            "perPromptOverSimulated": round(per_prompt / sim_rps, 3),
            "saturatedPreemptionsPer1000Requests": round(sat.preemptions_per_1000, 1),
            "saturatedPrefillTokensPerPromptToken": round(sat.prefill_per_prompt_token, 3), "loads": loads}


def parse_mix(text: str) -> tuple[int, int]:
    """`IN:OUT` (prompt and output tokens, each >= 1) -> (IN, OUT); ValueError with the reason otherwise."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--mix {text!r}: expected IN:OUT, two whole numbers of tokens >= 1 (e.g. 300:200)")
    return int(parts[0]), int(parts[1])


def table(results: list[dict[str, Any]]) -> str:
    head = ("| workload | mean in / out | simulated req/s | model (mean request) | planner, per prompt | "
            + " | ".join(f"TTFT p95 at {f:.0%}: sim / model" for f in LOADS) + f" | preemptions per 1,000 at {LOADS[-1]:.0%} | "
            "saturated: preemptions per 1,000, prefill tokens per prompt token |")
    lines = [head, "|" + "---|" * (7 + len(LOADS))]
    for r in results:
        ttft = " | ".join(f"{x['simTtftP95S']:.2f} / " + (f"{x['modelTtftP95S']:.2f} s" if x["modelTtftP95S"] is not None
                                                           else "overloaded") for x in r["loads"])
        lines.append(f"| {r['workload']} | {r['meanInput']:,} / {r['meanOutput']:,} | {r['simulatedRps']:.2f} | "
                     f"{r['modelRps']:.2f} ({r['modelOverSimulated']:.2f}x) | "
                     f"{r['plannerPerPromptRps']:.2f} ({r['perPromptOverSimulated']:.2f}x) | {ttft} | "
                     f"{r['loads'][-1]['preemptionsPer1000Requests']:g} | "
                     f"{r['saturatedPreemptionsPer1000Requests']:g}, {r['saturatedPrefillTokensPerPromptToken']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, action="append", help="trace file (default: every trace in "
                    "../shared/data/traces/); repeatable")
    ap.add_argument("--mix", action="append", default=[], metavar="IN:OUT",
                    help="also a fixed request shape: every request IN prompt and OUT output tokens; repeatable")
    ap.add_argument("--requests", type=int, default=6000, help="requests per simulated run (default 6000)")
    ap.add_argument("--clip-prompts", type=int, nargs="+", default=None, metavar="N",
                    help="instead of each trace, the trace with every prompt longer than N tokens cut to N, once per N "
                         "(named '<trace> clipped N')")
    ap.add_argument("--out", type=Path, default=RESULT, help="results JSON (default benchmarks/results/...)")
    args = ap.parse_args(argv)
    if args.requests < 30:
        print(f"--requests {args.requests}: at least 30", file=sys.stderr)
        return 2
    if args.clip_prompts is not None and min(args.clip_prompts) < 1:
        print(f"--clip-prompts {min(args.clip_prompts)}: at least 1", file=sys.stderr)
        return 2
    traces = args.trace or ([] if args.mix else sorted(p for p in TRACES.glob("*") if is_trace_file(p)))
    started = time.time()
    results = []
    try:
        mixes = [parse_mix(m) for m in args.mix]
        names = trace_names(traces)
        for path, name in zip(traces, names, strict=True):
            w = load_trace(path)
            for clip in args.clip_prompts or (None,):
                pairs = [(r.prompt_len if clip is None else min(r.prompt_len, clip), r.output_len) for r in w.requests]
                results.append(evaluate(name if clip is None else f"{name} clipped {clip}", pairs, args.requests))
            print(f"{name}: done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
        for prompt, output in mixes:
            results.append(evaluate(f"fixed {prompt}/{output}", [(prompt, output)], args.requests))
            print(f"fixed {prompt}/{output}: done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    except (WorkloadError, OSError, ValueError) as e:
        print(f"capacity_fidelity: {e}", file=sys.stderr)
        return 2
    print(table(results))
    doc = {"benchmark": "capacity_fidelity", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "python": platform.python_version(),
                       "processor": platform.processor() or platform.machine()},
           "simulated": f"one {PRIMARY_MODEL} replica on {GPU}", "requestsPerRun": args.requests,
           "wallSeconds": round(time.time() - started, 1), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
