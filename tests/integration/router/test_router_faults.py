"""The router under faults and abuse: a replica killed mid-stream, a replica that accepts and never answers,
slow (slowloris) clients, and bodies that are not UTF-8 JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmfleet.testing.fake_backend import FakeBackend

from .conftest import config, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}
CORPUS = Path(__file__).resolve().parents[2] / "hostile" / "router"


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, value = line.rsplit(" ", 1)
            got = ",".join(sorted(head[len(name) + 1:-1].split(",")))
            if got == want:
                return float(value)
    return 0.0


async def scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as resp:
        return await resp.text()


async def scrape_text(url: str) -> str:
    async with aiohttp.ClientSession() as http:
        return await scrape(http, url)


async def test_replica_killed_mid_stream_ends_with_an_error_event_counted_and_logged_once(
        fake_processes: Any, routers: Any, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    """SIGKILL of the replica's process while it streams: the client gets the tokens so far, then an
    OpenAI-style error event and no [DONE]; the router counts it for that pool and replica and logs it once."""
    url, fake = await fake_processes("--tokens", "200", "--token-delay-ms", "20")
    r = await routers(config({"primary": ("m", [url])}))
    await wait_for(lambda: bool(r.router.pools["primary"].replicas.routable()), 10)
    caplog.set_level(logging.WARNING, "llmfleet.router")
    received = b""
    async with http.post(r.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 200, "stream": True},
                         timeout=aiohttp.ClientTimeout(total=20)) as resp:
        assert resp.status == 200
        async for chunk in resp.content.iter_any():
            received += chunk
            if received.count(b"data: ") == 3 and fake.returncode is None:
                os.kill(fake.pid, signal.SIGKILL)
                fake.wait(10)
    events = [e.removeprefix("data: ") for e in received.decode().strip().split("\n\n")]
    assert len(events) >= 4 and "[DONE]" not in events
    assert all("error" not in json.loads(e) for e in events[:-1])
    error = json.loads(events[-1])["error"]
    assert error["type"] == "upstream_error" and error["code"] == 502 and "mid-response" in error["message"]
    text = await scrape(http, r.url)
    assert metric(text, "llmfleet_router_stream_errors_total", pool="primary", replica=url) == 1
    assert metric(text, "llmfleet_router_requests_total", pool="primary", model="m", endpoint="chat", status="502",
                  degraded="false") == 1
    assert len([rec for rec in caplog.records if "mid-response" in rec.getMessage()]) == 1


async def test_replica_that_accepts_and_never_answers_is_ejected(fakes: Any, routers: Any,
                                                                 http: aiohttp.ClientSession) -> None:
    """A replica whose health checks pass but whose completions hang: after `consecutiveFailures` timeouts it
    leaves rotation (the other replica serves everything meanwhile), then comes back after the back-off."""
    hung = await fakes(name="hung", fail="hang")
    good = await fakes(name="good")
    cfg = config({"primary": ("m", [hung.url, good.url])}, scorers={"queue-depth": 1.0},
                 limits={"first_byte_timeout_seconds": 0.3},
                 outliers={"consecutive_failures": 2, "base_ejection_seconds": 1.5})
    r = await routers(cfg)
    await wait_for(lambda: len(r.router.pools["primary"].replicas.routable()) == 2)
    for _ in range(12):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200 and resp.headers["x-llmfleet-replica"] == good.url
    assert len(hung.requests) == 2  # the two timeouts that ejected it; nothing after
    text = await scrape(http, r.url)
    assert metric(text, "llmfleet_router_outlier_ejections_total", pool="primary", replica=hung.url,
                  reason="failures") == 1
    async with http.get(r.url + "/debug/replicas") as resp:
        states = {x["replica"]: x["ejected"] for x in (await resp.json())["replicas"]}
    assert states == {hung.url: True, good.url: False}
    await wait_for(lambda: not r.router.pools["primary"].replicas.outliers.ejected, 5)  # back after 1.5 s
    text = await scrape(http, r.url)
    assert metric(text, "llmfleet_router_replica_ejected", pool="primary", replica=hung.url) == 0


async def test_a_replica_far_slower_than_its_peers_is_ejected(fakes: Any, routers: Any,
                                                              http: aiohttp.ClientSession) -> None:
    """Answers, but 0.3 s per request where its peers take milliseconds (4 tokens: ~60 ms per token against
    under 1 ms): ejected as slow once both have enough samples, through the real request path's timings."""
    slow = await fakes(name="slow", delay_s=0.3)
    fast = await fakes(name="fast")
    r = await routers(config({"primary": ("m", [slow.url, fast.url])}, scorers={"queue-depth": 1.0},
                             outliers={"min_requests": 3, "interval_seconds": 0.1, "window_requests": 3}))
    await wait_for(lambda: len(r.router.pools["primary"].replicas.routable()) == 2)
    outliers = r.router.pools["primary"].replicas.outliers
    sent = 0
    while slow.url not in outliers.ejected and sent < 40:
        async with http.post(r.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 4}) as resp:
            assert resp.status == 200
        sent += 1
    assert outliers.ejected.keys() == {slow.url} and len(slow.requests) >= 3
    text = await scrape(http, r.url)
    assert metric(text, "llmfleet_router_outlier_ejections_total", pool="primary", replica=slow.url,
                  reason="slow") == 1
    before = len(slow.requests)
    for _ in range(5):
        async with http.post(r.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 4}) as resp:
            assert resp.headers["x-llmfleet-replica"] == fast.url
    assert len(slow.requests) == before


