"""Correct the prefix index from vLLM's KV-cache events (`--kv-events-config`, ZMQ PUB, msgpack).

vLLM publishes multipart messages (topic, sequence number, payload). The payload is a msgspec `KVEventBatch`
encoded as an array `[ts, events, data_parallel_rank?]`; each event is a map tagged by `type`
(BlockStored / BlockRemoved / AllBlocksCleared), which is the dict form `PrefixIndex.apply_kv_event` takes.
Decoded without importing vLLM. One SUB socket per replica, reconciled with the pool's membership.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from llmfleet.router.prefix_index import PrefixIndex

log = logging.getLogger("llmfleet.router.kv_events")


def batch_events(batch: Any) -> list[dict[str, Any]]:
    """The event maps of one decoded batch (array or map form); anything else yields nothing."""
    events: Any = None
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        events = batch[1]
    elif isinstance(batch, dict):
        events = batch.get("events")
    if not isinstance(events, (list, tuple)):
        return []
    return [e for e in events if isinstance(e, dict)]


def apply_batch(index: PrefixIndex, replica: str, batch: Any, block_size: int) -> int:
    n = 0
    for ev in batch_events(batch):
        bs = ev.get("block_size")
        index.apply_kv_event(replica, ev, int(bs) if isinstance(bs, int) and bs > 0 else block_size)
        n += 1
    return n


def events_endpoint(replica_url: str, port: int) -> str:
    host = urlsplit(replica_url).hostname or "127.0.0.1"
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class KVEventSubscribers:
    """One task per replica reading its event stream into `index`."""

    def __init__(self, index: PrefixIndex, port: int | None, block_size: int,
                 on_events: Callable[[int], None] | None = None, endpoints: dict[str, str] | None = None) -> None:
        self.index = index
        self.port = port
        self.endpoints = {k.rstrip("/"): v for k, v in (endpoints or {}).items()}
        self.block_size = block_size
        self.on_events = on_events
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def reconcile(self, replicas: list[str]) -> None:
        for r in replicas:
            if r not in self.endpoints and self.port is None:
                continue
            if r not in self.tasks or self.tasks[r].done():
                self.tasks[r] = asyncio.create_task(self._run(r))
        for r in [r for r in self.tasks if r not in replicas]:
            self.tasks.pop(r).cancel()

    async def close(self) -> None:
        for t in self.tasks.values():
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()

    async def _run(self, replica: str) -> None:
        import msgspec
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        endpoint = self.endpoints.get(replica) or events_endpoint(replica, self.port or 0)
        sock.connect(endpoint)
        decoder = msgspec.msgpack.Decoder()
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    batch = decoder.decode(frames[-1])
                except msgspec.DecodeError as e:
                    log.debug("undecodable KV event batch from %s: %s", replica, e)
                    continue
                n = apply_batch(self.index, replica, batch, self.block_size)
                if self.on_events is not None:
                    self.on_events(n)
        finally:
            sock.close(linger=0)
