"""A fast fake OpenAI server (vLLM-shaped /health and /metrics) for tests and the overhead benchmark.

    python -m llmfleet.router.fake_backend --port 0 [--tokens 8] [--delay-ms 0]

prints `PORT <n>` on stdout once listening. In tests, `FakeBackend` runs in the current event loop and its
behaviour (delay, failure mode, metrics values, health) can be changed between requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeBackend:
    name: str = "fake"
    tokens: int = 4
    delay_s: float = 0.0  # before response headers
    token_delay_s: float = 0.0  # between streamed tokens
    fail: str | None = None  # None | "500" | "close" | "hang"
    healthy: bool = True
    metrics: dict[str, float] = field(default_factory=dict)  # vllm:name -> value; empty -> no vllm series
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    record: bool = True
    port: int = 0
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        if server is None:
            raise RuntimeError("fake backend did not start")
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        lines = []
        for name, value in self.metrics.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            base = name.removesuffix("_total")
            lines += [f"# TYPE {base} {kind}", f'{name}{{model_name="{self.name}"}} {value}']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def _serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        body = await request.json()
        if self.record:
            self.requests.append(body)
        try:
            if self.fail == "hang":
                await asyncio.sleep(3600)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.fail == "500":
                return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
            if self.fail == "close":
                if request.transport is not None:
                    request.transport.close()
                return web.Response(status=500)
            model = body.get("model", "m")
            n = int(body.get("max_tokens") or self.tokens)
            created = int(time.time())
            if not body.get("stream"):
                if endpoint == "chat":
                    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": f"{self.name} " * n},
                                              "finish_reason": "length"}
                else:
                    choice = {"index": 0, "text": f"{self.name} " * n, "finish_reason": "length"}
                return web.json_response({
                    "id": "cmpl-fake", "object": "chat.completion" if endpoint == "chat" else "text_completion",
                    "created": created, "model": model, "choices": [choice],
                    "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
                })
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
            for i in range(n):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                delta = {"delta": {"content": f"{self.name}{i} "}} if endpoint == "chat" else {"text": f"{self.name}{i} "}
                chunk = {"id": "cmpl-fake", "object": obj, "created": created, "model": model,
                         "choices": [{"index": 0, **delta, "finish_reason": None}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def _main(args: argparse.Namespace) -> None:
    fb = FakeBackend(name=args.name, tokens=args.tokens, delay_s=args.delay_ms / 1000, record=False,
                     token_delay_s=args.token_delay_ms / 1000,
                     metrics={"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
                              "vllm:kv_cache_usage_perc": 0.1})
    await fb.start(args.host, args.port)
    print(f"PORT {fb.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--name", default="fake")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.run(_main(args))
    except ImportError:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
