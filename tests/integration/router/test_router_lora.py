"""The router with LoRA adapters against fake vLLM replicas: names, on-demand loads, single flight, slots, reload."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from llmfleet.router.config import AdapterConfig, RouterConfig
from llmfleet.router.server import Router

from .conftest import config, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def with_adapters(cfg: RouterConfig, names: list[str], slots: int = 4) -> RouterConfig:
    primary = cfg.pools[0].model_copy(update={
        "adapters": [AdapterConfig(name=n, path=f"/adapters/{n}") for n in names], "adapter_slots": slots})
    return cfg.model_copy(update={"pools": [primary, *cfg.pools[1:]],
                                  "scorers": {"adapter-loaded": 1.0, "queue-depth": 0.1}})


def chat(model: str, text: str = "hello") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}


async def test_adapter_is_a_model_loaded_once_where_first_asked_then_routed_there(fakes, routers, http) -> None:
    a, b = await fakes(name="m", load_delay_s=0.3), await fakes(name="m", load_delay_s=0.3)
    r = await routers(with_adapters(config({"primary": ("m", [a.url, b.url])}), ["sql", "fr"]))
    async with http.get(r.url + "/v1/models") as resp:
        cards = {c["id"]: c for c in (await resp.json())["data"]}
    assert cards["sql"]["parent"] == "m" and cards["sql"]["root"] == "/adapters/sql" and "parent" not in cards["m"]

    async def ask(model: str) -> int:
        async with http.post(r.url + "/v1/chat/completions", json=chat(model)) as resp:
            await resp.read()
            return resp.status

    # a burst of first requests: one load on one replica (single flight), every request served there
    assert await asyncio.gather(*(ask("sql") for _ in range(6))) == [200] * 6
    assert a.load_calls + b.load_calls == ["sql"]
    holder = a if a.load_calls else b
    assert [q["model"] for q in holder.requests] == ["sql"] * 6  # the adapter's name reaches the engine
    for _ in range(5):
        assert await ask("sql") == 200
    assert len(holder.requests) == 11 and a.load_calls + b.load_calls == ["sql"]
    # a second adapter goes to the replica with free slots... or the holder; either way it is loaded once
    assert await ask("fr") == 200 and await ask("fr") == 200
    assert sorted(a.load_calls + b.load_calls) == ["fr", "sql"]
    assert await ask("m") == 200  # the base model still answers
    metrics = await (await http.get(r.url + "/metrics")).text()
    assert 'llmfleet_router_adapter_loads_total{adapter="sql",outcome="loaded"} 1.0' in metrics


async def test_scrape_learns_adapters_an_engine_already_holds(fakes, routers, http) -> None:
    a, b = await fakes(name="m"), await fakes(name="m")
    b.adapters["sql"] = "/adapters/sql"  # loaded before the router started (e.g. by another router)
    r = await routers(with_adapters(config({"primary": ("m", [a.url, b.url])}), ["sql"]))
    await wait_for(lambda: "sql" in r.router.pools["primary"].replicas.replicas[b.url].adapters)
    for _ in range(4):
        async with http.post(r.url + "/v1/chat/completions", json=chat("sql")) as resp:
            assert resp.status == 200
    assert a.load_calls == b.load_calls == [] and len(b.requests) == 4


async def test_slots_unload_the_least_recently_used_idle_adapter(fakes, routers, http) -> None:
    a = await fakes(name="m")
    r = await routers(with_adapters(config({"primary": ("m", [a.url])}), ["x", "y", "z"], slots=2))
    for name in ("x", "y", "x", "z"):
        async with http.post(r.url + "/v1/chat/completions", json=chat(name)) as resp:
            assert resp.status == 200
    assert a.load_calls == ["x", "y", "z"] and set(a.adapters) == {"x", "z"}  # y was least recently used


async def test_failed_load_is_a_clear_503_and_the_adapter_is_not_held(fakes, routers, http) -> None:
    a = await fakes(name="m", bad_paths={"/adapters/gone"})
    r = await routers(with_adapters(config({"primary": ("m", [a.url])}), ["gone"]))
    async with http.post(r.url + "/v1/chat/completions", json=chat("gone")) as resp:
        assert resp.status == 503
        assert "loading adapter 'gone'" in (await resp.json())["error"]["message"]
    assert a.requests == [] and "gone" not in r.router.pools["primary"].replicas.replicas[a.url].adapters


async def test_adapter_request_never_falls_back_to_a_student(fakes, routers, http) -> None:
    a, s = await fakes(name="m"), await fakes(name="s")
    r = await routers(with_adapters(config({"primary": ("m", [a.url]), "small": ("s", [s.url])}), ["sql"]))
    a.healthy = False  # the primary is down: base requests degrade to the student, adapter requests do not
    await wait_for(lambda: not r.router.pools["primary"].replicas.replicas[a.url].healthy)
    async with http.post(r.url + "/v1/chat/completions", json=chat("m")) as resp:
        assert resp.status == 200 and resp.headers["x-llmfleet-pool"] == "small"
    async with http.post(r.url + "/v1/chat/completions", json=chat("sql")) as resp:
        assert resp.status == 503 and resp.headers["x-llmfleet-pool"] == "primary"
    assert [q["model"] for q in s.requests] == ["s"]


async def test_adapters_added_to_the_config_file_are_served_without_a_restart(fakes, http, tmp_path: Path) -> None:
    from aiohttp import web

    a = await fakes(name="m")
    cfg = with_adapters(config({"primary": ("m", [a.url])}), ["sql"])
    path = tmp_path / "router.yaml"
    path.write_text(cfg.to_yaml())
    router = Router(cfg, config_path=str(path))
    runner = web.AppRunner(router.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with http.post(url + "/v1/chat/completions", json=chat("new")) as resp:
            assert resp.status == 404
        path.write_text(with_adapters(cfg, ["sql", "new"]).to_yaml())
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a distinct mtime on coarse filesystems
        await wait_for(lambda: "new" in router.adapters)
        async with http.post(url + "/v1/chat/completions", json=chat("new")) as resp:
            assert resp.status == 200
        assert a.load_calls == ["new"]
        a.adapters["sql"] = "/adapters/sql"  # held by the replica
        await wait_for(lambda: "sql" in router.pools["primary"].replicas.replicas[a.url].adapters)
        moved = with_adapters(cfg, ["new"])
        moved.pools[0].adapters[0].path = "/adapters/new-v2"  # new weights for `new`: unloaded, reloaded from there
        path.write_text(moved.to_yaml())  # sql removed: 404, and unloaded where held; new moved: unloaded
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
        await wait_for(lambda: "sql" not in router.adapters and "sql" not in a.adapters and "new" not in a.adapters)
        async with http.post(url + "/v1/chat/completions", json=chat("sql")) as resp:
            assert resp.status == 404
        async with http.post(url + "/v1/chat/completions", json=chat("new")) as resp:
            assert resp.status == 200
        assert a.load_calls == ["new", "new"] and a.adapters == {"new": "/adapters/new-v2"}
        path.write_text("not: [valid")  # a broken edit keeps what is served
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 3 * 10**9))
        await asyncio.sleep(0.3)
        assert set(router.adapters) == {"new"}
    finally:
        await runner.cleanup()
