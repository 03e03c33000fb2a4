"""What this process last applied to each object, to skip re-sending an unchanged server-side apply.

The operator's reconcile is level-triggered: every trigger (a create/update of the CR, a child's watch event, a
timer tick) renders all children and applies them. Most of those applies send the very bytes the previous one
sent, and the API server answers them without changing anything, yet each costs a request (about 0.4 ms of
operator CPU, docs/architecture.md). An apply is skipped, and the answer of the last one
returned instead, only while all of these hold:
- the manifest serializes to the same bytes (compared by a 128-bit BLAKE2b digest) as the last apply of the same object that succeeded;
- the caller's `generation` (the owner's metadata.generation) is the same as then: a spec change re-sends all;
- the entry is younger than the TTL: a change nobody signalled (a missed watch event, an edit while the
  operator's watch was down) is still repaired within one TTL;
- nothing invalidated it: any failed request for the object, a patch or delete of it through the client, and
  `forget()`, which the operator calls for every watch event of a child that is not its own write (someone
  else changed or deleted it, or its status moved: the cached answer is stale and the next apply goes out).
The cache is per process: a restarted operator re-applies everything once.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

# (kind, namespace or "" for cluster-scoped, name): the operator's key for a child (handlers.applied_rv).
ObjectKey = tuple[str, str, str]


@dataclass
class _Entry:
    body: bytes  # digest of the manifest as sent (thousands of children: no copy of each kept)
    generation: object
    # The answer, JSON encoded and deflated (level 1: ~10 us per child object; JSON of Kubernetes objects shrinks
    # 4-6x): each hit decodes a fresh copy that callers may edit, and thousands of children stay a few MB.
    result: bytes
    expires: float


@dataclass
class AppliedCache:
    """Last successful apply per object; `ttl_seconds` <= 0 disables skipping."""

    ttl_seconds: float
    clock: Callable[[], float] = time.monotonic
    _entries: dict[ObjectKey, _Entry] = field(default_factory=dict)
    hits: int = 0

    @staticmethod
    def body(manifest: Mapping[str, Any]) -> bytes:
        return hashlib.blake2b(msgspec.json.encode(manifest), digest_size=16).digest()

    def lookup(self, key: ObjectKey, body: bytes, generation: object) -> dict[str, Any] | None:
        """The last answer if this exact apply was already done and is still trusted, else None."""
        entry = self._entries.get(key)
        if entry is None or entry.body != body or entry.generation != generation or self.clock() >= entry.expires:
            return None
        self.hits += 1
        result: dict[str, Any] = msgspec.json.decode(zlib.decompress(entry.result))
        return result

    def store(self, key: ObjectKey, body: bytes, generation: object, result: dict[str, Any]) -> None:
        if self.ttl_seconds > 0:
            self._entries[key] = _Entry(body, generation, zlib.compress(msgspec.json.encode(result), 1),
                                        self.clock() + self.ttl_seconds)

    def forget(self, key: ObjectKey) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
