"""One client request as the proxy path sees it, and where its answer goes: either HTTP front end.

The router's own HTTP/1.1 server (`http_conn.py`) hands the proxy a `ClientRequest` and writes the answer
straight to the client's socket; `router.app` (aiohttp, for embedding the router in another aiohttp server)
does the same through `AiohttpResponder`. The proxy path (`server.py`, `proxy.py`, `store_response.py`) only
sees these two types, so both front ends run the same code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from llmfleet.router.requests import error_body


@dataclass(slots=True)
class ClientRequest:
    """A proxied request: its headers (names lower-case) and its complete body."""

    headers: Mapping[str, str]
    body: bytes
    too_large: bool = False  # the body is over limits.maxRequestBytes (not read: `body` is empty)


class Responder(Protocol):
    """Where a request's answer goes: `send` one whole response, or `start` a stream, `write`, `end`.
    `write` and `end` raise ConnectionResetError once the client is gone. `written_on_send`: `send` has handed
    the bytes to the socket when it returns (else they are written later, after the handler returns)."""

    written_on_send: bool

    def send(self, status: int, headers: Mapping[str, str], body: bytes) -> None: ...

    async def start(self, status: int, headers: Mapping[str, str]) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end(self, data: bytes = b"") -> None: ...


def send_json(out: Responder, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
    out.send(status, {**(headers or {}), "Content-Type": "application/json"}, json.dumps(obj).encode())


class AiohttpResponder:
    """A `Responder` for an aiohttp handler: the handler returns `response` once the proxy path is done."""

    written_on_send = False

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    def send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.response = web.Response(body=body, status=status, headers=headers)

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        self.response = web.StreamResponse(status=status, headers=headers)
        await self.response.prepare(self.request)

    async def write(self, data: bytes) -> None:
        if self.response is None:
            raise RuntimeError("write before start")
        await self.response.write(data)  # aiohttp's ClientConnectionResetError is a ConnectionResetError

    async def end(self, data: bytes = b"") -> None:
        if self.response is None:
            raise RuntimeError("end before start")
        await self.response.write_eof(data)


__all__ = ["AiohttpResponder", "ClientRequest", "Responder", "error_body", "send_json"]
