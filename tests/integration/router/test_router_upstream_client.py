"""The router's lean HTTP/1.1 client against scripted raw servers: framing, keep-alive, timeouts, errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from llmfleet.router import upstream_client as uc
from llmfleet.router.upstream_client import ConnectFailed, UpstreamBroken, UpstreamClient, UpstreamTimeout
from llmfleet.testing.fake_backend import serve_lean
from llmfleet.util.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

JSON = b"Content-Type: application/json\r\n"
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server running `script` per connection; counts connections and keeps the raw requests."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        req = head + await reader.readexactly(length)
        self.requests.append(req)
        return req

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Script], Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def make(script: Script) -> RawServer:
        s = RawServer(script)
        s.server = await asyncio.start_server(s._handle, "127.0.0.1", 0)
        servers.append(s)
        return s

    yield make
    for s in servers:
        assert s.server is not None
        s.server.close()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout=1.0, keepalive=30.0)
    yield c
    c.close()


async def post(c: UpstreamClient, url: str, body: bytes = b"{}", first_byte: float = 2.0,
               total: float = 5.0) -> tuple[int, str, bytes]:
    resp = await c.post(url, "/v1/completions", body, JSON, first_byte, total)
    try:
        return resp.status, resp.content_type, await resp.read()
    finally:
        resp.close()


async def test_content_length_chunked_and_keepalive_reuse(raw, client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            req = await srv.read_request(reader)
            if req.endswith(b'"chunked"'):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for part in (b"data: 1\n\n", b"data: [DONE]\n\n"):
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"ok\": true}"[:-1])
                writer.write(b"}")
            await writer.drain()

    srv = await raw(script)
    assert await post(client, srv.url, b'"plain"') == (200, "application/json", b'{"ok": true}')
    assert await post(client, srv.url, b'"chunked"') == (200, "text/event-stream", b"data: 1\n\ndata: [DONE]\n\n")
    assert await post(client, srv.url, b'"plain"') == (200, "application/json", b'{"ok": true}')
    assert srv.connections == 1  # one keep-alive connection for the three requests
    first = srv.requests[0]
    assert first.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nContent-Length: 7\r\n" in first and b"\r\nContent-Type: application/json\r\n" in first
    assert first.endswith(b"\r\n\r\n\"plain\"")


async def test_read_until_close_and_connection_close_not_reused(raw, client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    srv = await raw(script)
    assert await post(client, srv.url) == (200, "text/plain", b"all of it")
    assert await post(client, srv.url) == (200, "text/plain", b"all of it")
    assert srv.connections == 2


async def test_stale_idle_connection_is_retried_once_on_a_fresh_one(raw, client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # keep-alive announced, but the next request on this connection meets its idle-timeout close
        await srv.read_request(reader)

    srv = await raw(script)
    assert (await post(client, srv.url))[2] == b"ok"
    assert (await post(client, srv.url))[2] == b"ok"
    assert srv.connections == 2 and len(srv.requests) == 3  # the dropped request was sent again, once


async def test_closed_before_headers_on_a_fresh_connection_is_broken(raw, client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)

    srv = await raw(script)
    with pytest.raises(UpstreamBroken, match="before the response headers"):
        await post(client, srv.url)


async def test_connect_refused_is_connect_failed(client) -> None:
    port = free_port()  # released again: nothing listens there
    with pytest.raises(ConnectFailed):
        await post(client, f"http://127.0.0.1:{port}")


async def test_first_byte_gap_and_total_timeouts(raw, client) -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        await asyncio.sleep(10)

    srv = await raw(hang)
    with pytest.raises(UpstreamTimeout, match="no response within"):
        await post(client, srv.url, first_byte=0.2)

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await trickler.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)

    trickler = await raw(trickle)
    # every gap (0.1 s) is within the first-byte/gap timeout (0.5 s): only the whole-request deadline stops it
    resp = await client.post(trickler.url, "/v1/completions", b"{}", JSON, 0.5, 0.8)
    got = b""
    with pytest.raises(UpstreamTimeout, match="request deadline"):
        while data := await resp.next_data():
            got += data
    resp.close()
    assert 3 <= len(got) <= 9

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await staller.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n")
        await writer.drain()
        await asyncio.sleep(10)

    staller = await raw(stall)
    resp = await client.post(staller.url, "/v1/completions", b"{}", JSON, 0.3, 5.0)
    assert await resp.next_data() == b"x"
    with pytest.raises(UpstreamTimeout, match="without data"):
        await resp.next_data()
    resp.close()


async def test_malformed_response_and_mid_body_close(raw, client) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await bad.read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    bad = await raw(garbage)
    with pytest.raises(UpstreamBroken, match="invalid HTTP"):
        await post(client, bad.url)

    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await cut.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    cut = await raw(short)
    resp = await client.post(cut.url, "/v1/completions", b"{}", JSON, 1.0, 5.0)
    assert resp.status == 200
    with pytest.raises(UpstreamBroken, match="mid-response"):
        await resp.read()
    resp.close()


async def test_close_before_the_end_closes_the_connection(raw, client) -> None:
    closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            closed.set()

    srv = await raw(endless)
    resp = await client.post(srv.url, "/v1/completions", b"{}", JSON, 1.0, 5.0)
    assert await resp.next_data()
    resp.close()  # the consumer gives up (client gone): the replica must see the connection close
    await asyncio.wait_for(closed.wait(), 5)
    assert not client._pools[srv.url].idle


async def test_back_pressure_pauses_reading(raw, client, monkeypatch) -> None:
    monkeypatch.setattr(uc, "HIGH_WATER", 1000)
    payload = b"y" * 200_000

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        await writer.drain()
        await asyncio.sleep(1)

    srv = await raw(big)
    resp = await client.post(srv.url, "/v1/completions", b"{}", JSON, 1.0, 5.0)
    await asyncio.sleep(0.1)  # let data arrive while nobody reads
    conn = resp._conn
    assert conn.paused and resp._buffered < len(payload)
    assert await resp.read() == payload
    assert not conn.paused
    resp.close()


async def test_lean_fake_backend_speaks_openai(client) -> None:
    port = await serve_lean("127.0.0.1", 0, "lean", 3, {"vllm:num_requests_running": 0})
    url = f"http://127.0.0.1:{port}"
    status, ctype, body = await post(client, url, json.dumps({"model": "m", "prompt": "hi"}).encode())
    doc = json.loads(body)
    assert (status, ctype, doc["usage"]["completion_tokens"], doc["model"]) == (200, "application/json", 3, "m")
    status, ctype, body = await post(client, url, json.dumps({"model": "m", "prompt": "hi", "stream": True,
                                                              "max_tokens": 2}).encode())
    assert (status, ctype) == (200, "text/event-stream")
    assert body.count(b"data: ") == 3 and body.endswith(b"data: [DONE]\n\n")
    assert len(client._pools[url].idle) == 1


async def test_forget_closes_idle_and_finishing_connections(raw, client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    srv = await raw(script)
    assert (await post(client, srv.url))[2] == b"ok"
    idle = client._pools[srv.url].idle[0]
    in_flight = await client.post(srv.url, "/v1/completions", b"{}", JSON, 1.0, 5.0)  # takes the idle one
    assert in_flight._conn is idle
    client.forget(srv.url)  # the replica left the pool while a request was on its way
    assert await in_flight.read() == b"ok"
    in_flight.close()
    assert idle.closed and srv.url not in client._pools


async def test_slow_consumer_is_not_a_replica_timeout(raw, client) -> None:
    """Reading pauses while the client is slow to take the bytes; that wait must not count as the replica's gap."""
    size = 3 * uc.HIGH_WATER

    async def bulk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await fast.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        await writer.drain()
        await asyncio.sleep(5)

    fast = await raw(bulk)
    resp = await client.post(fast.url, "/v1/completions", b"{}", JSON, 0.3, 10.0)
    await asyncio.sleep(1.0)  # more than three read gaps with reading paused
    got = b""
    while data := await resp.next_data():
        got += data
    resp.close()
    assert len(got) == size


