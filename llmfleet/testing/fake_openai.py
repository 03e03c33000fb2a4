"""Feature-store test and benchmark helpers: a fake OpenAI server in a background thread that records requests
and answers deterministically (the FakeBackend of fake_backend.py), and request-log records in the router's
format."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from llmfleet.testing.fake_backend import FakeBackend


class FakeOpenAI:
    """A FakeBackend on its own event loop in a background thread, for synchronous callers (the feature store's
    generation job, benchmarks): it records every request body and answers each prompt with `answer_for`."""

    def __init__(self, delay_s: float = 0.0, fail_status: int | None = None) -> None:
        self.backend = FakeBackend(name="fake-openai", answer=self.answer_for, delay_s=delay_s,
                                   fail_status=fail_status)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def answer_for(body: dict[str, Any]) -> str:
        text = json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True)
        return f"answer to {text}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.backend.requests

    @property
    def fail_status(self) -> int | None:
        return self.backend.fail_status

    @fail_status.setter
    def fail_status(self, status: int | None) -> None:
        self.backend.fail_status = status

    @property
    def port(self) -> int:
        return self.backend.port

    def start(self) -> FakeOpenAI:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.backend.start())
            except OSError as err:
                failed.append(err)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.backend.stop())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="fake-openai")
        self._thread.start()
        if not ready.wait(10) or failed:
            raise RuntimeError(f"fake OpenAI server did not start: {failed[0] if failed else 'timeout'}")
        return self

    @property
    def url(self) -> str:
        return f"{self.backend.url}/v1"

    def stop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
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
