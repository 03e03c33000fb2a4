"""LoRA adapters at the router: which replica holds which adapter, and loading one where a request needs it.

The engine's model list (`GET /v1/models`: vLLM lists each loaded adapter with a `parent`) is read with every
scrape and becomes `ReplicaState.adapters`. When the pipeline picks a replica that lacks the adapter, the router
loads it there through vLLM's runtime endpoint (`POST /v1/load_lora_adapter`, enabled by
VLLM_ALLOW_RUNTIME_LORA_UPDATING) before sending the request: one load per (replica, adapter) at a time, which
every request arriving meanwhile waits for (single flight). The adapter counts as held from the moment its load
starts, so a burst of first requests goes to the replica already loading it. A replica holds at most
`adapter_slots` adapters: before loading one more, the least recently used adapter with no request in flight
there is unloaded (`POST /v1/unload_lora_adapter`), which keeps the engine's list equal to what it has warm.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from llmfleet.router.config import RouterConfig, load_router_config
from llmfleet.router.plugins.base import ReplicaState

log = logging.getLogger("llmfleet.router.adapters")
LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"


class AdapterLoadFailed(Exception):
    """The replica refused or failed to load the adapter (message from the engine)."""


def adapters_in_model_list(body: Any, base_names: Iterable[str]) -> set[str]:
    """Adapter names in an OpenAI /v1/models body: entries with a `parent` (vLLM's LoRA cards) that are not a
    base model. Anything unexpected yields nothing."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return set()
    base = set(base_names)
    return {str(m["id"]) for m in data
            if isinstance(m, dict) and m.get("parent") and m.get("id") and m["id"] not in base}


def adapter_table(cfg: RouterConfig) -> dict[str, tuple[str, str]]:
    """adapter name -> (pool, lora_path) over the config's pools (the first pool listing a name wins)."""
    table: dict[str, tuple[str, str]] = {}
    for p in cfg.pools:
        for a in p.adapters:
            table.setdefault(a.name, (p.name, a.path))
    return table


class ConfigFile:
    """The router's config file, re-read when it changes (for adapters, the settings applied without a restart)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mtime = self._stat()

    def _stat(self) -> int | None:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def changed(self) -> RouterConfig | None:
        """The new config when the file changed since the last call, else None (also when it is unreadable)."""
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return None
        self._mtime = mtime
        try:
            cfg = load_router_config(self.path)
        except (OSError, ValueError) as e:
            log.warning("router config %s changed but was not reloaded: %s", self.path, e)
            return None
        log.info("router config %s changed: adapters %s", self.path, sorted(adapter_table(cfg)))
        return cfg


def _already_loaded(status: int, text: str) -> bool:
    # vLLM answers 400 "... has already been loaded ..." for a second load of the same name: it is there.
    return status == 400 and "already been loaded" in text


class AdapterLoader:
    """Single-flight adapter loads per (replica, adapter), slot-bounded with LRU unloading of idle adapters."""

    def __init__(self, timeout_s: float, on_load: Callable[[str, str], None] | None = None) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.on_load = on_load  # (adapter, outcome: loaded | failed | unloaded) for metrics
        self._loads: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._in_flight: dict[tuple[str, str], int] = {}
        self._used: dict[tuple[str, str], float] = {}

    async def ensure(self, session: aiohttp.ClientSession, replica: ReplicaState, name: str, path: str) -> None:
        """Return once `replica` holds adapter `name` (loading it from `path` if needed); raises AdapterLoadFailed."""
        key = (replica.id, name)
        self._used[key] = time.monotonic()
        task = self._loads.get(key)
        if task is None:
            if name in replica.adapters and name not in replica.adapters_loading:
                return
            replica.adapters.add(name)  # held from now on: concurrent requests come here and wait below
            replica.adapters_loading.add(name)
            task = asyncio.ensure_future(self._load(session, replica, name, path))
            self._loads[key] = task
            task.add_done_callback(lambda _t: self._loads.pop(key, None))
        # shielded: a client that goes away does not cancel the load the others wait for
        await asyncio.shield(task)

    async def _load(self, session: aiohttp.ClientSession, replica: ReplicaState, name: str, path: str) -> None:
        try:
            await self._make_room(session, replica, name)
            body = {"lora_name": name, "lora_path": path}
            try:
                async with session.post(replica.id + LOAD_PATH, json=body, timeout=self.timeout) as resp:
                    text = await resp.text()
                    ok = resp.status == 200 or _already_loaded(resp.status, text)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise AdapterLoadFailed(f"loading adapter {name!r} on {replica.id}: {e}") from None
            if not ok:
                raise AdapterLoadFailed(f"loading adapter {name!r} on {replica.id}: HTTP {resp.status} {text[:300]}")
        except AdapterLoadFailed:
            replica.adapters.discard(name)
            self._count(name, "failed")
            raise
        finally:
            replica.adapters_loading.discard(name)
        log.info("loaded adapter %s on %s", name, replica.id)
        self._count(name, "loaded")

    async def _make_room(self, session: aiohttp.ClientSession, replica: ReplicaState, name: str) -> None:
        """Unload least recently used idle adapters until `name` fits in the replica's slots (best effort)."""
        slots = replica.adapter_slots
        if slots <= 0:
            return
        while len(replica.adapters) > slots:  # `name` is already counted
            idle = [a for a in replica.adapters
                    if a != name and a not in replica.adapters_loading and not self._in_flight.get((replica.id, a))]
            if not idle:
                return  # everything is busy: the engine's own LRU cache copes (reloading from disk when needed)
            victim = min(idle, key=lambda a: self._used.get((replica.id, a), 0.0))
            if not await self.unload(session, replica, victim):
                return

    async def unload(self, session: aiohttp.ClientSession, replica: ReplicaState, name: str) -> bool:
        """Unload adapter `name` from `replica` (it stops counting as held at once); False when the call failed."""
        replica.adapters.discard(name)
        try:
            async with session.post(replica.id + UNLOAD_PATH, json={"lora_name": name}, timeout=self.timeout) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("unloading adapter %s from %s failed: %s", name, replica.id, e)
            return False
        self._count(name, "unloaded")
        return True

    def begin(self, replica: ReplicaState, name: str) -> None:
        key = (replica.id, name)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._used[key] = time.monotonic()

    def end(self, replica: ReplicaState, name: str) -> None:
        key = (replica.id, name)
        n = self._in_flight.get(key, 0) - 1
        if n > 0:
            self._in_flight[key] = n
        else:
            self._in_flight.pop(key, None)

    def forget(self, replica_id: str) -> None:
        """A replica left the pool: drop what was remembered about it."""
        for d in (self._in_flight, self._used):
            for key in [k for k in d if k[0] == replica_id]:
                del d[key]

    def _count(self, name: str, outcome: str) -> None:
        if self.on_load is not None:
            self.on_load(name, outcome)


async def scrape_adapters(session: aiohttp.ClientSession, replica: ReplicaState, base_names: Iterable[str],
                          timeout: aiohttp.ClientTimeout) -> None:
    """Refresh `replica.adapters` from its engine's model list (loads under way stay counted)."""
    try:
        async with session.get(replica.id + MODELS_PATH, timeout=timeout) as resp:
            if resp.status != 200:
                return
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return
    replica.adapters = adapters_in_model_list(body, base_names) | replica.adapters_loading
