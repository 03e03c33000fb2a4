"""A lean HTTP/1.1 client for the proxied requests: asyncio Protocol + httptools, keep-alive pools per replica.

Why not aiohttp's ClientSession (still used for LoRA adapter loads and model lists): on the proxy path it was
about a third of the router's CPU per request (request object, tracing hooks, cookie jar, StreamReader with
its own task wake-ups per chunk). This client does only what the router needs:

* POST with a complete body (one write), and GET (health checks, /metrics scrapes); response status,
  Content-Type, body by Content-Length, chunked transfer coding or read-until-close (httptools/llhttp does the
  framing);
* keep-alive reuse (LIFO per replica; idle connections older than `keepalive` are closed when met), and one
  transparent retry on a fresh connection when a *reused* connection is found closed before any response byte
  (the server timed it out while idle; nothing was processed);
* timeouts: connect, headers (first byte), any later gap between reads (like aiohttp's sock_read), and the
  whole request; one lazy timer per connection, re-armed only when it fires: not one per request or chunk;
* back-pressure: reading from the replica pauses while more than `HIGH_WATER` bytes wait for the consumer;
* `close()` before the end closes the connection, so vLLM aborts the request.

Errors: `ConnectFailed` (refused, unreachable, connect timeout), `UpstreamTimeout`, `UpstreamBroken` (closed
or malformed response). All are `UpstreamError`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 256 * 1024
# The largest answer `get` reads (health checks, /metrics scrapes): vLLM's /metrics page is ~50 KB per engine, so
# 16 MiB leaves room for hundreds of engines or LoRA adapters and still bounds what one replica can make the
# router hold.
MAX_GET_BYTES = 16 * 1024 * 1024


class UpstreamError(Exception):
    """Any failure talking to a replica."""


class ConnectFailed(UpstreamError):
    """No connection could be made."""


class UpstreamTimeout(UpstreamError):
    """A deadline passed (first byte, read gap or whole request)."""


class UpstreamBroken(UpstreamError):
    """The connection closed early or the response was not valid HTTP."""


class UpstreamResponse:
    """One response: `status`, `content_type`, then `read()` or `next_data()` until b"", then `close()`."""

    __slots__ = ("_buf", "_buffered", "_conn", "_deadline", "_done", "_error", "_gap", "_headers",
                 "_waiter", "content_type", "received_any", "status")

    def __init__(self, conn: _Connection, gap: float, deadline: float) -> None:
        self._conn = conn
        self._gap = gap
        self._deadline = deadline
        self._buf: list[bytes] = []
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._headers = False
        self.status = 0
        self.content_type = ""
        self.received_any = False

    # -- producer side (the connection's parser callbacks) ---------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._buf.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._done:
            return
        self._error = error
        self._done = True
        self._wake()

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        # The timer is the connection's and outlives the response: with keep-alive, one per connection per
        # read-gap interval rather than one per request. A pending one due later than this response's first
        # deadline is replaced; one due earlier finds this response when it fires and re-arms for it.
        conn = self._conn
        due = min(loop.time() + self._gap, self._deadline)
        timer = conn.timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            conn.timer = loop.call_at(due, conn.on_timer)

    def _on_timer(self) -> None:
        # Lazy: data_received only stamps conn.last_read; the timer re-arms until a gap or the deadline passes.
        loop = self._conn.loop
        now = loop.time()
        # While reading is paused (the client is slow to take the bytes) the gap is not the replica's:
        # only the request deadline applies; resume() restarts the gap clock.
        gap_due = now + self._gap if self._conn.paused else self._conn.last_read + self._gap
        due = min(gap_due, self._deadline)
        if now < due:
            self._conn.timer = loop.call_at(due, self._conn.on_timer)
            return
        what = "the request deadline" if now >= self._deadline else (
            f"{self._gap:.1f} s without data" if self._headers else f"no response within {self._gap:.1f} s")
        self._fail(UpstreamTimeout(what))
        self._conn.abort()

    # -- consumer side ----------------------------------------------------------------------------------------
    async def _wait(self) -> None:
        self._waiter = self._conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _wait_headers(self) -> None:
        while not self._headers and not self._done:
            w = self._waiter = self._conn.loop.create_future()  # _wait inlined: one coroutine less per request
            try:
                await w
            finally:
                self._waiter = None
        if not self._headers:
            raise self._error or UpstreamBroken("connection closed before the response headers")

    async def next_data(self) -> bytes:
        """Whatever body bytes have arrived (waiting for some), b"" at the end; raises UpstreamError."""
        while not self._buf:
            if self._done:
                if self._error is not None:
                    raise self._error
                return b""
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf.clear()
        if self._buffered > HIGH_WATER:
            self._conn.resume()
        self._buffered = 0
        return data

    async def read(self) -> bytes:
        if self._done and self._error is None:  # already whole (a short answer arrives with its headers)
            return self._take() if self._buf else b""
        parts = []
        while data := await self.next_data():
            parts.append(data)
        return b"".join(parts)

    @property
    def complete(self) -> bool:
        return self._done and self._error is None

    def close(self) -> None:
        """Back to the pool when complete and reusable, else the connection is closed (the replica aborts)."""
        self._conn.release(self)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: _ReplicaPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: UpstreamResponse | None = None
        self.timer: asyncio.TimerHandle | None = None  # the read deadlines of the response under way
        self.last_read = 0.0
        self.idle_since = 0.0
        self.closed = False
        self.paused = False
        self._header_name = b""
        self._until_close = True  # no Content-Length and not chunked: the body ends when the connection does
        self.keep_alive = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        resp = self.resp
        if resp is None:  # bytes on an idle connection: the server broke the protocol; do not reuse it
            self.abort()
            return
        resp.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            resp._fail(UpstreamBroken(f"invalid HTTP response: {e}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.pool.forget(self)
        resp = self.resp
        if resp is not None and not resp._done:
            if resp._headers and self._until_close:
                resp._finish()
            else:
                where = "mid-response" if resp._headers else "before the response headers"
                resp._fail(UpstreamBroken(f"connection closed {where}{f': {exc}' if exc else ''}"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._until_close = True
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"content-type" and self.resp is not None:
            self.resp.content_type = value.decode("latin-1")
        elif n == b"content-length" or (n == b"transfer-encoding" and b"chunked" in value.lower()):
            self._until_close = False

    def on_headers_complete(self) -> None:
        resp = self.resp
        if resp is not None:
            status = self.parser.get_status_code()
            if status < 200:  # 1xx interim response: the real one follows
                return
            resp.status = status
            resp._headers = True
            resp._wake()

    def on_body(self, body: bytes) -> None:
        if self.resp is not None:
            self.resp._feed(body)

    def on_message_complete(self) -> None:
        if self.resp is not None and self.resp._headers:
            self.keep_alive = self.parser.should_keep_alive()  # only valid inside the callback
            self.resp._finish()

    def on_timer(self) -> None:
        self.timer = None
        resp = self.resp
        if resp is not None and not resp._done and not self.closed:
            resp._on_timer()

    # used by UpstreamResponse
    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_read = self.loop.time()  # the read gap counts from here, not from before the pause
            self.transport.resume_reading()

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    def release(self, resp: UpstreamResponse) -> None:
        if self.resp is not resp:
            return
        self.resp = None
        if resp.complete and self.keep_alive and not self.closed and not self._until_close and not self.pool.closed:
            self.resume()
            self.idle_since = self.loop.time()
            self.pool.idle.append(self)
        else:
            self.abort()


class _ReplicaPool:
    def __init__(self, base_url: str, loop: asyncio.AbstractEventLoop, keepalive: float) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"replica URL must be http(s)://host[:port][/path], got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        self.prefix = u.path.rstrip("/")
        host_header = u.netloc.rsplit("@", 1)[-1]
        self.head = f"Host: {host_header}\r\n".encode("latin-1")
        self.heads: dict[str, bytes] = {}  # path -> request line + Host + "Content-Length: "
        self.loop = loop
        self.keepalive = keepalive
        self.idle: deque[_Connection] = deque()
        self.closed = False  # the replica is gone: connections finishing a request are not kept

    def forget(self, conn: _Connection) -> None:
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def take_idle(self) -> _Connection | None:
        now = self.loop.time()
        if self.idle and now - self.idle[0].idle_since > self.keepalive:
            self.idle.popleft().abort()  # expire the oldest, one per request: the deque stays bounded
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and now - conn.idle_since <= self.keepalive:
                return conn
            conn.abort()
        return None

    async def connect(self, timeout: float) -> _Connection:
        try:
            _, proto = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Connection(self), self.host, self.port, ssl=self.ssl),
                timeout)
        except TimeoutError:
            raise ConnectFailed(f"connect to {self.host}:{self.port} timed out after {timeout:.1f} s") from None
        except OSError as e:
            raise ConnectFailed(f"connect to {self.host}:{self.port} failed: {e}") from None
        return proto

    def close(self) -> None:
        self.closed = True
        while self.idle:
            self.idle.pop().abort()


class UpstreamClient:
    """POST (and GET) to replicas over pooled keep-alive connections (one pool per replica base URL)."""

    def __init__(self, connect_timeout: float, keepalive: float = 30.0) -> None:
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._pools: dict[str, _ReplicaPool] = {}

    def _pool(self, base_url: str) -> _ReplicaPool:
        pool = self._pools.get(base_url)
        if pool is None:
            pool = self._pools[base_url] = _ReplicaPool(base_url, asyncio.get_running_loop(), self.keepalive)
        return pool

    def post(self, base_url: str, path: str, body: bytes, headers: bytes, first_byte_timeout: float,
             total_timeout: float, after_send: Callable[[], None] | None = None,
             ) -> Coroutine[Any, Any, UpstreamResponse]:
        """Send and wait for the response headers (await it). `headers`: extra raw header lines, each ending in
        CRLF.

        The caller must `close()` the response. `first_byte_timeout` also bounds every later gap between reads.
        `after_send` runs once, right after the request is handed to the socket and before this coroutine first
        waits: bookkeeping placed there overlaps the replica's work instead of delaying the send.
        """
        pool = self._pool(base_url)
        head = pool.heads.get(path)
        if head is None:
            head = pool.heads[path] = b"POST %s HTTP/1.1\r\n%sContent-Length: " % ((pool.prefix + path).encode(), pool.head)
        req = b"%s%d\r\n%s\r\n%s" % (head, len(body), headers, body)
        # the sending coroutine itself, not one awaiting it: one coroutine less on every proxied request
        return self._send(pool, req, first_byte_timeout, total_timeout, after_send)

    async def get(self, base_url: str, path: str, headers: bytes, timeout: float,
                  max_bytes: int = MAX_GET_BYTES) -> tuple[int, bytes]:
        """GET `path` and read the whole answer within `timeout` seconds: (status, body). The health checks and
        /metrics scrapes: each replica's, every scrape interval, over the same keep-alive connections. A body past
        `max_bytes` raises UpstreamBroken (the connection is closed): a page that size is no replica's metrics."""
        pool = self._pool(base_url)
        req = b"GET %s HTTP/1.1\r\n%s%s\r\n" % ((pool.prefix + path).encode(), pool.head, headers)
        resp = await self._send(pool, req, timeout, timeout, None)
        try:
            parts, size = [], 0
            while data := await resp.next_data():
                size += len(data)
                if size > max_bytes:
                    raise UpstreamBroken(f"GET {path}: answer larger than {max_bytes} bytes")
                parts.append(data)
            return resp.status, b"".join(parts)
        finally:
            resp.close()

    async def _send(self, pool: _ReplicaPool, req: bytes, first_byte_timeout: float, total_timeout: float,
                    after_send: Callable[[], None] | None) -> UpstreamResponse:
        loop = pool.loop
        deadline = loop.time() + total_timeout
        while True:
            conn = pool.take_idle()
            reused = conn is not None
            if conn is None:
                conn = await pool.connect(min(self.connect_timeout, max(0.0, deadline - loop.time())))
            resp = UpstreamResponse(conn, first_byte_timeout, deadline)
            conn.resp = resp
            conn.last_read = loop.time()
            if conn.transport is None or conn.closed:
                raise UpstreamBroken("connection closed before the request was sent")
            conn.transport.write(req)
            resp._arm(loop)
            try:
                if after_send is not None:
                    after_send()
                    after_send = None
                await resp._wait_headers()
            except UpstreamBroken:
                resp.close()
                if reused and not resp.received_any:
                    continue  # the server closed the idle connection under us: nothing was processed
                raise
            except BaseException:
                resp.close()  # timeouts, cancellation: close the connection so the replica aborts
                raise
            return resp

    def forget(self, base_url: str) -> None:
        """The replica left the pool: close its idle connections (requests in flight finish normally)."""
        pool = self._pools.pop(base_url, None)
        if pool is not None:
            pool.close()

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


__all__ = ["ConnectFailed", "UpstreamBroken", "UpstreamClient", "UpstreamError", "UpstreamResponse",
           "UpstreamTimeout"]
