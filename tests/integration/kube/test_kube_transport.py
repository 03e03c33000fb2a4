"""The aiohttp transport under lightkube (`llmfleet.kube.transport`) against a local aiohttp server: compressed
answers arrive decoded, aiohttp's own headers are not doubled, and a dropped keep-alive connection is retried
for idempotent verbs only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from aiohttp import web

from llmfleet.kube.client import ApiError, KubeClient
from llmfleet.kube.transport import AiohttpTransport

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    async def pod(request: web.Request) -> web.StreamResponse:
        seen.append({"method": request.method, "headers": dict(request.headers), "body": await request.read()})
        resp = web.json_response({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
                                  "spec": {"containers": [{"name": "c", "image": "x" * 4000}]}})
        resp.enable_compression()  # gzip, as an API server answers large objects
        return resp

    async def flaky(request: web.Request) -> web.StreamResponse:
        seen.append({"method": request.method, "headers": dict(request.headers), "body": b""})
        if len(seen) == 1:
            assert request.transport is not None
            request.transport.close()  # the client sees a closed keep-alive connection
        return web.json_response({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "ml"}})

    async def garbled(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html>proxy error page</html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/api/v1/namespaces/ml/pods/p", pod)
    app.router.add_route("*", "/api/v1/namespaces/ml/pods/garbled", garbled)
    app.router.add_route("*", "/api/v1/namespaces/ml/pods/q", flaky)
    app.router.add_route("POST", "/api/v1/namespaces/ml/pods", flaky)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_compressed_answer_is_decoded_and_headers_are_not_doubled(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = server
    client = KubeClient.for_server(url, token="tok")
    try:
        pod = await client.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}})
    finally:
        await client.close()
    assert pod["spec"]["containers"][0]["image"] == "x" * 4000
    headers = seen[0]["headers"]
    assert headers["Authorization"] == "Bearer tok"
    assert headers["Content-Type"] == "application/apply-patch+yaml"
    assert "br" not in headers.get("Accept-Encoding", "") and "zstd" not in headers.get("Accept-Encoding", "")
    assert json.loads(seen[0]["body"])["metadata"]["name"] == "p"


async def test_an_apply_answer_that_is_no_json_is_an_api_error(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = server
    client = KubeClient.for_server(url)
    try:
        with pytest.raises(ApiError) as err:  # e.g. a proxy's error page with status 200
            await client.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "garbled", "namespace": "ml"}})
    finally:
        await client.close()
    assert err.value.status == 503 and "no JSON" in str(err.value)


async def test_dropped_connection_is_retried_for_get_only(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = server
    client = KubeClient.for_server(url)
    try:
        assert (await client.get("v1", "Pod", "ml", "q"))["metadata"]["name"] == "q"
        assert [s["method"] for s in seen] == ["GET", "GET"]
        seen.clear()
        with pytest.raises(ApiError) as err:  # a create is not repeated: it may have happened
            await client.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "ml"}})
        assert err.value.status == 503 and [s["method"] for s in seen] == ["POST"]
    finally:
        await client.close()


async def test_transport_errors_are_httpx2_errors() -> None:
    transport = AiohttpTransport(False, max_connections=2, timeout_seconds=2)
    try:
        with pytest.raises(httpx2.NetworkError):
            await transport.handle_async_request(httpx2.Request("GET", "http://127.0.0.1:9/api"))
    finally:
        await transport.aclose()
