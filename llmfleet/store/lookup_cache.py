"""What a lookup returns, the in-process LRU in front of the database, and the fail-open outcome."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class LookupResult:
    """A precomputed response the router can return instead of calling the model."""

    kind: Literal["exact", "semantic"]
    response: dict[str, Any]
    similarity: float
    prompt_hash: str
    model_version: str
    age_s: float


@dataclass(frozen=True)
class Cached:
    """An LRU entry: a response (or, with body None, a remembered miss) and until when it may be served."""

    kind: str
    body: str | None  # None: a negative entry
    similarity: float
    prompt_hash: str
    version: str
    created_at: float
    valid_until: float


class LRU:
    """A thread-safe LRU (the event loop and the worker threads both use it)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[Any, Cached] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Cached | None:
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
            return v

    def put(self, key: Any, value: Cached) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


class FailOpen(Exception):  # noqa: N818 - internal control flow: a counted fail-open reason
    """A lookup fails open for `reason` (the label of llmfleet_store_lookup_errors_total)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
