"""Fake OpenAI replicas and an in-process router, all on free ports in the test's event loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmfleet.router.config import LimitsConfig, PoolConfig, RouterConfig
from llmfleet.router.http_server import RouterServer, start_http
from llmfleet.router.server import Router
from llmfleet.testing.fake_backend import FakeBackend


class RouterUnderTest:
    def __init__(self, router: Router, runner: RouterServer | web.AppRunner, url: str) -> None:
        self.router = router
        self.runner = runner
        self.url = url


async def start_router(cfg: RouterConfig, lookup: Any = None) -> RouterUnderTest:
    """The router as `llmfleet router` serves it (connection deadlines included), on a free port."""
    router = Router(cfg, lookup)
    server = await start_http(router, "127.0.0.1", 0)
    return RouterUnderTest(router, server, f"http://127.0.0.1:{server.port}")


def config(pools: dict[str, tuple[str, list[str]]], **kw: Any) -> RouterConfig:
    """pools: name -> (served model, endpoints); the first is the primary."""
    limits = kw.pop("limits", {})
    return RouterConfig(
        service="svc",
        pools=[PoolConfig(name=n, role="primary" if i == 0 else "student", served_names=[model], endpoints=eps)
               for i, (n, (model, eps)) in enumerate(pools.items())],
        limits=LimitsConfig(**{"scrape_interval_seconds": 0.05, "scrape_timeout_seconds": 0.5,
                               "health_failures_to_down": 1, **limits}),
        **kw,
    )


async def wait_for(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
async def fakes() -> AsyncIterator[Callable[..., Awaitable[FakeBackend]]]:
    started: list[FakeBackend] = []

    async def make(**kw: Any) -> FakeBackend:
        fb = FakeBackend(**kw)
        await fb.start()
        started.append(fb)
        return fb

    yield make
    for fb in started:
        await fb.stop()


@pytest.fixture
async def routers() -> AsyncIterator[Callable[..., Awaitable[RouterUnderTest]]]:
    started: list[RouterUnderTest] = []

    async def make(cfg: RouterConfig, lookup: Any = None) -> RouterUnderTest:
        r = await start_router(cfg, lookup)
        started.append(r)
        return r

    yield make
    for r in started:
        await r.runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def fake_processes() -> AsyncIterator[Callable[..., Awaitable[tuple[str, subprocess.Popen[str]]]]]:
    """Fake replicas as processes of their own (`python -m llmfleet.testing.fake_backend ARGS`), to kill for
    real: make(*args) -> (base URL, process); killed at the end of the test if still running."""
    started: list[subprocess.Popen[str]] = []

    async def make(*args: str) -> tuple[str, subprocess.Popen[str]]:
        proc = subprocess.Popen([sys.executable, "-m", "llmfleet.testing.fake_backend", "--port", "0", *args],
                                stdout=subprocess.PIPE, text=True)
        started.append(proc)
        if proc.stdout is None:
            raise RuntimeError("no stdout from the fake backend")
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        return f"http://127.0.0.1:{int(line.split()[1])}", proc

    yield make
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
