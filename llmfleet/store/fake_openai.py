"""Test and benchmark helpers: a tiny OpenAI-compatible server (aiohttp, in a background thread) that records
requests and answers deterministically, and request-log records in the router's format."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web


class FakeOpenAI:
    def __init__(self, delay_s: float = 0.0, fail_status: int | None = None) -> None:
        self.delay_s = delay_s
        self.fail_status = fail_status
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @staticmethod
    def answer_for(body: dict[str, Any]) -> str:
        text = json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True)
        return f"answer to {text}"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_status:
            return web.json_response({"error": {"message": "injected"}}, status=self.fail_status)
        answer = self.answer_for(body)
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        if request.path.endswith("/chat/completions"):
            return web.json_response({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                             "finish_reason": "stop"}],
                "usage": usage,
            })
        return web.json_response({
            "id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": body.get("model"),
            "choices": [{"index": 0, "text": answer, "finish_reason": "stop"}], "usage": usage,
        })

    def start(self) -> FakeOpenAI:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._handle)
            app.router.add_post("/v1/completions", self._handle)
            self._runner = web.AppRunner(app)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="fake-openai")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake OpenAI server did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


def log_record(prompt: str, *, tenant: str = "acme", model: str = "tiny", ts: float = 1.0,
               endpoint: str = "chat", params: dict[str, Any] | None = None, status: int = 200) -> dict[str, Any]:
    chat = endpoint == "chat"
    return {
        "ts": ts, "tenant": tenant, "model": model, "endpoint": endpoint,
        "prompt": None if chat else prompt,
        "messages": [{"role": "user", "content": prompt}] if chat else None,
        "params": params if params is not None else {"max_tokens": 16, "temperature": 0, "stream": False},
        "input_tokens": len(prompt) // 4, "output_tokens": 3, "pool": "primary", "degraded": False,
        "ttft_ms": 10.0, "e2e_ms": 20.0, "status": status,
    }


def write_log(path: Path, records: list[dict[str, Any]], mode: str = "w") -> Path:
    with path.open(mode) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def chat_body(prompt: str, **params: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": prompt}],
            **({"max_tokens": 16, "temperature": 0} | params)}
