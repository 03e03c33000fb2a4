"""The router-overhead benchmark's HTTP load: an open loop at a fixed rate (latency percentiles, timed from each
request's actual send) and a closed loop of N workers (the most requests per second), both over the router's own lean
HTTP/1.1 client, against any OpenAI-style completions endpoint."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time

import aiohttp

from llmfleet.router.upstream_client import UpstreamClient, UpstreamError


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def prompts(n: int = 64) -> list[str]:
    rng = random.Random(0)
    systems = [f"System prompt {i}: you answer questions about topic {i}. " * 4 for i in range(8)]
    return [rng.choice(systems) + f"User question number {j}?" for j in range(n)]


async def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.post(url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1},
                                  timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        await r.read()
                        return
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {timeout:.0f} s")


def request_bodies(stream: bool) -> list[bytes]:
    return [json.dumps({"model": "m", "prompt": p, "max_tokens": 8, "stream": stream}).encode() for p in prompts()]


_HEADERS = b"Content-Type: application/json\r\n"


async def one(client: UpstreamClient, base: str, body: bytes) -> bool:
    """One request, body read to the end. The load generator uses the router's own lean HTTP/1.1 client
    (keep-alive, asyncio Protocol): about a third of aiohttp's CPU per request, so the core it shares with
    the backends does not limit the rates measured."""
    resp = await client.post(base, "/v1/completions", body, _HEADERS, 30.0, 60.0)
    try:
        await resp.read()
        return resp.status == 200
    finally:
        resp.close()


async def open_loop(base: str, rate: float, duration: float, stream: bool) -> dict[str, float]:
    bodies = request_bodies(stream)
    n = int(rate * duration)
    lat: list[float] = []
    lag: list[float] = []
    errors = 0
    client = UpstreamClient(connect_timeout=5.0)
    try:
        warm = json.dumps({"model": "m", "prompt": "warm", "max_tokens": 8}).encode()
        await asyncio.gather(*(one(client, base, warm) for _ in range(50)))
        clock = time.perf_counter  # uvloop's loop.time() has millisecond resolution
        t0 = clock() + 0.05

        async def fire(i: int) -> None:
            nonlocal errors
            sched = t0 + i / rate
            await asyncio.sleep(max(0.0, sched - clock()))
            # Timed from the actual send. uvloop's timers have millisecond granularity: sends land up to ~1 ms
            # before or after their scheduled time. Timing from `sched` put that timer noise (as large as
            # the latencies measured) into every percentile. Each request is its own task, so a slow router
            # cannot hold sends back (the coordinated omission that timing from `sched` guards against); the
            # send lag is reported to show it stayed at the timer's granularity.
            start = clock()
            lag.append(start - sched)
            try:
                ok = await one(client, base, bodies[i % len(bodies)])
            except UpstreamError:
                ok = False
            if ok:
                lat.append(clock() - start)
            else:
                errors += 1

        gc.disable()  # a collection pausing the load generator would show up as latency of whichever router runs
        try:
            await asyncio.gather(*(fire(i) for i in range(n)))
        finally:
            gc.enable()
        elapsed = clock() - t0
    finally:
        client.close()
    return {"offered_rps": rate, "achieved_rps": len(lat) / elapsed, "errors": errors,
            "p50_ms": quantile(lat, 0.5) * 1e3, "p90_ms": quantile(lat, 0.9) * 1e3, "p99_ms": quantile(lat, 0.99) * 1e3,
            "send_lag_p99_ms": quantile(lag, 0.99) * 1e3}


async def closed_loop(base: str, concurrency: int, duration: float, stream: bool) -> dict[str, float]:
    bodies = request_bodies(stream)
    done = errors = 0
    client = UpstreamClient(connect_timeout=5.0)
    end = time.monotonic() + duration

    async def worker(w: int) -> None:
        nonlocal done, errors
        i = w
        while time.monotonic() < end:
            try:
                ok = await one(client, base, bodies[i % len(bodies)])
            except UpstreamError:
                ok = False
            done += ok
            errors += not ok
            i += concurrency

    try:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.monotonic() - t0
    finally:
        client.close()
    return {"max_rps": done / elapsed, "errors": errors, "requests": done}
