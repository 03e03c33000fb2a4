"""The router's listening side: its own HTTP/1.1 server (`http_conn.ClientConnection`) and the serve loop.

POST /v1/chat/completions and /v1/completions go straight to `Router.serve` with the parsed request, and the
answer is written to the socket (`http_conn.Exchange`); the other routes (metrics, health, models, admin,
debug, 404/405) are the router's aiohttp handlers, called with a small stand-in for aiohttp's request and
their `web.Response` written out. Connection deadlines, keep-alive and pipelining: see `http_conn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable
from typing import Any, cast

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy
from yarl import URL

from llmfleet.router.config import RouterConfig
from llmfleet.router.http_conn import ClientConnection, Exchange
from llmfleet.router.respond import ClientRequest, error_body, send_json
from llmfleet.router.server import PROXIED, Router

log = logging.getLogger("llmfleet.router")


class PlainRequest:
    """What the router's small aiohttp handlers read of a request, built from an `Exchange`."""

    def __init__(self, ex: Exchange) -> None:
        self.method, self.path, self.remote = ex.method, ex.path, ex.remote
        self.headers = CIMultiDictProxy(CIMultiDict(ex.headers))
        self.query = URL("/?" + ex.query).query if ex.query else MultiDictProxy(MultiDict[str]())
        self.content_length = len(ex.body)
        self._body = ex.body

    async def read(self) -> bytes:
        return self._body


class RouterServer:
    """Listens on host:port and answers every connection with a `ClientConnection`."""

    def __init__(self, router: Router, shutdown_timeout: float = 60.0) -> None:
        self.router = router
        self.shutdown_timeout = shutdown_timeout
        self.connections: set[ClientConnection] = set()
        self.server: asyncio.Server | None = None
        self._routes = router.small_routes()
        m = router.metrics
        self._on_timeout = lambda phase: m.child(m.server_timeouts, phase).inc()

    @property
    def port(self) -> int:
        sockets = self.server.sockets if self.server is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else 0

    async def start(self, host: str, port: int, backlog: int = 1024) -> None:
        await self.router.start()
        loop = asyncio.get_running_loop()
        limits = self.router.cfg.limits

        def connection() -> ClientConnection:
            conn = ClientConnection(self.handle, limits, loop, self._on_timeout, self.connections.discard)
            self.connections.add(conn)
            return conn

        self.server = await loop.create_server(connection, host, port, backlog=backlog)

    def handle(self, ex: Exchange) -> Awaitable[None]:
        """The coroutine that answers `ex` (the proxy's own, not wrapped: one coroutine level less per request)."""
        endpoint = PROXIED.get(ex.path)
        if endpoint is not None and ex.method == "POST":
            return self.router.serve(ClientRequest(ex.headers, ex.body, ex.too_large), endpoint, ex)
        return self._small_route(ex)

    async def _small_route(self, ex: Exchange) -> None:
        method, handler = self._routes.get(ex.path, ("", self.router.not_found))
        if method != ex.method and not (method == "GET" and ex.method == "HEAD"):
            handler = self.router.not_found
        if ex.too_large:
            ex.keep_alive = False
            send_json(ex, 413, error_body("request body too large"))
            return
        resp = await handler(cast(web.Request, PlainRequest(ex)))
        body = resp.body if isinstance(resp, web.Response) else None
        if not isinstance(body, bytes):
            raise TypeError(f"handler for {ex.path} returned no bytes body")
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
        if resp.content_type and "Content-Type" not in headers:
            headers["Content-Type"] = resp.content_type
        ex.send(resp.status, headers, body)

    async def cleanup(self, timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (at most `timeout` s, default `shutdown_timeout`), then
        close the router."""
        timeout = self.shutdown_timeout if timeout is None else timeout
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.shutdown()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for t in pending:
                t.cancel()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        await self.router.close()


async def start_http(router: Router, host: str, port: int, shutdown_timeout: float | None = None) -> RouterServer:
    """Serve `router` on host:port (port 0: any free one, see `.port`); stop with `cleanup()`."""
    server = RouterServer(router, 60.0 if shutdown_timeout is None else shutdown_timeout)
    await server.start(host, port)
    return server


async def run_router(cfg: RouterConfig, lookup: Any | None = None, ready: asyncio.Event | None = None,
                     config_path: str | None = None) -> None:
    """Serve until cancelled or SIGTERM/SIGINT; then stop accepting and let in-flight requests finish.
    `config_path`: the file `cfg` came from, re-read for adapter changes."""
    router = Router(cfg, lookup, config_path)
    server = await start_http(router, cfg.host, cfg.port, shutdown_timeout=cfg.limits.request_timeout_seconds)
    # Everything built so far (modules, config, routes) lives as long as the process: move it out of the garbage
    # collector's view, so an occasional full collection does not walk it (30-40 ms measured here, a p99 spike).
    gc.collect()
    gc.freeze()
    log.info("llmfleet router for %s listening on %s:%s", cfg.service, cfg.host, server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        log.info("stopping: draining in-flight requests")
    finally:
        await server.cleanup()


__all__ = ["PlainRequest", "RouterServer", "run_router", "start_http"]
