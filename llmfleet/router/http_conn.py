"""One client connection of the router's HTTP/1.1 server: parsed once, answered straight to the socket.

The router served through aiohttp's server before: on the proxied endpoints its request and response objects,
URL dispatcher and stream writer were about a third of the router's CPU per request, and since aiohttp has no
deadline for reading a request's headers or body, the router framed every request a second time to enforce
them. `ClientConnection` parses each request once (llhttp via httptools) and hands it to `handler` (the
server's dispatch, `http_server.py`) as an `Exchange`, which is also the request's `Responder`: the answer's
bytes go to the transport as they come, no response object in between.

* Keep-alive and pipelining: requests on one connection are answered in order, one at a time; while more than
  `MAX_QUEUED` wait, the connection stops reading. HTTP/1.0 and `Connection: close` are honoured.
* Deadlines: a request's headers must be complete within `limits.headerTimeoutSeconds` of the connection
  opening (first request) or of the request's first byte (later requests), its body within
  `limits.bodyTimeoutSeconds` of the headers, else the connection is aborted (a client that does not read
  cannot hold it either) and counted through `on_timeout(phase)`; a connection with nothing to do for
  `limits.idleTimeoutSeconds` is closed. One lazy timer per connection: a request that arrives whole costs no
  timer, a busy keep-alive connection about one per idle timeout.
* A body over `limits.maxRequestBytes` is not read: the request goes to its handler marked `too_large` (the
  proxy answers 413 after the API key check) and the connection closes after the answer.
* `Expect: 100-continue` gets `100 Continue` when nothing else is being written on the connection.
* Back-pressure: a streamed answer waits while the transport's write buffer is above its high-water mark.
* The client gone: the running handler is cancelled (the proxy then closes its upstream connection, so vLLM
  aborts the request).
* Malformed HTTP: 400 and close; a request line and headers still incomplete after `MAX_HEAD_BYTES`: 431
  and close.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus

import httptools

from llmfleet.router.config import LimitsConfig
from llmfleet.router.respond import error_body

log = logging.getLogger("llmfleet.router")

MAX_QUEUED = 8  # pipelined requests waiting for their turn before the connection stops reading
MAX_HEAD_BYTES = 64 * 1024  # request line and headers; more still incomplete: 431 and close
_IDLE, _HEAD, _BODY = 0, 1, 2
_PHASE_NAMES = {_HEAD: "header", _BODY: "body"}
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))
    return line


class _Date:
    """The Date header, formatted once a second."""

    second = 0
    value = b""

    @classmethod
    def header(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second, cls.value = now, b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return cls.value


class Exchange:
    """One request (method, path, query, lower-case headers, body) and the `Responder` for its answer."""

    __slots__ = ("body", "conn", "head_only", "headers", "keep_alive", "method", "path", "query", "started",
                 "too_large", "version_10")
    written_on_send = True

    def __init__(self, conn: ClientConnection, method: str, url: bytes, headers: dict[str, str], body: bytes,
                 keep_alive: bool, version_10: bool, too_large: bool) -> None:
        self.conn = conn
        self.method = method
        path, _, query = url.partition(b"?")
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive and not too_large
        self.version_10 = version_10
        self.too_large = too_large
        self.head_only = method == "HEAD"
        self.started = 0  # 0: nothing sent; 1: whole response or stream head sent; 2: stream ended

    @property
    def remote(self) -> str | None:
        peer = self.conn.transport.get_extra_info("peername") if self.conn.transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else None

    def _head(self, status: int, headers: Mapping[str, str], framing: bytes) -> bytes:
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        parts = [_status_line(status), _Date.header(), lines.encode("latin-1", "replace"), framing]
        if not self.keep_alive:
            parts.append(b"Connection: close\r\n")
        elif self.version_10:
            parts.append(b"Connection: keep-alive\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    # Responder
    def send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        if self.started:
            raise RuntimeError("a response was already sent")
        self.started = 2
        t = self.conn.transport
        if self.conn.closed or t is None or t.is_closing():
            return  # the client is gone: nobody to answer
        head = self._head(status, headers, b"Content-Length: %d\r\n" % len(body))
        self.conn.write(head if self.head_only else head + body)

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        if self.started:
            raise RuntimeError("a response was already sent")
        self.started = 1
        if self.version_10:  # no chunked coding: the body ends with the connection
            self.keep_alive = False
            self.conn.write(self._head(status, headers, b""))
        else:
            self.conn.write(self._head(status, headers, b"Transfer-Encoding: chunked\r\n"))
        await self.conn.drain()

    async def write(self, data: bytes) -> None:
        if self.started != 1:
            raise RuntimeError("write outside a started stream")
        if data and not self.head_only:
            self.conn.write(data if self.version_10 else b"%x\r\n%s\r\n" % (len(data), data))
        await self.conn.drain()

    async def end(self, data: bytes = b"") -> None:
        if self.started != 1:
            raise RuntimeError("end outside a started stream")
        self.started = 2
        if self.head_only:
            return
        if self.version_10:
            if data:
                self.conn.write(data)
        elif data:
            self.conn.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        else:
            self.conn.write(b"0\r\n\r\n")


Handler = Callable[[Exchange], Awaitable[None]]


class ClientConnection(asyncio.Protocol):
    """One client connection (see the module docstring). `handler(exchange)` answers one request."""

    def __init__(self, handler: Handler, limits: LimitsConfig, loop: asyncio.AbstractEventLoop,
                 on_timeout: Callable[[str], None], on_close: Callable[[ClientConnection], None] | None = None
                 ) -> None:
        self.handler = handler
        self.loop = loop
        self.limits = (limits.idle_timeout_seconds, limits.header_timeout_seconds, limits.body_timeout_seconds)
        self.max_body = limits.max_request_bytes
        self.on_timeout = on_timeout
        self.on_close = on_close
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.phase = _HEAD  # a new connection owes its first request's headers from now
        self.since = loop.time()
        self.stamp = False  # a phase started during the current read: `since` is set after it
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.reading = True
        self.queue: deque[Exchange] = deque()
        self.task: asyncio.Task[None] | None = None  # the handler running now
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        # the request being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._head_bytes = 0  # read since the current request's headers began (at most: see data_received)

    # -- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm()

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:
            return
        if self.phase != _BODY:  # (an upper bound: the read may also hold bodies and whole requests)
            self._head_bytes += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # bytes after an Upgrade/CONNECT are not HTTP: answer what is whole
            self._stop_reading()
        except httptools.HttpParserError as e:
            self._bad_request(f"malformed HTTP request ({e})")
            return
        if self.phase != _IDLE:  # a request still incomplete after this read: its deadline runs
            if self.phase == _HEAD and self._head_bytes > MAX_HEAD_BYTES:
                self._bad_request("request headers too large", 431)
                return
            if self.stamp:
                self.stamp = False
                self._restart_clock()
            elif self.timer is None:
                self._arm()

    def eof_received(self) -> bool | None:
        # The client closed its side: taken as gone (as aiohttp's server did), the transport closes and
        # connection_lost cancels the request being answered.
        self._stop_reading()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_reading()
        self.queue.clear()
        if self.task is not None:
            self.task.cancel()  # the client is gone: the proxy closes the upstream connection
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("client connection closed"))
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- llhttp callbacks -------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.phase == _IDLE:
            self.phase, self.stamp = _HEAD, True
        self._url, self._headers, self._body, self._size, self._too_large = b"", {}, [], 0, False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.phase, self.stamp, self._head_bytes = _BODY, True, 0
        if self.parser is None:  # reading stopped earlier in this read (a body too large): ignore the rest
            return
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            self._too_large_request()
        elif self._headers.get("expect", "").lower() == "100-continue" and self.task is None and not self.queue:
            self.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._size += len(body)
        if self._size > self.max_body:  # chunked coding past the limit
            self._too_large_request()
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self.phase, self._head_bytes = _IDLE, 0
        if not self._too_large and self.parser is not None:
            self._queue_request(keep_alive=self.parser is not None and self.parser.should_keep_alive())

    # -- requests in order -------------------------------------------------------------------------------------
    def _queue_request(self, keep_alive: bool) -> None:
        parser = self.parser
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = parser.get_method().decode("latin-1") if parser is not None else "GET"
        version_10 = parser is not None and parser.get_http_version() == "1.0"
        ex = Exchange(self, method, self._url, self._headers, body, keep_alive, version_10, self._too_large)
        self.queue.append(ex)
        if self.task is None:
            self._next()
        elif len(self.queue) > MAX_QUEUED and self.reading and self.transport is not None:
            self.reading = False
            self.transport.pause_reading()

    def _too_large_request(self) -> None:
        """Answer without reading the body; nothing after it on this connection is read."""
        self._too_large = True
        self._queue_request(keep_alive=False)
        self._stop_reading()

    def _next(self) -> None:
        ex = self.queue.popleft()
        if not self.reading and self.parser is not None and len(self.queue) <= MAX_QUEUED // 2 and \
                self.transport is not None:
            self.reading = True
            self.transport.resume_reading()
        self.task = self.loop.create_task(self._run(ex))

    async def _run(self, ex: Exchange) -> None:
        try:
            await self.handler(ex)
        except asyncio.CancelledError:
            self.task = None
            return  # the client is gone (or the server stops): nothing to answer
        except Exception:  # a bug in a handler must not take the connection's other requests down silently  # noqa: BLE001
            log.exception("request %s %s failed", ex.method, ex.path)
            if not ex.started:
                ex.keep_alive = False
                ex.send(500, {"Content-Type": "application/json"},
                        json.dumps(error_body("internal error", "server_error")).encode())
            ex.keep_alive = False
        self.task = None
        if ex.started != 2:  # a stream cut short (or no answer): the client cannot tell where it ends
            ex.keep_alive = False
        if not ex.keep_alive or self.closed:
            self._close()
        elif self.queue:
            self._next()
        elif self.parser is None:  # nothing more will be read (Upgrade, a body too large, malformed bytes)
            self._close()
        elif self.phase == _IDLE:  # nothing to do until the next request: the idle deadline runs
            self._restart_clock()

    # -- writing -----------------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("client connection closed")
        self.transport.write(data)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("client connection closed")
        if self._paused:
            self._drain = self.loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    # -- deadlines and closing ---------------------------------------------------------------------------------
    def _restart_clock(self) -> None:
        """The current phase starts now: a timer armed for a later deadline is replaced, an earlier one re-arms
        itself when it fires."""
        self.since = self.loop.time()
        timer = self.timer
        if timer is not None and timer.when() > self.since + self.limits[self.phase]:
            timer.cancel()
            self.timer = None
        if self.timer is None:
            self._arm()

    def _arm(self) -> None:
        self.timer = self.loop.call_at(self.since + self.limits[self.phase], self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.closed or (self.phase == _IDLE and (self.task is not None or self.queue)):
            return  # a request is being answered: no deadline (its next one re-arms when it goes idle)
        if self.loop.time() < self.since + self.limits[self.phase]:  # a later phase or request: its own deadline
            self._arm()
            return
        if self.phase == _IDLE:
            self._close()  # idle keep-alive connection
            return
        phase = _PHASE_NAMES[self.phase]
        log.debug("closing a client connection: request %s not complete in %.1f s", phase, self.limits[self.phase])
        self.on_timeout(phase)
        self._stop_reading()
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None:
            self.transport.abort()

    def _stop_reading(self) -> None:
        self.parser = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _bad_request(self, reason: str, status: int = 400) -> None:
        """`status` (400: malformed) and close; while earlier requests are still being answered, close after
        them (no answer to this one)."""
        log.debug("bad request: %s", reason)
        self._stop_reading()
        if self.task is None and not self.queue and not self.closed:
            body = json.dumps(error_body(reason)).encode()
            Exchange(self, "GET", b"/", {}, b"", False, False, False).send(status, {"Content-Type": "application/json"},
                                                                            body)
            self._close()

    def _close(self) -> None:
        self._stop_reading()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # after what is buffered

    def shutdown(self) -> None:
        """The server stops: close now if idle, else after the request being answered."""
        self._stop_reading()
        if self.task is None and not self.queue:
            self._close()
        else:
            for ex in self.queue:
                ex.keep_alive = False


__all__ = ["ClientConnection", "Exchange", "Handler"]
