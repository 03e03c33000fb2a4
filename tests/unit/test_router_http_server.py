"""The router's client connection (llmfleet.router.http_conn.ClientConnection) on its own: framing, keep-alive,
pipelining, deadlines, back-pressure and any bytes, with a fake transport and a handler that echoes."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfleet.router.config import LimitsConfig
from llmfleet.router.http_conn import ClientConnection, Exchange

REQUEST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


class Transport:
    def __init__(self) -> None:
        self.out = b""
        self.aborted = self.closed = self.paused = False

    def write(self, data: bytes) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.aborted or self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 1234) if name == "peername" else None


class Echo:
    """Answers each request with its method, path and body; `gate` holds answers back while clear."""

    def __init__(self) -> None:
        self.seen: list[Exchange] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.cancelled = 0

    async def __call__(self, ex: Exchange) -> None:
        self.seen.append(ex)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if ex.path == "/stream":
            await ex.start(200, {"Content-Type": "text/event-stream"})
            await ex.write(b"data: 1\n\n")
            await ex.end(b"data: [DONE]\n\n")
        else:
            ex.send(200, {"Content-Type": "text/plain"}, f"{ex.method} {ex.path} ".encode() + ex.body)


def connection(loop: asyncio.AbstractEventLoop, header: float = 60, body: float = 60, idle: float = 60,
               max_bytes: int = 1024) -> tuple[ClientConnection, Echo, Transport, list[str]]:
    timeouts: list[str] = []
    handler, transport = Echo(), Transport()
    c = ClientConnection(handler, LimitsConfig(header_timeout_seconds=header, body_timeout_seconds=body,
                                               idle_timeout_seconds=idle, max_request_bytes=max_bytes), loop,
                         timeouts.append)
    c.connection_made(transport)  # type: ignore[arg-type]
    return c, handler, transport, timeouts


async def settle(c: ClientConnection) -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def responses(out: bytes) -> list[bytes]:
    """The bodies of Content-Length responses in `out`, in order."""
    bodies = []
    while out:
        head, _, rest = out.partition(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        bodies.append(rest[:length])
        out = rest[length:]
    return bodies


async def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    c, handler, transport, _ = connection(asyncio.get_running_loop())
    handler.gate.clear()
    get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    c.data_received(REQUEST + get + REQUEST)
    await settle(c)
    assert transport.out == b"" and len(handler.seen) == 1  # one at a time
    handler.gate.set()
    await settle(c)
    assert responses(transport.out) == [b"POST /v1/completions {}", b"GET /health ", b"POST /v1/completions {}"]
    assert not transport.closed and c.task is None


async def test_a_body_split_across_reads_and_chunked_bodies_arrive_whole() -> None:
    c, handler, transport, _ = connection(asyncio.get_running_loop())
    whole = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world"
    for i in range(0, len(whole), 7):
        c.data_received(whole[i:i + 7])
    c.data_received(b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    c.data_received(b"6\r\n world\r\n0\r\n\r\n")
    await settle(c)
    assert responses(transport.out) == [b"POST /a hello world", b"POST /b hello world"]


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    c, _, transport, _ = connection(asyncio.get_running_loop())
    c.data_received(b"POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert transport.out == b"HTTP/1.1 100 Continue\r\n\r\n"
    c.data_received(b"{}")
    await settle(c)
    assert transport.out.split(b"\r\n\r\n", 1)[1].startswith(b"HTTP/1.1 200 OK")


async def test_a_body_over_the_limit_is_not_read_and_the_connection_closes_after_the_answer() -> None:
    c, handler, transport, _ = connection(asyncio.get_running_loop(), max_bytes=1024)
    c.data_received(b"POST /a HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"x" * 100)
    await settle(c)
    [ex] = handler.seen
    assert ex.too_large and ex.body == b"" and transport.closed
    assert b"Connection: close" in transport.out
    c2, handler2, transport2, _ = connection(asyncio.get_running_loop(), max_bytes=1024)
    c2.data_received(b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n")
    c2.data_received(b"400\r\n" + b"x" * 1024 + b"\r\n")
    await settle(c2)
    assert handler2.seen[0].too_large and transport2.closed


async def test_a_streamed_answer_is_chunked_and_http_10_gets_no_chunks_and_a_close() -> None:
    c, _, transport, _ = connection(asyncio.get_running_loop())
    c.data_received(b"GET /stream HTTP/1.1\r\n\r\n")
    await settle(c)
    assert transport.out.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in transport.out and not transport.closed
    c, _, transport, _ = connection(asyncio.get_running_loop())
    c.data_received(b"GET /stream HTTP/1.0\r\n\r\n")
    await settle(c)
    assert transport.out.endswith(b"\r\n\r\ndata: 1\n\ndata: [DONE]\n\n") and transport.closed


async def test_the_client_gone_cancels_its_handler() -> None:
    c, handler, transport, _ = connection(asyncio.get_running_loop())
    handler.gate.clear()
    c.data_received(REQUEST + REQUEST)
    await settle(c)
    c.connection_lost(ConnectionResetError())
    await settle(c)
    assert handler.cancelled == 1 and len(handler.seen) == 1 and transport.out == b""


async def test_back_pressure_holds_a_stream_until_the_transport_drains() -> None:
    c, _, transport, _ = connection(asyncio.get_running_loop())
    c.pause_writing()
    c.data_received(b"GET /stream HTTP/1.1\r\n\r\n")
    await settle(c)
    assert b"data: 1" not in transport.out  # waiting after the head
    c.resume_writing()
    await settle(c)
    assert transport.out.endswith(b"0\r\n\r\n")


async def test_malformed_http_gets_400_and_a_close() -> None:
    c, handler, transport, _ = connection(asyncio.get_running_loop())
    c.data_received(b"NOT HTTP AT ALL\r\n\r\n")
    assert transport.out.startswith(b"HTTP/1.1 400") and transport.closed and handler.seen == []


async def test_headers_that_never_end_get_431_and_a_close() -> None:
    c, handler, transport, _ = connection(asyncio.get_running_loop())
    c.data_received(b"GET /a HTTP/1.1\r\n")
    for _ in range(20):
        c.data_received(b"X-Filler: " + b"y" * 4000 + b"\r\n")
    assert transport.out.startswith(b"HTTP/1.1 431") and transport.closed and handler.seen == []
    c, _, transport, _ = connection(asyncio.get_running_loop())
    c.data_received(b"GET /a HTTP/1.1\r\n" + b"X-Filler: " + b"y" * 30000 + b"\r\n\r\n")  # large, but whole
    await settle(c)
    assert transport.out.startswith(b"HTTP/1.1 200") and not transport.closed


async def test_whole_requests_run_no_deadline() -> None:
    c, _, transport, timeouts = connection(asyncio.get_running_loop(), header=0.05, body=0.05)
    for _ in range(3):
        c.data_received(REQUEST + REQUEST)  # pipelined
    await asyncio.sleep(0.15)  # past both deadlines
    assert len(responses(transport.out)) == 6 and not transport.aborted and timeouts == []


async def test_slow_headers_and_slow_bodies_are_cut() -> None:
    loop = asyncio.get_running_loop()
    c, _, transport, timeouts = connection(loop, header=0.05, body=0.05)
    c.data_received(REQUEST[:20])
    await asyncio.sleep(0.1)
    assert transport.aborted and timeouts == ["header"]
    c, _, transport, timeouts = connection(loop, header=0.2, body=0.05)
    c.data_received(REQUEST[:-1])  # headers complete, body one byte short
    await asyncio.sleep(0.1)
    assert transport.aborted and timeouts == ["body"]


async def test_a_later_request_gets_its_own_header_deadline_and_idle_connections_close() -> None:
    c, _, transport, timeouts = connection(asyncio.get_running_loop(), header=0.1, idle=0.3)
    c.data_received(REQUEST)
    await asyncio.sleep(0.15)  # idle longer than the header deadline: only the idle deadline counts
    c.data_received(REQUEST[:10])
    await asyncio.sleep(0.05)
    assert not transport.aborted
    await asyncio.sleep(0.1)
    assert transport.aborted and timeouts == ["header"]
    c, _, transport, timeouts = connection(asyncio.get_running_loop(), header=0.1, idle=0.2)
    c.data_received(REQUEST)
    await asyncio.sleep(0.1)
    assert not transport.closed
    await asyncio.sleep(0.2)
    assert transport.closed and not transport.aborted and timeouts == []


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=80) | st.sampled_from([REQUEST, REQUEST[:30], b"\r\n\r\n",
                                                                 b"Upgrade: websocket\r\n", b"CONNECT x:1 HTTP/1.1"]),
                       max_size=8))
def test_any_bytes_never_raise(chunks: list[bytes]) -> None:
    loop = asyncio.new_event_loop()
    try:
        c, _, _, _ = connection(loop)
        for chunk in chunks:
            c.data_received(chunk)
        loop.run_until_complete(settle(c))
        c.connection_lost(None)
        loop.run_until_complete(settle(c))
        assert c.timer is None and c.task is None
    finally:
        loop.close()
