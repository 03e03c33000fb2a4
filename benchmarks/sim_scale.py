"""How fast the simulator runs: wall-clock seconds for a 1-hour 12k-request workload on 16 replicas and for
1M requests on 1,000 replicas (targets: < 60 s and < 10 min on a 2-core machine).

    python benchmarks/sim_scale.py                      # both cases (the big one with the llmfleet router)
    python benchmarks/sim_scale.py --big-requests 100000 --big-replicas 100   # a smaller big case
    python benchmarks/sim_scale.py --big-router power-of-two                  # the big case with a baseline

The llmfleet router at 1,000 replicas is the production plugin pipeline with candidate preselection
(prefix-index matches plus a random sample, 32 candidates scored per request).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llmfleet.sim import PoolSpec, SimConfig, SyntheticSpec, simulate, synthetic

ROOT = Path(__file__).resolve().parents[1]


def case(name: str, requests: int, replicas: int, router: str, seconds: float = 3600.0) -> dict[str, object]:
    t0, c0 = time.time(), time.process_time()
    spec = SyntheticSpec(duration_s=seconds, rate_rps=requests / seconds, tenants=max(8, replicas // 4), seed=5)
    w = synthetic(spec)
    gen, gen_cpu = time.time() - t0, time.process_time() - c0
    cfg = SimConfig(pools=[PoolSpec(replicas=replicas)], keep_records=requests <= 100_000, series_interval_s=60.0)
    t1, c1 = time.time(), time.process_time()
    res = simulate(w, cfg, router=router)
    sim, sim_cpu = time.time() - t1, time.process_time() - c1
    s = res.summary
    return {"case": name, "requests": len(w.requests), "replicas": replicas, "router": router,
            "simulatedSeconds": round(s["durationS"], 1), "generateS": round(gen, 1), "simulateS": round(sim, 1),
            "generateCpuS": round(gen_cpu, 1), "simulateCpuS": round(sim_cpu, 1),
            "requestsPerWallS": round(len(w.requests) / sim), "engineSteps": sum(int(r["steps"]) for r in res.replicas),
            "ttftP99S": s["ttft"]["p99"], "prefixHitRate": s["prefixHitRate"],
            "maxRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-requests", type=int, default=1_000_000)
    ap.add_argument("--big-replicas", type=int, default=1000)
    ap.add_argument("--big-router", default="llmfleet", help="router for the big case")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-small", action="store_true", help="only the big case")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/sim_scale.json"))
    ap.add_argument("--note", default="2 cores shared with other jobs while measuring",
                    help="what else ran on the machine (recorded in the JSON)")
    args = ap.parse_args()
    rows = [] if args.skip_small else [case("1 h, 12k requests, 16 replicas", 12_000, 16, "llmfleet"),
                                       case("1 h, 12k requests, 16 replicas", 12_000, 16, "least-request")]
    print(json.dumps(rows, indent=1), flush=True)
    if not args.skip_big:
        rows.append(case(f"1 h, {args.big_requests:,} requests, {args.big_replicas} replicas", args.big_requests,
                         args.big_replicas, args.big_router))
    t = Table(title="simulator speed (synthetic workload, Llama-3-8B on H200)")
    for c in ("case", "router", "requests", "engine steps", "generate (s)", "simulate wall (s)", "simulate CPU (s)",
              "req/s wall", "max RSS"):
        t.add_column(c)
    for r in rows:
        t.add_row(str(r["case"]), str(r["router"]), f"{r['requests']:,}", f"{r['engineSteps']:,}", str(r["generateS"]),
                  str(r["simulateS"]), str(r["simulateCpuS"]), f"{r['requestsPerWallS']:,}", f"{r['maxRssMiB']} MiB")
    Console(width=160).print(t)
    out = {"benchmark": "sim_scale", "command": "python " + " ".join(sys.argv),
           "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                       "loadavgAtEnd": os.getloadavg(),
                       "note": args.note},
           "results": rows}
    p = Path(args.out)
    p.write_text(json.dumps(out, indent=1))
    print(f"wrote {p}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
