"""An aiohttp transport under lightkube's httpx2 client.

lightkube builds requests, authenticates them (token, token file, exec plugin, client certificate) and decodes
answers; this transport only moves bytes. With httpx2's own connection pool a server-side apply cost about
1.3 ms of client CPU against the API emulator, with this transport (and the client's prepared apply requests)
about 0.4 ms (docs/architecture.md), and the operator sends thousands of requests when many objects change at
once.
"""

from __future__ import annotations

import ssl

import aiohttp
import httpx2
import yarl

# Safe to resend on a fresh connection when a pooled keep-alive connection turns out closed by the server.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "PATCH", "DELETE"})
# Request headers aiohttp sets itself: the encodings it can decode (httpx2 would offer more), the connection's.
OWN_HEADERS = frozenset({b"host", b"accept-encoding", b"connection", b"content-length", b"transfer-encoding"})


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """One aiohttp session, at most `max_connections` connections, `timeout_seconds` per request."""

    def __init__(self, ssl_context: ssl.SSLContext | bool, *, max_connections: int, timeout_seconds: float) -> None:
        self._ssl = ssl_context
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self._max_connections),
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = request.content or None
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw
                   if k.lower() not in OWN_HEADERS]
        url = yarl.URL(str(request.url), encoded=True)  # httpx2 already encoded it
        retried = False
        while True:
            try:
                async with self._client().request(request.method, url, headers=headers, data=body) as resp:
                    content = await resp.read()  # decompressed already: pass on no Content-Encoding
                    content_type = resp.headers.get("Content-Type")
                    return httpx2.Response(resp.status, headers={"Content-Type": content_type} if content_type else None,
                                           content=content, request=request)
            except aiohttp.ServerDisconnectedError as err:
                if retried or request.method not in IDEMPOTENT:
                    raise httpx2.RemoteProtocolError(f"{request.method} {request.url}: {err!r}",
                                                     request=request) from err
                retried = True
            except TimeoutError as err:
                raise httpx2.TimeoutException(f"{request.method} {request.url}: timed out", request=request) from err
            except aiohttp.ClientError as err:
                raise httpx2.NetworkError(f"{request.method} {request.url}: {err!r}", request=request) from err

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
