"""DrainProxy against a fake streaming upstream: pass-through, 503 while draining, in-flight streams finish."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from llmfleet.workers.serve.drain import DrainProxy
from llmfleet.workers.serve.worker import split_listen


async def _upstream(chunks: int, delay: float) -> web.Application:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(chunks):
            await resp.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(delay)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0.0\n")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    return app


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.timeout(30)
async def test_drain_lets_stream_finish_and_refuses_new_requests() -> None:
    up_runner, up_url = await _serve(await _upstream(chunks=10, delay=0.1))
    proxy = DrainProxy(up_url)
    runner, url = await _serve(proxy.app())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                assert r.status == 503  # engine not confirmed ready yet
            proxy.engine_ready = True
            async with s.get(url + "/health") as r:
                assert r.status == 200
            async with s.get(url + "/metrics") as r:
                assert (await r.text()).startswith("vllm:num_requests_running")  # byte-for-byte pass-through

            async def consume() -> bytes:
                async with s.post(url + "/v1/completions", json={"stream": True}) as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/event-stream")
                    return await r.read()

            reader = asyncio.create_task(consume())
            for _ in range(100):
                if proxy.inflight == 1:
                    break
                await asyncio.sleep(0.01)
            assert proxy.inflight == 1
            drain = asyncio.create_task(proxy.drain(deadline_s=10))
            await asyncio.sleep(0.05)
            async with s.post(url + "/v1/completions", json={}) as r:
                assert r.status == 503
                assert (await r.json())["error"]["type"] == "draining"
            async with s.get(url + "/health") as r:
                assert r.status == 503
            async with s.get(url + "/metrics") as r:
                assert r.status == 200  # scrapes still work while draining
            body = await reader
            assert body.count(b"data: ") == 11 and body.endswith(b"data: [DONE]\n\n")
            assert await drain is True
    finally:
        await runner.cleanup()
        await up_runner.cleanup()


@pytest.mark.timeout(30)
async def test_drain_deadline() -> None:
    up_runner, up_url = await _serve(await _upstream(chunks=100, delay=0.1))
    proxy = DrainProxy(up_url)
    runner, url = await _serve(proxy.app())
    try:
        async with aiohttp.ClientSession() as s:
            async def consume() -> None:
                async with s.post(url + "/v1/completions", json={}) as r:
                    await r.read()

            reader = asyncio.create_task(consume())
            for _ in range(100):
                if proxy.inflight:
                    break
                await asyncio.sleep(0.01)
            assert await proxy.drain(deadline_s=0.3) is False
            assert proxy.inflight == 1
            reader.cancel()
    finally:
        await runner.cleanup()
        await up_runner.cleanup()


@pytest.mark.timeout(30)
async def test_engine_down_is_503_json() -> None:
    proxy = DrainProxy("http://127.0.0.1:9")  # discard port: nothing listens
    runner, url = await _serve(proxy.app())
    try:
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json={}) as r:
            assert r.status == 503
            assert (await r.json())["error"]["type"] == "engine_unavailable"
    finally:
        await runner.cleanup()


def test_split_listen() -> None:
    rest, host, port = split_listen(["--model", "/m", "--host", "1.2.3.4", "--port=9000", "--seed", "1"])
    assert rest == ["--model", "/m", "--seed", "1"] and host == "1.2.3.4" and port == 9000
    assert split_listen(["--model", "/m"])[1:] == ("0.0.0.0", 8000)
    with pytest.raises(ValueError, match="integer"):
        split_listen(["--port", "x"])
    with pytest.raises(ValueError, match="needs a value"):
        split_listen(["--port"])
