"""Hostile request bodies against a live router (fake replica): always an OpenAI-shaped 4xx, never a 5xx.

Replays the corpus in tests/hostile/router/ (files named ok-* must be served, every other one refused with
4xx) and fuzzes the HTTP endpoints with hypothesis over arbitrary bytes and OpenAI-shaped JSON.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmfleet.testing.fake_backend import FakeBackend

from .conftest import config, start_router, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CORPUS = Path(__file__).resolve().parents[2] / "hostile" / "router"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


class LiveRouter:
    """A router and one fake replica on their own event loop thread, for synchronous hypothesis tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = self.call(self._start())

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    async def _start(self) -> str:
        self.fake = FakeBackend(record=False)
        url = await self.fake.start()
        self.router = await start_router(config({"primary": ("m", [url])}))
        await wait_for(lambda: bool(self.router.router.pools["primary"].replicas.routable()))
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        return self.router.url

    async def _post(self, path: str, body: bytes) -> tuple[int, bytes]:
        async with self.session.post(self.url + path, data=body, headers={"content-type": "application/json"}) as r:
            return r.status, await r.read()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return self.call(self._post(path, body))

    async def _stop(self) -> None:
        await self.session.close()
        await self.router.runner.cleanup()
        await self.fake.stop()

    def close(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def live() -> Iterator[LiveRouter]:
    r = LiveRouter()
    yield r
    r.close()


def assert_openai_error(status: int, raw: bytes) -> dict[str, Any]:
    assert 400 <= status < 500, (status, raw[:200])
    err = json.loads(raw)["error"]
    assert isinstance(err["message"], str) and err["message"] and {"type", "param", "code"} <= set(err)
    return err


@pytest.mark.parametrize("path", sorted(CORPUS.iterdir()), ids=lambda p: p.name)
def test_corpus_gets_a_4xx_or_is_served(live: LiveRouter, path: Path) -> None:
    status, raw = live.post("/v1/chat/completions", path.read_bytes())
    if path.name.startswith("ok-"):
        assert status == 200, raw[:300]
    else:
        assert_openai_error(status, raw)


def test_deep_nesting_is_a_400_naming_the_limit(live: LiveRouter) -> None:
    status, raw = live.post("/v1/chat/completions", (CORPUS / "deep-arrays-in-messages.json").read_bytes())
    assert status == 400 and "nested deeper than 64" in assert_openai_error(status, raw)["message"]
    status, raw = live.post("/admin/drain", b"[" * 5000 + b"]" * 5000)
    assert status == 400


json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=15)
openai_body = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "other"]) | json_values},
    optional={
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]) | json_values},
                                                   optional={"content": json_values}), max_size=3) | json_values,
        "prompt": st.text(max_size=30) | st.lists(st.integers(0, 50000), max_size=5) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(-5, 64) | json_values,
        "temperature": json_values,
    },
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(path=st.sampled_from(ENDPOINTS), raw=st.binary(max_size=300))
def test_fuzz_bytes_never_5xx(live: LiveRouter, path: str, raw: bytes) -> None:
    status, body = live.post(path, raw)
    if status != 200:
        assert_openai_error(status, body)


@FUZZ
@given(path=st.sampled_from(ENDPOINTS), body=openai_body, stream=st.booleans())
def test_fuzz_openai_shaped_json_never_5xx(live: LiveRouter, path: str, body: dict[str, Any], stream: bool) -> None:
    status, raw = live.post(path, json.dumps(body).encode())
    if status != 200:
        assert_openai_error(status, raw)


async def test_stream_cut_mid_way_ends_with_an_error_event(fakes: Any, routers: Any) -> None:
    """A replica dying mid-stream: the client gets the tokens so far, then an error event (no [DONE]), and
    the response ends; the OpenAI SDK raises on such an event instead of waiting."""
    fb = await fakes(tokens=8, fail="cut")
    r = await routers(config({"primary": ("m", [fb.url])}))
    await wait_for(lambda: bool(r.router.pools["primary"].replicas.routable()))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(r.url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            assert resp.status == 200
            text = (await resp.read()).decode()
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    assert events[0].startswith("{") and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["type"] == "upstream_error" and "mid-response" in error["message"]
