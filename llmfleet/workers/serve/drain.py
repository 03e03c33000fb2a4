"""The replica's front door: a thin streaming proxy that owns graceful drain.

vLLM's own SIGTERM handling (`--shutdown-timeout N`, "drain" mode) stops the engine's output handler
before in-flight HTTP streams are flushed: measured on vLLM 0.32, a stream in flight at SIGTERM ends
with "EngineCore encountered an issue" and a new request gets a 500. So the wrapper listens on the
replica port and runs the engine on a private loopback port; on SIGTERM it

1. answers new requests (and /health, so Kubernetes readiness and the router drop the replica) with 503,
2. lets in-flight requests, streams included, finish for up to `drain_seconds`,
3. then stops the engine and exits 0.

Everything else is a byte-for-byte pass-through, Content-Encoding included (an engine may compress a
response: prometheus_client's ASGI exposition gzips /metrics for clients that accept it; vLLM 0.32's
/metrics route happens not to). `/metrics` carries vLLM's `vllm:` series unchanged; when the wrapper knows facts
vLLM does not export (`extra_metrics`, e.g. the KV-cache bytes per token the router needs to size a host
offload tier), /metrics is fetched uncompressed and those series are added before the end. An engine whose
metrics are served elsewhere (Ray Serve: Ray's metrics agent, under Ray's names) gives `metrics_url` and
`metrics_filter`, the page to fetch and what of it to serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

log = logging.getLogger("llmfleet.serve")

# Hop-by-hop headers (RFC 9110 7.6.1) plus the ones aiohttp recomputes for a streamed body.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "content-length", "host"}
# Requests: aiohttp's server hands us the body already decoded, so its Content-Encoding must not be forwarded.
# Responses: the client session does not decompress (auto_decompress=False), so the bytes are still encoded
# and the header must go with them (dropping it handed gzip bytes to clients told they were plain text).
_HOP_REQUEST = _HOP | {"content-encoding"}
_OPENMETRICS_EOF = b"# EOF\n"
_TEXT_FORMAT = "text/plain; version=0.0.4"  # Prometheus' text exposition format
# Paths that stay open during drain: probes and scrapes must see the replica until it exits.
_ALWAYS_OPEN = {"/metrics", "/ping", "/version"}


def _err(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class DrainProxy:
    """Forward every request to `upstream`; track in-flight ones; refuse new ones once draining."""

    def __init__(self, upstream: str, health_path: str = "/health", extra_metrics: bytes = b"",
                 metrics_url: str | None = None, metrics_filter: Callable[[bytes], bytes] | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.health_path = health_path  # the engine's own health/readiness path, served as /health
        self.extra_metrics = extra_metrics  # exposition-format lines (HELP/TYPE + samples) added to /metrics
        self.metrics_url = metrics_url  # where the engine's metrics page is, when not at upstream's /metrics
        self.metrics_filter = metrics_filter  # that page -> the series /metrics serves of it
        self.inflight = 0
        self.draining = False
        self.engine_ready = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: ClientSession | None = None

    async def start(self, _app: web.Application | None = None) -> None:
        # No total timeout: a long generation is legitimate; the router bounds request time.
        self._session = ClientSession(
            timeout=ClientTimeout(total=None, connect=10, sock_connect=10),
            connector=TCPConnector(limit=0), auto_decompress=False,
        )

    async def close(self, _app: web.Application | None = None) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.close)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/health":
            if self.draining:
                return _err(503, "replica is draining", "draining")
            if not self.engine_ready:
                return _err(503, "engine is starting", "starting")
        elif path not in _ALWAYS_OPEN and self.draining:
            return _err(503, "replica is draining; retry on another replica", "draining")
        tracked = path not in _ALWAYS_OPEN and path != "/health"
        if tracked:
            self.inflight += 1
            self._idle.clear()
        try:
            return await self._forward(request)
        finally:
            if tracked:
                self.inflight -= 1
                if self.inflight == 0:
                    self._idle.set()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self._session is None:
            raise RuntimeError("DrainProxy.start() was not awaited")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_REQUEST}
        body = await request.read()
        if request.path == "/metrics" and (self.extra_metrics or self.metrics_url or self.metrics_filter):
            return await self._metrics(request, headers)
        url = self.upstream + (self.health_path if request.path == "/health" else str(request.rel_url))
        try:
            upstream = await self._session.request(request.method, url, headers=headers, data=body or None)
        except (ClientError, OSError) as err:
            return _err(503, f"engine unavailable: {err}", "engine_unavailable")
        async with upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP:
                    out.headers.add(k, v)
            await out.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
            except (TimeoutError, ClientError) as err:
                log.warning("upstream stream broke on %s: %s", request.path, err)
            await out.write_eof()
            return out

    async def _metrics(self, request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
        """The engine's metrics page, uncompressed, through `metrics_filter`, with `extra_metrics` added (before
        OpenMetrics' closing `# EOF`)."""
        session = self._session
        if session is None:
            raise RuntimeError("DrainProxy.start() was not awaited")
        # identity, or we could not edit it (aiohttp would otherwise add its default gzip, deflate)
        headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"} | {"Accept-Encoding": "identity"}
        if self.metrics_filter is not None:  # the text format, whose lines the filter knows (no OpenMetrics # EOF)
            headers = {k: v for k, v in headers.items() if k.lower() != "accept"} | {"Accept": _TEXT_FORMAT}
        try:
            async with session.get(self.metrics_url or self.upstream + str(request.rel_url), headers=headers,
                                   timeout=ClientTimeout(total=10)) as upstream:
                data = await upstream.read()
                out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
                # from the case-insensitive headers, not the plain dict copy below it
                encoding = upstream.headers.get("Content-Encoding", "identity")
                status, reason = upstream.status, upstream.reason
        except (ClientError, OSError, TimeoutError) as err:
            return _err(503, f"engine unavailable: {err}", "engine_unavailable")
        if status == 200 and encoding == "identity":
            if self.metrics_filter is not None:
                data = self.metrics_filter(data)
            if data.endswith(_OPENMETRICS_EOF):
                data = data[: -len(_OPENMETRICS_EOF)] + self.extra_metrics + _OPENMETRICS_EOF
            else:
                data = data + (b"" if not data or data.endswith(b"\n") else b"\n") + self.extra_metrics
        return web.Response(body=data, status=status, reason=reason, headers=out_headers)

    async def drain(self, deadline_s: float) -> bool:
        """Refuse new work and wait for in-flight requests; True when all finished before the deadline."""
        self.draining = True
        start = time.monotonic()
        log.info("draining: %d request(s) in flight, deadline %.0fs", self.inflight, deadline_s)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=deadline_s)
        done = self.inflight == 0
        log.info("drain %s after %.1fs (%d left)", "complete" if done else "deadline hit", time.monotonic() - start,
                 self.inflight)
        return done
