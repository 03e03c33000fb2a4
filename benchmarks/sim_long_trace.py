"""What a long trace costs to simulate: wall time and peak memory of `llmfleet sim run --autoscaler slo` and of
`benchmarks/autoscale_eval.py` on an hour of Azure-2024-format requests, and the bytes each request holds.

    python benchmarks/sim_long_trace.py                   # 1 h at 28 req/s (~100k requests)
    python benchmarks/sim_long_trace.py --seconds 600     # 10 min at the same rate

The trace: Poisson arrivals at `--rate` (28 req/s by default, the average rate of Azure's week-long 2024 code
release) for `--seconds`, each request with the prompt and output lengths of a random request of the shared 2023
code trace (`--seed`), written as a CSV in the 2024 release's format (TIMESTAMP, ContextTokens, GeneratedTokens)
to a temporary folder. Each command runs as a child process (its own peak RSS, from `os.wait4`); the bytes a
request holds (the workload, one run's per-request records) are measured with `tracemalloc` in this process, on
the benchmarks' static fleet (autoscale_setup.run_static). Per-million-request figures scale the measured costs
to longer traces: the simulator's time and memory grow with the request count at a fixed fleet size. Writes benchmarks/results/sim_long_trace.json.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

from autoscale_setup import TRACES, run_static
from results_paths import RESULTS, ROOT
from rich.console import Console
from rich.table import Table

from llmfleet.sim.traces import load_trace

LENGTHS = TRACES / "azure_llm_code_2023.csv"
START = datetime(2024, 5, 10, tzinfo=UTC)  # the 2024 release's first day; any date reads the same


def write_trace(path: Path, rate: float, seconds: float, seed: int, lengths_from: Path = LENGTHS) -> int:
    """The Poisson trace described above, its lengths drawn from the Azure-format CSV `lengths_from`; returns its
    request count."""
    with lengths_from.open(newline="") as f:
        lengths = [(row["ContextTokens"], row["GeneratedTokens"]) for row in csv.DictReader(f)]
    rng = random.Random(seed)
    n, t = 0, rng.expovariate(rate)
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        while t < seconds:
            stamp = (START + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f+00:00")
            out.writerow([stamp, *rng.choice(lengths)])
            n, t = n + 1, t + rng.expovariate(rate)
    return n


def child(name: str, cmd: list[str]) -> dict[str, object]:
    """Runs `cmd` (output to this process's stderr); its wall seconds and its own peak RSS."""
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sys.stderr)
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage (Popen.wait would not return it)
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        raise SystemExit(f"{name}: exit {rc}")
    return {"step": name, "command": " ".join(cmd), "wallS": round(time.monotonic() - t0, 1),
            "maxRssMiB": round(usage.ru_maxrss / 1024)}


def bytes_per_request(trace: Path, replicas: int) -> dict[str, object]:
    """Bytes held per request by the loaded workload and by one static run's per-request records (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    w = load_trace(trace)
    workload = tracemalloc.get_traced_memory()[0]
    res = run_static(w, replicas, slo_s=1.0)
    gc.collect()
    with_records = tracemalloc.get_traced_memory()[0]
    res.records = []
    gc.collect()
    records = with_records - tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    n = len(w.requests)
    return {"requests": n, "workloadBytesPerRequest": round(workload / n),
            "recordsBytesPerRequest": round(records / n), "staticReplicas": replicas}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=28.0, help="requests per second (Poisson)")
    ap.add_argument("--seconds", type=float, default=3600.0, help="span of the trace")
    ap.add_argument("--seed", type=int, default=1, help="arrivals and the lengths drawn")
    ap.add_argument("--replicas", type=int, default=4,
                    help="`sim run`'s starting fleet, and the static fleet of the bytes-per-request run")
    ap.add_argument("--lengths", type=Path, default=LENGTHS, metavar="CSV",
                    help="an Azure-format trace whose requests' lengths are drawn (default: the shared 2023 code trace)")
    ap.add_argument("--out", type=Path, default=RESULTS / "sim_long_trace.json")
    args = ap.parse_args()
    for flag, value in (("--rate", args.rate), ("--seconds", args.seconds)):
        if not math.isfinite(value) or value <= 0:
            ap.error(f"{flag} {value:g}: it must be a finite number > 0")
    if args.replicas < 1:
        ap.error(f"--replicas {args.replicas}: it must be >= 1")
    if not args.lengths.is_file():
        ap.error(f"--lengths {args.lengths}: no such file (the shared traces are in ../shared/data/traces)")
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "azure_code_poisson.csv"
        n = write_trace(trace, args.rate, args.seconds, args.seed, args.lengths)
        if n == 0:
            raise SystemExit(f"sim_long_trace.py: no request arrives within {args.seconds:g} s at {args.rate:g} "
                             "req/s: give a longer --seconds")
        print(f"{trace.name}: {n:,} requests over {args.seconds:,.0f} s", file=sys.stderr, flush=True)
        steps = [child("sim run --autoscaler slo",
                       [py, "-m", "llmfleet", "sim", "run", "--trace", str(trace), "--autoscaler", "slo",
                        "--replicas", str(args.replicas)]),
                 child("autoscale_eval.py", [py, "benchmarks/autoscale_eval.py", "--trace", str(trace),
                                             "--workload", trace.stem,  # not the synthetic spike it adds
                                             "--out", str(Path(tmp) / "autoscale_eval.json")])]
        held = bytes_per_request(trace, args.replicas)
    for s in steps:  # the commands as one would type them: `python`, the trace by its name
        s["command"] = str(s["command"]).replace(py, "python").replace(tmp + os.sep, "")
        s["wallSPerMillionRequests"] = round(float(s["wallS"]) * 1e6 / n)  # type: ignore[arg-type]
    t = Table(title=f"a {args.seconds:,.0f} s Azure-2024-format trace at {args.rate:g} req/s: {n:,} requests")
    for c in ("step", "wall", "wall per 1M requests", "peak RSS"):
        t.add_column(c)
    for s in steps:
        t.add_row(str(s["step"]), f"{s['wallS']} s", f"{s['wallSPerMillionRequests']:,} s", f"{s['maxRssMiB']} MiB")
    Console(width=120).print(t)
    print(f"held per request: workload {held['workloadBytesPerRequest']} B, one run's records "
          f"{held['recordsBytesPerRequest']} B")
    out = {"benchmark": "sim_long_trace", "command": "python " + " ".join(sys.argv),
           "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                       "loadavgAtEnd": os.getloadavg()},
           "trace": {"format": "azure (2024 release columns)", "rate": args.rate, "seconds": args.seconds,
                     "seed": args.seed, "requests": n, "lengthsFrom": args.lengths.name},
           "steps": steps, "heldPerRequest": held}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
