"""DrainProxy against a fake streaming upstream: pass-through, 503 while draining, in-flight streams finish."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmfleet.workers.serve.drain import DrainProxy
from llmfleet.workers.serve.worker import split_listen
from tests.local_http import serve_app


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


@pytest.mark.timeout(30)
async def test_drain_lets_stream_finish_and_refuses_new_requests() -> None:
    up_runner, up_url = await serve_app(await _upstream(chunks=10, delay=0.1))
    proxy = DrainProxy(up_url)
    runner, url = await serve_app(proxy.app())
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
    up_runner, up_url = await serve_app(await _upstream(chunks=100, delay=0.1))
    proxy = DrainProxy(up_url)
    runner, url = await serve_app(proxy.app())
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
    runner, url = await serve_app(proxy.app())
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


async def _prometheus_upstream() -> web.Application:
    """/metrics the way vLLM serves it: prometheus_client's exposition, gzip when the client accepts it,
    OpenMetrics (ending in `# EOF`) when the client asks for it."""
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.exposition import _bake_output

    reg = CollectorRegistry()
    Gauge("vllm:num_requests_running", "Running requests.", registry=reg).set(3)

    async def metrics(request: web.Request) -> web.Response:
        status, headers, output = _bake_output(reg, request.headers.get("Accept", ""),
                                               request.headers.get("Accept-Encoding"), {}, False)
        return web.Response(body=output, status=int(status.split()[0]), headers=dict(headers))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


EXTRA = b"# TYPE llmfleet:kv_cache_bytes_per_token gauge\nllmfleet:kv_cache_bytes_per_token 131072\n"


@pytest.mark.timeout(30)
async def test_gzip_metrics_keep_their_content_encoding() -> None:
    # The proxy passes compressed bytes through (auto_decompress=False): it used to drop Content-Encoding, so
    # every scraper that accepts gzip (the router, Prometheus) got undecodable bytes.
    up_runner, up_url = await serve_app(await _prometheus_upstream())
    runner, url = await serve_app(DrainProxy(up_url).app())
    try:
        async with aiohttp.ClientSession() as s:  # sends Accept-Encoding: gzip, deflate
            async with s.get(url + "/metrics") as r:
                assert r.headers.get("Content-Encoding") == "gzip"
                assert "vllm:num_requests_running 3.0" in await r.text()
    finally:
        await runner.cleanup()
        await up_runner.cleanup()


@pytest.mark.timeout(30)
async def test_extra_metrics_are_added_to_text_and_openmetrics() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    up_runner, up_url = await serve_app(await _prometheus_upstream())
    runner, url = await serve_app(DrainProxy(up_url, extra_metrics=EXTRA).app())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/metrics") as r:  # gzip accepted, but the wrapper edits: identity
                assert "Content-Encoding" not in r.headers
                text = await r.text()
            samples = {smp.name: smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples}
            assert samples["vllm:num_requests_running"] == 3.0
            assert samples["llmfleet:kv_cache_bytes_per_token"] == 131072
            async with s.get(url + "/metrics", headers={"Accept": "application/openmetrics-text"}) as r:
                om = await r.read()
            assert om.endswith(EXTRA + b"# EOF\n")  # OpenMetrics must still end with # EOF
            assert b"num_requests_running 3.0" in om  # (this prometheus_client escapes the colon there)
    finally:
        await runner.cleanup()
        await up_runner.cleanup()


def test_kv_cache_metrics_from_the_served_models_config(tmp_path: Path) -> None:
    from llmfleet.workers.serve.worker import served_model_metrics

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 32, "num_attention_heads": 32,
                                                      "num_key_value_heads": 8, "hidden_size": 4096}))
    argv = ["--model", str(tmp_path), "--dtype", "bfloat16", "--kv-cache-dtype", "auto", "--tensor-parallel-size", "1"]
    assert b"\nllmfleet:kv_cache_bytes_per_token 131072.0\n" in served_model_metrics(argv)
    fp8 = [a if a != "auto" else "fp8" for a in argv]
    assert b"\nllmfleet:kv_cache_bytes_per_token 65536.0\n" in served_model_metrics(fp8)
    assert served_model_metrics(["--model", str(tmp_path / "missing")]) == b""  # unknown: nothing is added
    assert served_model_metrics(["--model", "hf://org/model"]) == b""


@pytest.mark.timeout(30)
async def test_metrics_left_compressed_by_the_engine_are_passed_through_unedited() -> None:
    # An engine that ignores `Accept-Encoding: identity` (headers in lower case, as uvicorn sends them): the
    # wrapper must notice the encoding and leave the body alone, not append plain text to gzip bytes.
    import gzip

    body = gzip.compress(b"vllm:num_requests_running 1.0\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-encoding: gzip\r\n"
                     b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    runner, url = await serve_app(DrainProxy(f"http://127.0.0.1:{port}", extra_metrics=EXTRA).app())
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            assert r.headers.get("Content-Encoding") == "gzip"
            assert await r.text() == "vllm:num_requests_running 1.0\n"
    finally:
        await runner.cleanup()
        server.close()
