"""The router's fault drill: kill -9 a replica mid-stream, a replica that accepts and never answers, slow clients.

One pool of three fake replicas (`python -m llmfleet.testing.fake_backend`: one a separate process, so that it
can be killed for real; two in this process, so that one can be switched to "accept and never answer" while
its health checks keep passing) behind the router as `llmfleet router` serves it, under steady load from 8
clients (half of them streaming, 30 tokens 15 ms apart), no client retries. Phases, one after the other:

* kill: kill -9 of the separate replica while streams run on it;
* hang: one in-process replica's completions hang (health checks pass) until outlier ejection takes it out
  (maxEjectionPercent 100: the killed replica, whose cut streams count as failures, may be ejected too; the
  last replica never is);
* slow clients: 200 connections trickling request headers, 50 trickling a body, 50 silent ones, beside the load.

Prints the counts (what the clients saw per phase, and the router's own counters):

    pytest -s tests/integration/router/test_router_fault_drill.py      # ~25 s
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest

from .conftest import config, wait_for
from .test_router_faults import _slow_client, metric, scrape

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLIENTS, TOKENS, TOKEN_DELAY_MS = 8, 30, 15
FIRST_BYTE_TIMEOUT_S = 1.0
PHASES = ("steady", "kill", "hang", "slow clients", "after")


class Load:
    """Closed-loop clients; every request's outcome counted under the phase in which it ended."""

    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url, self.http = url, http
        self.phase = PHASES[0]
        self.retries: Counter[str] = Counter()  # the router's retries (llmfleet_router_retries_total) per phase
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (phase, kind, outcome)
        self.stop = asyncio.Event()
        self.replicas: Counter[str] = Counter()

    async def one(self, stream: bool) -> tuple[str, str]:
        body = {"model": "m", "messages": [{"role": "user", "content": "drill"}], "max_tokens": TOKENS,
                "stream": stream}
        t0 = time.monotonic()
        try:
            async with self.http.post(self.url + "/v1/chat/completions", json=body,
                                      timeout=aiohttp.ClientTimeout(total=20)) as resp:
                raw = await resp.read()
                self.replicas[resp.headers.get("x-llmfleet-replica", "")] += 1
                if resp.status != 200:
                    return "", f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return "", f"transport error ({type(e).__name__})"
        slow = f" (> {FIRST_BYTE_TIMEOUT_S:.0f} s)" if time.monotonic() - t0 > FIRST_BYTE_TIMEOUT_S else ""
        if not stream:
            return slow, "ok"
        last = raw.decode().strip().split("\n\n")[-1].removeprefix("data: ")
        if last == "[DONE]":
            return slow, "ok"
        return slow, "error event" if "error" in json.loads(last) else "cut silently"

    async def client(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            stream = (i + n) % 2 == 0
            n += 1
            slow, outcome = await self.one(stream)
            self.counts[(self.phase, "stream" if stream else "plain", outcome + slow)] += 1


def table(load: Load) -> list[str]:
    rows = ["| phase | plain | stream | router retries |", "| --- | --- | --- | --- |"]
    for phase in PHASES:
        cells = []
        for kind in ("plain", "stream"):
            got = sorted((o, n) for (p, k, o), n in load.counts.items() if p == phase and k == kind)
            cells.append(", ".join(f"{n} {o}" for o, n in got) or "-")
        rows.append(f"| {phase} | {cells[0]} | {cells[1]} | {load.retries[phase]} |")
    return rows


async def next_phase(load: Load, http: aiohttp.ClientSession, url: str, phase: str) -> None:
    """Start `phase`; the retries counted so far go to the phase that ends."""
    total = metric(await scrape(http, url), "llmfleet_router_retries_total", pool="primary")
    load.retries[load.phase] = int(total) - sum(load.retries.values())
    load.phase = phase


async def test_router_fault_drill(fakes: Any, fake_processes: Any, routers: Any,
                                  http: aiohttp.ClientSession) -> None:
    killed, proc = await fake_processes("--name", "k", "--tokens", str(TOKENS), "--token-delay-ms",
                                        str(TOKEN_DELAY_MS))
    hung = await fakes(name="h", tokens=TOKENS, token_delay_s=TOKEN_DELAY_MS / 1000, record=False)
    steady = await fakes(name="s", tokens=TOKENS, token_delay_s=TOKEN_DELAY_MS / 1000, record=False)
    cfg = config({"primary": ("m", [killed, hung.url, steady.url])}, scorers={"queue-depth": 1.0},
                 limits={"first_byte_timeout_seconds": FIRST_BYTE_TIMEOUT_S, "header_timeout_seconds": 2.0,
                         "body_timeout_seconds": 2.0, "scrape_timeout_seconds": 0.5},
                 outliers={"consecutive_failures": 2, "base_ejection_seconds": 60, "max_ejection_percent": 100})
    r = await routers(cfg)
    await wait_for(lambda: len(r.router.pools["primary"].replicas.routable()) == 3, 10)
    load = Load(r.url, http)
    clients = [asyncio.create_task(load.client(i)) for i in range(CLIENTS)]
    await asyncio.sleep(2.0)

    await next_phase(load, http, r.url, "kill")
    replica = r.router.pools["primary"].replicas.replicas[killed]
    await wait_for(lambda: replica.in_flight >= 2, 10)  # streams in flight on it
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    await asyncio.sleep(2.0)

    await next_phase(load, http, r.url, "hang")
    hung.fail = "hang"  # accepts, never answers; /health stays 200
    outliers = r.router.pools["primary"].replicas.outliers
    await wait_for(lambda: hung.url in outliers.ejected, 20)
    await asyncio.sleep(1.0)

    await next_phase(load, http, r.url, "slow clients")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
    host, port = r.url.removeprefix("http://").split(":")
    silent = [await asyncio.open_connection(host, int(port)) for _ in range(50)]
    t_slow = time.monotonic()
    slow = await asyncio.gather(
        *(_slow_client(r.url, b"POST /v1/chat/completions HTTP/1.1\r\n", b"X-Slow: " + b"a" * 60)
          for _ in range(200)),
        *(_slow_client(r.url, head, body + b" " * 40) for _ in range(50)))
    slow_s = time.monotonic() - t_slow
    silent_closed = 0
    for reader, writer in silent:
        silent_closed += await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()

    await next_phase(load, http, r.url, "after")
    await asyncio.sleep(1.5)
    load.stop.set()
    await asyncio.wait_for(asyncio.gather(*clients), 30)
    await next_phase(load, http, r.url, "")
    text = await scrape(http, r.url)
    counters = {
        "stream errors (killed replica)": metric(text, "llmfleet_router_stream_errors_total", pool="primary",
                                                 replica=killed),
        "ejections (hung replica, failures)": metric(text, "llmfleet_router_outlier_ejections_total",
                                                     pool="primary", replica=hung.url, reason="failures"),
        "client connections closed: header deadline": metric(text, "llmfleet_router_client_timeouts_total",
                                                             phase="header"),
        "client connections closed: body deadline": metric(text, "llmfleet_router_client_timeouts_total",
                                                           phase="body"),
    }
    print("\n" + "\n".join(table(load)))
    print(f"slow clients: {slow.count('closed')} of {len(slow)} trickling closed, {silent_closed} of {len(silent)} "
          f"silent closed; all within {slow_s:.1f} s")
    for name, value in counters.items():
        print(f"{name}: {value:.0f}")

    outcomes = Counter(o for (_p, _k, o) in load.counts.elements())
    assert not [o for o in outcomes if o.startswith(("HTTP", "transport", "cut"))], outcomes
    # only the kill cut streams (with an error event); requests wait for a timeout only in the hang
    assert {p for (p, _k, o) in load.counts if not o.startswith("ok")} == {"kill"}, load.counts
    assert counters["stream errors (killed replica)"] == sum(
        n for (_p, _k, o), n in load.counts.items() if o.startswith("error event"))
    assert counters["ejections (hung replica, failures)"] == 1
    # the 2 failures that ejected it, and requests already on their way to it; none later
    assert 2 <= load.retries["hang"] <= CLIENTS
    assert load.retries["steady"] == load.retries["slow clients"] == load.retries["after"] == 0
    assert slow.count("closed") == len(slow) and silent_closed == len(silent)
    assert counters["client connections closed: body deadline"] == 50
    assert load.counts[("slow clients", "plain", "ok")] > 0 and load.counts[("after", "stream", "ok")] > 0