async def test_after_send_runs_once_after_the_write_even_across_a_stale_retry(raw, client) -> None:
    """The router's routing bookkeeping rides on `after_send`: exactly once per post, after the request was
    handed to the socket, also when a stale keep-alive connection makes the client send it again; an error in
    it closes the response (the replica aborts) and reaches the caller."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await srv.read_request(reader)  # the next request on this connection meets a close: stale

    srv = await raw(script)
    calls: list[int] = []

    def after() -> None:
        calls.append(1)

    for _ in range(2):
        resp = await client.post(srv.url, "/v1/completions", b"{}", JSON, 2.0, 5.0, after)
        assert await resp.read() == b"ok"
        resp.close()
    assert len(calls) == 2 and len(srv.requests) == 3  # once per post, not once per send

    def broken() -> None:
        raise RuntimeError("bookkeeping failed")

    with pytest.raises(RuntimeError, match="bookkeeping failed"):
        await client.post(srv.url, "/v1/completions", b"{}", JSON, 2.0, 5.0, broken)
    assert not client._pool(srv.url).idle  # that connection was closed, not returned to the pool


async def test_get_reads_whole_answers_over_one_connection_within_its_deadline(raw, client) -> None:
    heads: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            if head.startswith(b"GET /health "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            elif head.startswith(b"GET /metrics "):  # chunked, as a streaming exposition may be
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
                for part in (b"vllm:num_requests_running 2\n", b"vllm:num_requests_waiting 0\n"):
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
            await writer.drain()

    srv = await raw(script)
    auth = b"authorization: Bearer k\r\n"
    assert await client.get(srv.url, "/health", auth, 1.0) == (200, b"")
    assert await client.get(srv.url, "/metrics", auth, 1.0) == (
        200, b"vllm:num_requests_running 2\nvllm:num_requests_waiting 0\n")
    assert await client.get(srv.url, "/other", b"", 1.0) == (503, b"busy")
    assert srv.connections == 1  # the checks reuse one keep-alive connection
    with pytest.raises(UpstreamBroken, match="larger than 40 bytes"):  # a 56-byte page against a 40-byte bound
        await client.get(srv.url, "/metrics", auth, 1.0, max_bytes=40)
    assert await client.get(srv.url, "/health", auth, 1.0) == (200, b"")
    assert heads[0].startswith(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:")
    assert heads[0].endswith(b"\r\nauthorization: Bearer k\r\n\r\n") and b"Content-Length" not in heads[0]
    assert b"authorization" not in heads[2] and all(h.startswith(b"GET ") for h in heads)

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)

    slow = await raw(trickle)
    # a page that keeps coming is cut at the GET's one deadline, headers and body together
    with pytest.raises(UpstreamTimeout, match="request deadline"):
        await client.get(slow.url, "/metrics", b"", 0.4)
    with pytest.raises(ConnectFailed):
        await client.get(f"http://127.0.0.1:{free_port()}", "/health", b"", 0.5)
