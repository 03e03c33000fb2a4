"""LoRA adapters on a simulated H200 fleet: adapter-aware routing vs adapter-blind routing.

50 adapters of Llama-3-8B with Zipf popularity, 8 replicas holding 8 adapters each (spec.lora maxCpuLoras: 8),
an adapter load stalls its replica for `--load-ms` (default 200 ms). Each adapter has its own task prompt (a
shared prefix of its requests) followed by a unique user part; prefix keys differ per adapter, as vLLM's KV
blocks do. Routers:

  least-request        adapter-blind: fewest running + waiting requests
  llmfleet             the production pipeline with the default weights (estimated-ttft 1, queue-depth 0.1):
                       adapter-blind, but prefix-aware (and the prefix keys are per adapter)
  llmfleet+adapters    the same plus the adapter-loaded scorer (weight 1.0), what a service with spec.lora gets

Reported: adapter loads, TTFT p50/p99, SLO attainment, per seed; the TTFT p99 over 3 workload seeds.

    python benchmarks/lora_eval.py            # writes benchmarks/results/lora_eval.json
    python benchmarks/lora_eval.py --quick    # a short run, nothing written
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from llmfleet.api.inferenceservice import RouterSpec
from llmfleet.router.config import DEFAULT_ADAPTER_WEIGHT
from llmfleet.sim.engine import PoolSpec, SimConfig, SimRouter, simulate
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.workload import Request, Workload

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = 50
ZIPF = 1.0
REPLICAS = 8
SLOTS = 8
BLOCK = 16
TASK_PROMPT_TOKENS = (256, 1024)  # per adapter, uniform
USER_TOKENS_MEAN = 400.0  # lognormal
OUTPUT_TOKENS_MEAN = 200.0  # lognormal
SEEDS = (0, 1, 2)


def workload(rate_rps: float, duration_s: float, seed: int) -> Workload:
    """Poisson arrivals; each request asks for an adapter drawn from Zipf(ZIPF) over ADAPTERS."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, ADAPTERS + 1) ** ZIPF
    pop /= pop.sum()
    task_blocks = rng.integers(TASK_PROMPT_TOKENS[0] // BLOCK, TASK_PROMPT_TOKENS[1] // BLOCK + 1, ADAPTERS)
    reqs: list[Request] = []
    t = 0.0
    key = 1
    while True:
        t += rng.exponential(1.0 / rate_rps)
        if t >= duration_s:
            break
        a = int(rng.choice(ADAPTERS, p=pop))
        user = max(1, int(rng.lognormal(np.log(USER_TOKENS_MEAN) - 0.125, 0.5)))
        out = max(2, int(rng.lognormal(np.log(OUTPUT_TOKENS_MEAN) - 0.125, 0.5)))
        task = int(task_blocks[a])
        # keys: the adapter's task prompt (shared by its requests), then blocks unique to this request
        keys = tuple(hash(("task", seed, a, j)) for j in range(task)) + tuple(range(key, key + user // BLOCK))
        key += user // BLOCK + 1
        reqs.append(Request(len(reqs), t, task * BLOCK + user, out, keys, adapter=f"adapter-{a}"))
    return Workload(f"lora-zipf{ZIPF:g}-{rate_rps:g}rps", reqs, BLOCK)


def _median(runs: list[dict[str, Any]], *path: str) -> float:
    vals = []
    for r in runs:
        v: Any = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return float(np.median(vals))


def routers(seed: int) -> dict[str, SimRouter | str]:
    aware = {**RouterSpec().scorers, "adapter-loaded": DEFAULT_ADAPTER_WEIGHT}
    return {"least-request": "least-request", "llmfleet": LlmfleetRouter(seed=seed),
            "llmfleet+adapters": LlmfleetRouter(weights=aware, seed=seed)}


def evaluate(rate: float, duration: float, seeds: tuple[int, ...], cfg: SimConfig, con: Console,
             load_ms: float) -> dict[str, Any]:
    """Every router on the workload at `rate` for each seed; prints a table, returns the results row."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:
        w = workload(rate, duration, seed)
        for name, rt in routers(seed).items():
            t0 = time.time()
            s = simulate(w, cfg, router=rt).summary
            runs.setdefault(name, []).append({
                "seed": seed, "requests": s["requests"], "adapterLoads": s["adapterLoads"], "ttft": s["ttft"],
                "sloAttainment": s["sloAttainment"], "prefixHitRate": s["prefixHitRate"],
                "throughputRps": s["throughputRps"], "balance": s["balance"], "wallS": round(time.time() - t0, 1)})
    summary: dict[str, dict[str, float]] = {}
    table = Table(title=f"{ADAPTERS} adapters (Zipf {ZIPF:g}), {REPLICAS} x Llama-3-8B on H200 with {SLOTS} adapter "
                        f"slots, {rate:g} req/s, adapter load {load_ms:g} ms; medians over seeds {list(seeds)}")
    for c in ("router", "adapter loads", "TTFT p50 (s)", "TTFT p99 (s)", "p99 min..max", "SLO att.", "hit rate"):
        table.add_column(c)
    for name, rs in runs.items():
        p99s = [float(r["ttft"]["p99"]) for r in rs]
        s = summary[name] = {
            "adapterLoads": _median(rs, "adapterLoads"), "ttftP50": _median(rs, "ttft", "p50"),
            "ttftP99": _median(rs, "ttft", "p99"), "ttftP99Min": min(p99s), "ttftP99Max": max(p99s),
            "sloAttainment": _median(rs, "sloAttainment"), "prefixHitRate": _median(rs, "prefixHitRate")}
        table.add_row(name, f"{s['adapterLoads']:.0f}", f"{s['ttftP50']:.3f}", f"{s['ttftP99']:.3f}",
                      f"{s['ttftP99Min']:.3f}..{s['ttftP99Max']:.3f}", f"{s['sloAttainment']:.3f}",
                      f"{s['prefixHitRate']:.3f}")
    con.print(table)
    aware, blind = summary["llmfleet+adapters"], summary["least-request"]
    met = aware["adapterLoads"] < blind["adapterLoads"] and aware["ttftP99"] < blind["ttftP99"]
    con.print(f"adapter-aware vs adapter-blind least-request: {aware['adapterLoads']:.0f} vs {blind['adapterLoads']:.0f} "
              f"loads, TTFT p99 {aware['ttftP99']:.3f} vs {blind['ttftP99']:.3f} s: target {'met' if met else 'NOT met'}")
    return {"rateRps": rate, "summary": summary, "runs": runs, "targetMet": met}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 s of traffic, one seed, nothing written")
    ap.add_argument("--rates", type=float, nargs="+", default=[20.0, 40.0, 80.0],
                    help="requests/s over the fleet (default 20 40 80)")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of traffic (default 300)")
    ap.add_argument("--load-ms", type=float, default=200.0, help="adapter load time per replica (default 200 ms)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/lora_eval.json"))
    args = ap.parse_args()
    con = Console(width=150)
    duration = 60.0 if args.quick else args.duration
    seeds = SEEDS[:1] if args.quick else SEEDS
    pool = PoolSpec(model="llama-3-8b", gpu="H200", replicas=REPLICAS, adapter_slots=SLOTS,
                    adapter_load_s=args.load_ms / 1000.0)
    cfg = SimConfig(pools=[pool], ttft_slo_s=2.0, tpot_slo_s=0.1, seed=0)
    t_all = time.time()
    results = []
    met_all = True
    for rate in args.rates:
        row = evaluate(rate, duration, seeds, cfg, con, args.load_ms)
        met_all = met_all and bool(row["targetMet"])
        results.append(row)
    out = {
        "benchmark": "lora_eval",
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine()},
        "simulated": "Llama-3-8B bf16 on H200 (planner roofline)",
        "setup": {"adapters": ADAPTERS, "zipf": ZIPF, "replicas": REPLICAS, "adapterSlots": SLOTS,
                  "adapterLoadMs": args.load_ms, "durationS": duration,
                  "taskPromptTokens": TASK_PROMPT_TOKENS, "userTokensMean": USER_TOKENS_MEAN,
                  "outputTokensMean": OUTPUT_TOKENS_MEAN, "blockSize": BLOCK, "seeds": list(seeds)},
        "scorers": {"llmfleet": RouterSpec().scorers,
                    "llmfleet+adapters": {**RouterSpec().scorers, "adapter-loaded": DEFAULT_ADAPTER_WEIGHT}},
        "rates": results,
        "targetMet": met_all,
        "wallSeconds": round(time.time() - t_all, 1),
    }
    if not args.quick:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        con.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
