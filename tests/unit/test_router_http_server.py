"""The connection guard (llmfleet.router.http_server.ConnectionGuard) on its own: deadlines and any bytes."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfleet.router.config import LimitsConfig
from llmfleet.router.http_server import ConnectionGuard

REQUEST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


class Inner(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def guard(loop: asyncio.AbstractEventLoop, header: float = 0.05, body: float = 0.05
          ) -> tuple[ConnectionGuard, Inner, Transport, list[str]]:
    timeouts: list[str] = []
    inner, transport = Inner(), Transport()
    g = ConnectionGuard(inner, LimitsConfig(header_timeout_seconds=header, body_timeout_seconds=body), loop,
                        timeouts.append)
    g.connection_made(transport)  # type: ignore[arg-type]
    return g, inner, transport, timeouts


async def test_whole_requests_run_no_deadline_and_reach_aiohttp_unchanged() -> None:
    g, inner, transport, timeouts = guard(asyncio.get_running_loop())
    for _ in range(3):
        g.data_received(REQUEST + REQUEST)  # pipelined
    await asyncio.sleep(0.15)  # past both deadlines
    assert inner.data == (REQUEST + REQUEST) * 3 and not transport.aborted and timeouts == []
    assert g.timer is None  # the accept-time timer fired once, found the connection idle, and was not re-armed


async def test_slow_headers_and_slow_bodies_are_cut() -> None:
    loop = asyncio.get_running_loop()
    g, _, transport, timeouts = guard(loop)
    g.data_received(REQUEST[:20])
    await asyncio.sleep(0.1)
    assert transport.aborted and timeouts == ["header"]
    g, _, transport, timeouts = guard(loop, header=0.2)
    g.data_received(REQUEST[:-1])  # headers complete, body one byte short
    await asyncio.sleep(0.1)
    assert transport.aborted and timeouts == ["body"]


async def test_a_later_request_gets_its_own_header_deadline_from_its_first_byte() -> None:
    g, _, transport, timeouts = guard(asyncio.get_running_loop(), header=0.1)
    g.data_received(REQUEST)
    await asyncio.sleep(0.15)  # idle longer than the header deadline: aiohttp's idle timeout's business
    g.data_received(REQUEST[:10])
    await asyncio.sleep(0.05)
    assert not transport.aborted
    await asyncio.sleep(0.1)
    assert transport.aborted and timeouts == ["header"]


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=80) | st.sampled_from([REQUEST, REQUEST[:30], b"\r\n\r\n",
                                                                 b"Upgrade: websocket\r\n", b"CONNECT x:1 HTTP/1.1"]),
                       max_size=8))
def test_any_bytes_are_forwarded_and_never_raise(chunks: list[bytes]) -> None:
    loop = asyncio.new_event_loop()
    try:
        g, inner, _, _ = guard(loop, header=60, body=60)
        for c in chunks:
            g.data_received(c)
        assert inner.data == b"".join(chunks)
        g.connection_lost(None)
        assert inner.lost and g.timer is None
    finally:
        loop.close()
