"""A fast fake OpenAI server (vLLM-shaped /health and /metrics) for tests and the overhead benchmark.

    python -m llmfleet.testing.fake_backend --port 0 [--tokens 8] [--delay-ms 0] [--lean]

prints `PORT <n>` on stdout once listening. In tests, `FakeBackend` runs in the current event loop and its
behaviour (delay, failure mode, metrics values, health, the answer) can be changed between requests;
`fake_openai.FakeOpenAI` runs one in a background thread for synchronous code.

`--lean` serves the same responses from a bare asyncio Protocol (httptools parser, responses rendered once
per (endpoint, model, tokens, stream) and cached): a fraction of aiohttp's CPU per request, so that in the
overhead benchmark the core shared by the backends and the load generator is not what limits the rate.
Every streamed event is still its own write, as an engine emits tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_TOKENS = 32768  # the fake "context length": larger max_tokens get 400, as from vLLM


@dataclass
class FakeBackend:
    name: str = "fake"
    tokens: int = 4
    delay_s: float = 0.0  # before response headers
    token_delay_s: float = 0.0  # between streamed tokens
    fail: str | None = None  # None | "500" | "close" | "hang" | "cut" (stream half the tokens, then drop)
    fail_status: int | None = None  # answer every completion request with this status and an "injected" error
    # The text of a non-streaming answer from the request body (finish_reason "stop"); None: `tokens` x name.
    answer: Callable[[dict[str, Any]], str] | None = None
    healthy: bool = True
    metrics: dict[str, float] = field(default_factory=dict)  # vllm:name -> value; empty -> no vllm series
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    record: bool = True
    api_key: str | None = None  # like vLLM's --api-key: /v1 requests without `Bearer <key>` get 401
    guard_metrics: bool = False  # /metrics needs the key too (an authenticating proxy in front of the engine)
    # LoRA (vLLM's runtime adapter endpoints): loaded adapter name -> path, every load call, the load time, and
    # paths whose load fails (404, as vLLM answers for a missing adapter folder)
    adapters: dict[str, str] = field(default_factory=dict)
    load_calls: list[str] = field(default_factory=list)
    load_delay_s: float = 0.0
    bad_paths: set[str] = field(default_factory=set)
    port: int = 0
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._require_key])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/load_lora_adapter", self._load_adapter)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_adapter)
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

    @web.middleware
    async def _require_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """vLLM's --api-key: every /v1 path needs `Bearer <key>`; /health and /metrics stay open (/metrics unless
        `guard_metrics`)."""
        guarded = request.path.startswith("/v1") or (self.guard_metrics and request.path == "/metrics")
        if (self.api_key is not None and guarded
                and request.headers.get("Authorization") != f"Bearer {self.api_key}"):
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _models(self, request: web.Request) -> web.Response:
        cards = [{"id": self.name, "object": "model", "root": self.name, "parent": None}]
        cards += [{"id": n, "object": "model", "root": p, "parent": self.name} for n, p in self.adapters.items()]
        return web.json_response({"object": "list", "data": cards})

    async def _load_adapter(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        self.load_calls.append(name)
        if self.load_delay_s:
            await asyncio.sleep(self.load_delay_s)
        if name in self.adapters:
            return web.json_response({"error": {"message": f"The lora adapter '{name}' has already been loaded."}},
                                     status=400)
        if path in self.bad_paths:
            return web.json_response({"error": {"message": f"Loading lora {name} failed: No adapter found for {path}"}},
                                     status=404)
        self.adapters[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_adapter(self, request: web.Request) -> web.Response:
        name = (await request.json()).get("lora_name")
        if self.adapters.pop(name, None) is None:
            return web.json_response({"error": {"message": f"The lora adapter '{name}' cannot be found."}}, status=404)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

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
            if self.fail_status:
                return web.json_response({"error": {"message": "injected"}}, status=self.fail_status)
            if self.fail == "close":
                if request.transport is not None:
                    request.transport.close()
                return web.Response(status=500)
            n = int(body.get("max_tokens") or self.tokens)
            if n > MAX_TOKENS:  # like an engine past its context length: the client's error, not the server's
                return web.json_response({"error": {"message": f"max_tokens must be <= {MAX_TOKENS}",
                                                     "type": "BadRequestError", "param": "max_tokens",
                                                     "code": 400}}, status=400)
            if self.answer is not None and not body.get("stream"):
                text = self.answer(body)
                doc = completion_document(endpoint, body.get("model"), text, "stop", len(text.split()), int(time.time()))
                return web.json_response(doc)
            parts = render(self.name, endpoint, body.get("model", "m"), n, bool(body.get("stream")), int(time.time()))
            if not body.get("stream"):
                return web.Response(body=parts[0], content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i, part in enumerate(parts):
                if self.token_delay_s and i < n:
                    await asyncio.sleep(self.token_delay_s)
                if self.fail == "cut" and i == len(parts) // 2 and request.transport is not None:
                    request.transport.abort()  # as a replica killed mid-stream
                    return resp
                await resp.write(part)
            await resp.write_eof()
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def completion_document(endpoint: str, model: Any, text: str, finish_reason: str, completion_tokens: int,
                        created: int) -> dict[str, Any]:
    """A non-streaming chat or text completion answering `text` (3 prompt tokens)."""
    if endpoint == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason}
    return {"id": "cmpl-fake", "object": "chat.completion" if endpoint == "chat" else "text_completion",
            "created": created, "model": model, "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": completion_tokens,
                      "total_tokens": completion_tokens + 3}}


def render(name: str, endpoint: str, model: str, n: int, stream: bool, created: int) -> list[bytes]:
    """The body of one response: a JSON document, or the SSE events (n tokens, then [DONE])."""
    if not stream:
        return [json.dumps(completion_document(endpoint, model, f"{name} " * n, "length", n, created)).encode()]
    obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    events = []
    for i in range(n):
        delta = {"delta": {"content": f"{name}{i} "}} if endpoint == "chat" else {"text": f"{name}{i} "}
        chunk = {"id": "cmpl-fake", "object": obj, "created": created, "model": model,
                 "choices": [{"index": 0, **delta, "finish_reason": None}]}
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


class LeanBackendProtocol(asyncio.Protocol):
    """One connection of the lean fake backend (keep-alive, no delays or failure modes)."""

    def __init__(self, name: str, tokens: int, metrics: bytes, cache: dict[tuple[str, str, int, bool], bytes | list[bytes]]) -> None:
        import httptools

        self.name, self.tokens, self.metrics, self.cache = name, tokens, metrics, cache
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, raw = self.url, b"".join(self.body)
        self.url, self.body = b"", []
        t = self.transport
        if t is None or t.is_closing():
            return
        if url == b"/health":
            t.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            return
        if url == b"/metrics":
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(self.metrics), self.metrics))
            return
        endpoint = "chat" if url == b"/v1/chat/completions" else "completions" if url == b"/v1/completions" else ""
        try:
            body = json.loads(raw)
            key = (endpoint, str(body.get("model", "m")), int(body.get("max_tokens") or self.tokens),
                   bool(body.get("stream")))
        except (ValueError, AttributeError, TypeError):
            endpoint = ""
        if not endpoint:
            t.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        resp = self.cache.get(key)
        if resp is None:
            parts = render(self.name, *key, created=int(time.time()))
            if key[3]:
                resp = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                        *(b"%x\r\n%s\r\n" % (len(p), p) for p in parts), b"0\r\n\r\n"]
            else:
                resp = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(parts[0]), parts[0]))
            self.cache[key] = resp
        if isinstance(resp, bytes):
            t.write(resp)
        else:
            t.write(resp[0] + resp[1])  # headers with the first event, then one write per event
            for part in resp[2:]:
                t.write(part)


async def serve_lean(host: str, port: int, name: str, tokens: int, metrics: dict[str, float]) -> int:
    text = "".join(f"{k}{{model_name=\"{name}\"}} {v}\n" for k, v in metrics.items()).encode()
    cache: dict[tuple[str, str, int, bool], bytes | list[bytes]] = {}
    factory: Callable[[], asyncio.Protocol] = lambda: LeanBackendProtocol(name, tokens, text, cache)  # noqa: E731
    server = await asyncio.get_running_loop().create_server(factory, host, port, backlog=1024)
    return int(server.sockets[0].getsockname()[1])


async def _main(args: argparse.Namespace) -> None:
    if args.lean:
        import gc

        gc.freeze()  # as the router does: no full collection walking the imported modules mid-benchmark
        port = await serve_lean(args.host, args.port, args.name, args.tokens,
                                {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
                                 "vllm:kv_cache_usage_perc": 0.1})
        print(f"PORT {port}", flush=True)
        await asyncio.Event().wait()
        return
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
    p.add_argument("--lean", action="store_true", help="bare asyncio Protocol server (benchmarks)")
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
