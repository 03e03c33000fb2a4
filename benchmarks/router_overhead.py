"""Router overhead: llmfleet router vs sglang-router vs vllm-router in front of the same fast fake backend.

    python benchmarks/router_overhead.py [--duration 5] [--rate 1000] [--compare-python /tmp/rbv/bin/python]

For each router (and "direct", no router) and for streaming and non-streaming completions:
  * open loop at --rate req/s: latency percentiles; added latency = router percentile - direct percentile;
  * closed loop with --concurrency workers: max sustained req/s.
Routers are pinned to CPU 1 (`taskset`), the two fake backends (`fake_backend --lean`: a bare asyncio
Protocol server) and this load generator (the router's lean HTTP/1.1 client) to CPU 0, so "one core" means
one core for the router, and the load side needs far less CPU per request than any router measured. sglang-router and vllm-router (PyPI, Rust) run from --compare-python's
environment (a separate venv: `python -m venv /tmp/rbv && /tmp/rbv/bin/pip install sglang-router vllm-router`);
they are skipped, and the table says so, when not installed.
Also: the route decision time (prefix hashing + match + scorers + picker) for an 8k-token prompt with 100k
blocks indexed, in process.
Writes benchmarks/results/router_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from http_load import closed_loop, open_loop, quantile, wait_ready  # noqa: E402
from router_overhead_report import head_to_head_lines, table, verdicts  # noqa: E402

from llmfleet.router.block_keys import BlockHasher  # noqa: E402
from llmfleet.router.config import PoolConfig, RouterConfig  # noqa: E402
from llmfleet.router.plugins import PrefixIndex, ReplicaState, RequestInfo, build_pipeline  # noqa: E402
from llmfleet.router.prompt_tokens import VERIFY_FIRST, PromptTokenizer  # noqa: E402
from llmfleet.util.net import free_port  # noqa: E402

ROUTER_CPU, LOAD_CPU = "1", "0"


def pin(cpu: str) -> list[str]:
    return ["taskset", "-c", cpu] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process (and its waited-for children) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def run_queue_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (/proc/<pid>/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that just ended, or no schedstats in this kernel
            continue
    return total / 1e9


def histogram_quantile(text: str, metric: str, q: float) -> float | None:
    """Quantile (linear inside a bucket) of a Prometheus histogram in exposition text."""
    buckets = []
    for line in text.splitlines():
        if line.startswith(metric + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= q * total:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((q * total - prev_c) / max(c - prev_c, 1e-9))
        prev_le, prev_c = le, c
    return None


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    f = open(log, "wb")  # noqa: SIM115 - inherited by the child
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def router_commands(backends: list[str], tmp: Path, compare_python: str | None) -> dict[str, list[str] | str]:
    """name -> command, or a string saying why it cannot run."""
    out: dict[str, list[str] | str] = {}
    port = free_port()
    cfg = RouterConfig(service="bench", host="127.0.0.1", port=port,
                       pools=[PoolConfig(name="primary", role="primary", served_names=["m"], endpoints=backends)])
    (tmp / "router.yaml").write_text(cfg.to_yaml())
    out["llmfleet"] = [*pin(ROUTER_CPU), sys.executable, "-m", "llmfleet.router", "--config", str(tmp / "router.yaml"),
                       "--log-level", "warning"]
    if compare_python is None or not Path(compare_python).exists():
        out["sglang-router"] = out["vllm-router"] = "not installed (pass --compare-python of a venv that has them)"
        return out
    bindir = Path(compare_python).parent
    probe = subprocess.run([compare_python, "-c", "import sglang_router"], capture_output=True)
    if probe.returncode == 0:
        out["sglang-router"] = [*pin(ROUTER_CPU), compare_python, "-m", "sglang_router.launch_router", "--host",
                                "127.0.0.1", "--port", "{port}", "--worker-urls", *backends, "--policy", "cache_aware",
                                "--prometheus-port", "{pport}", "--log-level", "warn"]
    else:
        out["sglang-router"] = "sglang-router not importable from --compare-python"
    if (bindir / "vllm-router").exists():
        out["vllm-router"] = [*pin(ROUTER_CPU), str(bindir / "vllm-router"), "--host", "127.0.0.1", "--port", "{port}",
                              "--worker-urls", *backends, "--policy", "cache_aware", "--prometheus-port", "{pport}",
                              "--log-level", "warning"]
    else:
        out["vllm-router"] = "vllm-router executable not found next to --compare-python"
    return out


def route_decision_bench(n_blocks: int = 100_000, prompt_tokens: int = 8192, replicas: int = 8,
                         iters: int = 2000, scorers: dict[str, float] | None = None) -> dict[str, Any]:
    """The decision with the router's default scorers (RouterConfig's), unless `scorers` says otherwise."""
    scorers = scorers or RouterConfig(service="bench", pools=[PoolConfig(name="p", role="primary", served_names=["m"],
                                                                        endpoints=["http://127.0.0.1:1"])]).scorers
    bs = 16
    hasher = BlockHasher(bs)
    rng = np.random.default_rng(0)
    index = PrefixIndex(max_blocks=2 * n_blocks, default_capacity=2 * n_blocks)
    reps = [ReplicaState(id=f"r{i}", pool="p", models=("m",), stale=False, running=i % 3, waiting=i % 2,
                         kv_usage=0.1 * i) for i in range(replicas)]
    per_prompt = prompt_tokens // bs
    shared = rng.integers(0, 32000, prompt_tokens // 2, dtype=np.uint64)
    i = 0
    while len(index) < n_blocks:
        toks = rng.integers(0, 32000, prompt_tokens, dtype=np.uint64)
        if i % 10 == 0:
            toks[: len(shared)] = shared
        index.insert(reps[i % replicas].id, hasher.keys(toks)[: min(per_prompt, n_blocks - len(index))])
        i += 1
    pipe = build_pipeline(scorers, index, seed=0)
    prompt = rng.integers(0, 32000, prompt_tokens, dtype=np.uint64)
    prompt[: len(shared)] = shared
    hash_t, decide_t, update_t = [], [], []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        keys = hasher.block_keys(prompt)  # what PromptBlocks hands the router
        t1 = time.perf_counter_ns()
        # The decision proper: filters, scorers (prefix match), picker; the index update is timed apart.
        req = RequestInfo(model="m", block_hashes=keys, input_tokens=prompt_tokens)
        d = pipe.pick(req, reps, commit=False)
        t2 = time.perf_counter_ns()
        pipe.commit(req, d.replica)  # type: ignore[arg-type]
        t3 = time.perf_counter_ns()
        hash_t.append((t1 - t0) / 1e3)
        decide_t.append((t2 - t1) / 1e3)
        update_t.append((t3 - t2) / 1e3)
    total = [a + b for a, b in zip(hash_t, decide_t, strict=True)]
    tok_us = reuse_us = None
    try:
        from llmfleet.local.tinymodel import cache_root

        tj = next(cache_root().glob("tokenizer-bpe*/tokenizer.json"), None)
        if tj is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tj))
            text = Path(statistics.__file__).read_text()[:40000]
            ids = tok.encode(text).ids
            text = tok.decode(ids[:prompt_tokens])
            t0 = time.perf_counter_ns()
            for _ in range(20):
                tok.encode(text, add_special_tokens=False)
            tok_us = (time.perf_counter_ns() - t0) / 20 / 1e3
            # The next turn of a conversation: the same prompt with ~100 tokens more, after the router tokenized
            # this one (PromptTokenizer keeps its ids). Each timing with its own tokenizer, warmed untimed: past
            # the reuses it checks against whole tokenization (on short texts), then this prompt tokenized.
            longer = tok.decode(ids[:prompt_tokens + 100])
            warmed = []
            for _ in range(20):
                pt = PromptTokenizer(tok)
                for i in range(VERIFY_FIRST + 1):
                    pt.encode(text[:300] + f" {i}")
                pt.encode(text)
                warmed.append(pt)
            t0 = time.perf_counter_ns()
            for pt in warmed:
                pt.encode(longer)
            reuse_us = (time.perf_counter_ns() - t0) / 20 / 1e3
    except (ImportError, OSError):
        tok_us = reuse_us = None
    return {"indexed_blocks": len(index), "prompt_tokens": prompt_tokens, "replicas": replicas, "scorers": scorers,
            "hash_p50_us": quantile(hash_t, 0.5), "match_and_pick_p50_us": quantile(decide_t, 0.5),
            "decision_p50_us": quantile(total, 0.5), "decision_p99_us": quantile(total, 0.99),
            "decision_min_us": min(total), "hash_min_us": min(hash_t), "match_and_pick_min_us": min(decide_t),
            "index_update_p50_us": quantile(update_t, 0.5), "tokenize_8k_us": tok_us if tok_us is not None else float("nan"),
            "tokenize_next_turn_us": reuse_us if reuse_us is not None else float("nan")}


async def start_router(name: str, cmd: list[str] | str, tmp: Path) -> tuple[subprocess.Popen[bytes], str] | str:
    """Start one router on a free port and wait until it answers; the reason it cannot run otherwise."""
    if isinstance(cmd, str):
        return cmd
    port = free_port()
    if name == "llmfleet":
        cmd = [*cmd, "--port", str(port)]
    else:
        cmd = [c.replace("{port}", str(port)).replace("{pport}", str(free_port())) for c in cmd]
    proc = start(cmd, tmp / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url)
    except RuntimeError as e:
        stop(proc)
        return f"did not start: {e}; log {tmp / (name + '.log')}"
    return proc, url


async def head_to_head(commands: dict[str, list[str] | str], tmp: Path, rounds: int, duration: float,
                       concurrency: int) -> dict[str, Any]:
    """Closed-loop rounds with every router up at once, measured one after another in an order that rotates
    each round: on a shared machine a change of load then falls on all routers alike rather than on whichever
    ran at that moment. Per round and mode: req/s and the router's CPU per request. Kept: every round, the
    medians, and per round llmfleet's ratio to each peer (req/s: llmfleet / peer; CPU: peer us / llmfleet us,
    so above 1 is llmfleet ahead in both)."""
    up: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    skipped: dict[str, str] = {}
    try:
        for name, cmd in commands.items():
            started = await start_router(name, cmd, tmp)
            if isinstance(started, str):
                skipped[name] = started
            else:
                up[name] = started
        names = list(up)
        per: dict[str, dict[str, list[dict[str, float]]]] = {n: {"nonstream": [], "stream": []} for n in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                proc, url = up[name]
                for stream in (False, True):
                    mode = "stream" if stream else "nonstream"
                    cpu0 = cpu_seconds(proc.pid)
                    res = await closed_loop(url, concurrency, duration, stream)
                    cpu_us = (cpu_seconds(proc.pid) - cpu0) * 1e6 / max(1, res["requests"])
                    per[name][mode].append({"rps": res["max_rps"], "cpu_us": cpu_us, "errors": res["errors"]})
            print(f"head-to-head round {r + 1}/{rounds}:", {n: {m: round(v[m][-1]["rps"]) for m in v}
                                                            for n, v in per.items()}, flush=True)
    finally:
        for proc, _ in up.values():
            stop(proc)
    out: dict[str, Any] = {"rounds": rounds, "duration_s": duration, "concurrency": concurrency, "skipped": skipped,
                           "routers": {}, "llmfleet_vs": {}}
    for name, modes in per.items():
        out["routers"][name] = {m: {"rounds": rows, "rps_median": statistics.median(x["rps"] for x in rows),
                                    "cpu_us_median": statistics.median(x["cpu_us"] for x in rows)}
                                for m, rows in modes.items() if rows}
    if "llmfleet" in per:
        for peer in (n for n in per if n != "llmfleet"):
            ratios: dict[str, Any] = {}
            for m in ("nonstream", "stream"):
                ours, theirs = per["llmfleet"][m], per[peer][m]
                rps = [a["rps"] / b["rps"] for a, b in zip(ours, theirs, strict=True) if b["rps"]]
                cpu = [b["cpu_us"] / a["cpu_us"] for a, b in zip(ours, theirs, strict=True) if a["cpu_us"]]
                ratios[m] = {"rps_ratio_per_round": rps, "rps_ratio_median": statistics.median(rps) if rps else None,
                             "cpu_ratio_per_round": cpu, "cpu_ratio_median": statistics.median(cpu) if cpu else None}
            out["llmfleet_vs"][peer] = ratios
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="router-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    backends = []
    results: dict[str, Any] = {"routers": {}, "skipped": {}}
    try:
        for i in range(2):
            p = free_port()
            procs.append(start([*pin(LOAD_CPU), sys.executable, "-m", "llmfleet.testing.fake_backend", "--port", str(p),
                                "--tokens", "8", "--name", f"b{i}", "--lean"], tmp / f"backend{i}.log"))
            backends.append(f"http://127.0.0.1:{p}")
        for b in backends:
            await wait_ready(b)
        targets: dict[str, list[str] | str] = {"direct": "direct"}
        targets.update(router_commands(backends, tmp, args.compare_python))
        for name, cmd in targets.items():
            if name not in args.only and args.only:
                continue
            proc = None
            if name == "direct":
                url = backends[0]
            else:
                started = await start_router(name, cmd, tmp)
                if isinstance(started, str):
                    results["skipped"][name] = started
                    print(f"{name}: skipped: {started}")
                    continue
                proc, url = started
            row: dict[str, Any] = {}
            for stream in (False, True):
                mode = "stream" if stream else "nonstream"
                row[mode] = {"light": await open_loop(url, args.light_rate, args.duration, stream)}
                wait0, t_open = run_queue_wait_s(proc.pid) if proc is not None else 0.0, time.monotonic()
                row[mode]["open"] = await open_loop(url, args.rate, args.duration, stream)
                if proc is not None:
                    # Time the router was ready to run but another process had its core: ~0 on a quiet
                    # machine; when large, its wall-clock latencies measure the machine, not the router.
                    row[mode]["open"]["router_run_queue_wait_ms_per_s"] = (
                        (run_queue_wait_s(proc.pid) - wait0) * 1e3 / (time.monotonic() - t_open))
                cpu0 = cpu_seconds(proc.pid) if proc is not None else None
                row[mode]["closed"] = await closed_loop(url, args.concurrency, args.duration, stream)
                if proc is not None and cpu0 is not None and row[mode]["closed"]["requests"]:
                    # CPU per request is what contention from other work cannot inflate much:
                    # 1e6 / cpu_us is the req/s one dedicated core would sustain.
                    cpu_us = (cpu_seconds(proc.pid) - cpu0) * 1e6 / row[mode]["closed"]["requests"]
                    row[mode]["closed"]["router_cpu_us_per_request"] = cpu_us
                    row[mode]["closed"]["one_core_rps_from_cpu"] = 1e6 / cpu_us if cpu_us > 0 else None
                print(name, mode, row[mode], flush=True)
            if name == "llmfleet":
                async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
                    text = await r.text()
                row["router_overhead_before_upstream_us"] = {
                    f"p{int(q * 100)}": (v * 1e6 if (v := histogram_quantile(text, "llmfleet_router_overhead_seconds", q))
                                         is not None else None) for q in (0.5, 0.9, 0.99)}
            results["routers"][name] = row
            if proc is not None:
                stop(proc)
        if args.rounds:
            results["head_to_head"] = await head_to_head(
                {n: c for n, c in targets.items() if n != "direct" and (not args.only or n in args.only)},
                tmp, args.rounds, args.duration, args.concurrency)
    finally:
        for p in procs:
            stop(p)
    direct = results["routers"].get("direct")
    for name, row in results["routers"].items():
        for mode, r in row.items():
            if mode not in ("stream", "nonstream"):
                continue
            if direct and name != "direct":
                for load in ("light", "open"):
                    d = direct[mode][load]
                    r[load]["added_p50_ms"] = r[load]["p50_ms"] - d["p50_ms"]
                    r[load]["added_p99_ms"] = r[load]["p99_ms"] - d["p99_ms"]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--light-rate", type=float, default=200.0, help="a second, unsaturated open-loop rate")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--compare-python", default=os.environ.get("ROUTER_BENCH_PYTHON", "/tmp/rbv/bin/python"))
    ap.add_argument("--only", nargs="*", default=[], help="subset of direct llmfleet sglang-router vllm-router")
    ap.add_argument("--skip-http", action="store_true", help="only the route-decision micro-benchmark")
    ap.add_argument("--rounds", type=int, default=0,
                    help="then this many head-to-head closed-loop rounds, all routers up, order rotating")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "router_overhead.json"))
    ap.add_argument("--decision-json", action="store_true", help=argparse.SUPPRESS)  # the child process below
    args = ap.parse_args()
    if args.decision_json:
        gc.collect()
        gc.freeze()  # as the router does after start-up
        print(json.dumps(route_decision_bench()))
        return
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if pin(LOAD_CPU):  # this load generator shares CPU 0 with the backends; the router has CPU 1 to itself
        os.sched_setaffinity(0, {int(LOAD_CPU)})
    load_at_start = os.getloadavg()[0]
    res: dict[str, Any] = {"routers": {}, "skipped": {}}
    if not args.skip_http:
        res = asyncio.run(bench(args))
    # The decision is the router's work: measured in a fresh process on the router's core (CPU 1), not in this
    # load generator (CPU 0, shared with the backends, its heap full of the HTTP runs).
    child = subprocess.run([*pin(ROUTER_CPU), sys.executable, __file__, "--decision-json"], capture_output=True,
                           text=True, check=True)
    res["route_decision"] = json.loads(child.stdout.strip().splitlines()[-1])
    res["args"] = {k: v for k, v in vars(args).items() if k != "out"}
    res["command"] = " ".join(["python", "benchmarks/router_overhead.py", *sys.argv[1:]])
    res["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load1 = os.getloadavg()[0]
    res["machine"] = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                      "processor": platform.processor() or platform.machine(), "loadavg_1m_at_start": load_at_start,
                      "loadavg_1m_at_end": load1,
                      "note": "routers pinned to CPU 1, backends + load generator to CPU 0; the load averages "
                              "say how busy the machine was"}
    targets = {"added_p50_le_0.5ms": None, "added_p99_le_2ms": None, "ge_2000_rps": None, "decision_le_50us": None}
    ll = res["routers"].get("llmfleet")
    if ll:
        modes = [ll[m] for m in ("stream", "nonstream") if m in ll]
        direct = res["routers"].get("direct", {})
        # Added latency at the target rate means something only when the direct baseline kept up with it.
        valid = bool(direct) and all(direct[m]["open"]["achieved_rps"] >= 0.95 * args.rate
                                     for m in ("stream", "nonstream") if m in direct)
        targets["added_latency_measurable"] = valid
        if valid:
            targets["added_p50_le_0.5ms"] = all(r["open"]["added_p50_ms"] <= 0.5 for r in modes)
            targets["added_p99_le_2ms"] = all(r["open"]["added_p99_ms"] <= 2.0 for r in modes)
        targets["ge_2000_rps"] = all(r["closed"]["max_rps"] >= 2000 for r in modes)
        targets["ge_2000_rps_from_cpu_time"] = all((r["closed"].get("one_core_rps_from_cpu") or 0) >= 2000
                                                  for r in modes)
    targets["decision_le_50us"] = res["route_decision"]["decision_p50_us"] <= 50
    targets["decision_le_50us_uncontended_min"] = res["route_decision"]["decision_min_us"] <= 50
    res["targets_met"] = targets
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(table(res))
    print()
    print(verdicts(res))
    if "head_to_head" in res:
        print(head_to_head_lines(res["head_to_head"]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
