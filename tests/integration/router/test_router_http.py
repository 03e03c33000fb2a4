"""The router's own HTTP server end to end: proxied and other routes on one kept-alive connection, pipelined."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .conftest import config, wait_for


def request(method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
    status = int(head.split(" ", 2)[1])
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in head.split("\r\n")[1:] if line)}
    return status, headers, await reader.readexactly(int(headers["content-length"]))


async def test_proxied_and_other_routes_share_one_kept_alive_pipelined_connection(fakes: Any, routers: Any) -> None:
    a = await fakes(name="a")
    r = await routers(config({"primary": ("m", [a.url])}))
    await wait_for(lambda: bool(r.router.pools["primary"].replicas.routable()))
    host, port = r.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request("POST", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
                     + request("GET", "/health")
                     + request("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
                     + request("GET", "/v1/models")
                     + request("POST", "/v1/completions", {"model": "nope", "prompt": "hi"})
                     + request("GET", "/metrics"))
        answers = [await read_response(reader) for _ in range(6)]
        assert [s for s, _, _ in answers] == [200, 200, 200, 200, 404, 200]
        assert json.loads(answers[0][2])["object"] == "text_completion" and answers[0][1]["x-llmfleet-pool"] == "primary"
        assert json.loads(answers[1][2]) == {"status": "ok", "routable": {"primary": 1}}
        assert json.loads(answers[2][2])["object"] == "chat.completion"
        assert json.loads(answers[3][2])["data"][0]["id"] == "m"
        assert json.loads(answers[4][2])["error"]["code"] == "model_not_found"
        assert b"llmfleet_router_requests_total" in answers[5][2]
        # the same connection still serves, and a wrong method is a 405 there too
        writer.write(request("GET", "/v1/completions"))
        status, _, body = await read_response(reader)
        assert status == 405 and "not allowed" in json.loads(body)["error"]["message"]
    finally:
        writer.close()
    assert len(a.requests) == 2


async def test_a_client_gone_mid_request_closes_the_upstream_request(fakes: Any, routers: Any) -> None:
    a = await fakes(name="a", delay_s=5.0)
    r = await routers(config({"primary": ("m", [a.url])}))
    await wait_for(lambda: bool(r.router.pools["primary"].replicas.routable()))
    host, port = r.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request("POST", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2}))
    await wait_for(lambda: len(a.requests) == 1)
    writer.close()
    await wait_for(lambda: a.cancelled == 1)
    replica = r.router.pools["primary"].replicas.replicas[a.url]
    await wait_for(lambda: replica.in_flight == 0)