async def test_the_last_replica_of_a_pool_is_never_ejected(fakes: Any, routers: Any,
                                                           http: aiohttp.ClientSession) -> None:
    hung = await fakes(name="hung", fail="hang")
    r = await routers(config({"primary": ("m", [hung.url])}, limits={"first_byte_timeout_seconds": 0.2,
                                                                     "max_retries": 0},
                             outliers={"consecutive_failures": 1}))
    for _ in range(3):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 503
    assert len(hung.requests) == 3 and not r.router.pools["primary"].replicas.outliers.ejected


async def _slow_client(url: str, first: bytes, drip: bytes) -> str:
    """Send `first`, then one byte of `drip` every 0.1 s; how the connection ended: "closed" by the router,
    or "open" when it is all sent (the router is still waiting)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    ended = asyncio.ensure_future(reader.read())  # b"" (or a reset) once the router closes the connection
    try:
        writer.write(first)
        for b in drip:
            await asyncio.wait([ended], timeout=0.1)
            if ended.done():
                return "closed"
            writer.write(bytes([b]))
        return "open"
    finally:
        ended.cancel()
        writer.close()


async def test_slow_clients_are_closed_while_normal_traffic_flows(fakes: Any, routers: Any,
                                                                  http: aiohttp.ClientSession) -> None:
    """Slowloris: 20 connections trickling headers, 10 trickling a body, 10 that never send a byte. Each is
    closed at its deadline (headers 1 s, body 1 s) while ordinary requests keep being served."""
    a = await fakes(name="a")
    r = await routers(config({"primary": ("m", [a.url])},
                             limits={"header_timeout_seconds": 1.0, "body_timeout_seconds": 1.0,
                                     "idle_timeout_seconds": 2.0}))
    await wait_for(lambda: bool(r.router.pools["primary"].replicas.routable()))
    body = json.dumps(CHAT).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    slow_heads = [_slow_client(r.url, b"POST /v1/chat/completions HTTP/1.1\r\n", b"X-Slow: " + b"a" * 100)
                  for _ in range(20)]
    slow_bodies = [_slow_client(r.url, head, body) for _ in range(10)]
    host, port = r.url.removeprefix("http://").split(":")
    silent_conns = [await asyncio.open_connection(host, int(port)) for _ in range(10)]
    slow = asyncio.gather(*slow_heads, *slow_bodies)
    served = 0
    t_end = asyncio.get_running_loop().time() + 3.0
    while asyncio.get_running_loop().time() < t_end:
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
            served += 1
        await asyncio.sleep(0.02)
    outcomes = await asyncio.wait_for(slow, 15)
    assert outcomes[:30] == ["closed"] * 30
    for reader, writer in silent_conns:  # opened, never sent a byte: closed at the header deadline
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    assert served > 20
    text = await scrape(http, r.url)
    assert metric(text, "llmfleet_router_client_timeouts_total", phase="header") >= 30
    assert metric(text, "llmfleet_router_client_timeouts_total", phase="body") == 10


async def test_requests_within_the_deadlines_are_served_however_they_are_framed(fakes: Any, routers: Any) -> None:
    """The guard follows the framing, it does not get in its way: a request split over reads within its
    deadlines, a chunked body, and two pipelined requests in one write are all answered."""
    a = await fakes(name="a")
    r = await routers(config({"primary": ("m", [a.url])}, limits={"header_timeout_seconds": 1.0,
                                                                  "body_timeout_seconds": 1.0}))
    await wait_for(lambda: bool(r.router.pools["primary"].replicas.routable()))
    host, port = r.url.removeprefix("http://").split(":")
    body = json.dumps(CHAT).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    reader, writer = await asyncio.open_connection(host, int(port))

    async def answer() -> bytes:
        status = await reader.readuntil(b"\r\n\r\n")
        length = int(status.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        return status.split(b"\r\n")[0]

    for part in (head, b"Content-Length: %d\r\n\r\n" % len(body), body[:10], body[10:]):  # 0.6 s per phase
        writer.write(part)
        await asyncio.sleep(0.3)
    assert await answer() == b"HTTP/1.1 200 OK"
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (10, body[:10], len(body) - 10, body[10:])
    writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    assert await answer() == b"HTTP/1.1 200 OK"
    one = head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    writer.write(one + one)
    assert [await answer(), await answer()] == [b"HTTP/1.1 200 OK"] * 2
    await asyncio.sleep(1.5)  # idle between requests is not a header deadline
    writer.write(one)
    assert await answer() == b"HTTP/1.1 200 OK"
    writer.close()
    for request in (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n"):  # aiohttp's to answer
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)).startswith(b"HTTP/1.")
        writer.close()
    assert metric(await scrape_text(r.url), "llmfleet_router_client_timeouts_total", phase="header") == 0


async def test_kept_alive_connections_are_closed_when_idle(fakes: Any, routers: Any) -> None:
    a = await fakes(name="a")
    r = await routers(config({"primary": ("m", [a.url])}, limits={"idle_timeout_seconds": 0.5}))
    host, port = r.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    t0 = asyncio.get_running_loop().time()
    while await asyncio.wait_for(reader.read(65536), 5):  # the body, then the close
        pass
    assert 0.3 < asyncio.get_running_loop().time() - t0 < 3
    writer.close()


@pytest.mark.parametrize("name", ["utf16-le-bom-chat.json", "utf16-be-no-bom-chat.json", "utf8-bom-chat.json",
                                  "utf8-encoded-surrogate.json"])
async def test_bodies_that_are_not_utf8_json_get_400_without_touching_a_replica(
        name: str, fakes: Any, routers: Any, http: aiohttp.ClientSession) -> None:
    a: FakeBackend = await fakes(name="a")
    r = await routers(config({"primary": ("m", [a.url])}))
    async with http.post(r.url + "/v1/chat/completions", data=(CORPUS / name).read_bytes(),
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["type"] == "invalid_request_error"
    assert a.requests == []


async def test_a_lone_surrogate_prompt_is_served_and_logged(fakes: Any, routers: Any, http: aiohttp.ClientSession,
                                                            tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = await fakes(name="a")
    logf = tmp_path / "requests.jsonl"
    r = await routers(config({"primary": ("m", [a.url])}, request_log=str(logf)))
    caplog.set_level(logging.ERROR)
    async with http.post(r.url + "/v1/chat/completions", data=(CORPUS / "ok-lone-surrogate-content.json").read_bytes(),
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
    await wait_for(lambda: logf.exists() and logf.read_bytes().endswith(b"\n"))
    [line] = logf.read_bytes().decode("utf-8").splitlines()
    assert json.loads(line)["messages"][0]["content"] == "\ud800"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
