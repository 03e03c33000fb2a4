"""What the parts of one FeatureStoreLookup share: the SQLAlchemy engine, the bounded thread pool, the error
backoff, the resolved model version, the LRU and the metrics.

Created lazily: constructing a LookupRuntime opens no connection and starts no thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from llmfleet.store.db import make_engine
from llmfleet.store.fastpath import version_statement
from llmfleet.store.lookup_cache import LRU, Cached, FailOpen
from llmfleet.store.lookup_settings import LookupSettings
from llmfleet.store.metrics import store_metrics

_T = TypeVar("_T")
Version = tuple[int, str, float]
"""(version id, version, epoch) of the model the lookups answer for."""


class LookupRuntime:
    """Shared state and resources of one lookup client."""

    def __init__(self, settings: LookupSettings) -> None:
        self.settings = settings
        self.cache = LRU(settings.cache_size)
        self.metrics = store_metrics()
        self.engine: Engine | None = None
        self.executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._inflight = 0
        self.version: Version | None = None
        self.version_at = 0.0
        self.backoff_until = 0.0
        self.db_used = False  # a lookup reached the database: close() flushes the statistics
        self.closed = False

    # --- resources --------------------------------------------------------------------------------------

    def pool(self) -> ThreadPoolExecutor:
        if self.executor is None:
            with self._lock:
                if self.executor is None:
                    # One spare thread for background work (index refresh, stats flush).
                    self.executor = ThreadPoolExecutor(self.settings.max_workers + 1,
                                                       thread_name_prefix="llmfleet-store")
        return self.executor

    def eng(self) -> Engine:
        if self.engine is None:
            with self._lock:
                if self.engine is None:
                    s = self.settings
                    self.engine = make_engine(s.url, connect_timeout_s=max(1.0, s.timeout_s),
                                              pool_size=s.max_workers + 1, autocommit=True)
        return self.engine

    def shutdown(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        if self.engine is not None:
            self.engine.dispose()

    # --- the thread path --------------------------------------------------------------------------------

    def _done(self, fut: Any) -> None:
        with self._lock:
            self._inflight -= 1

    async def in_thread(self, deadline: float, fn: Callable[..., _T], *args: Any) -> _T:
        """Run `fn` in the pool within the deadline; `busy` when max_workers lookups are already in flight.
        A timed-out call is abandoned, not waited for."""
        with self._lock:
            if self._inflight >= self.settings.max_workers:
                raise FailOpen("busy")
            self._inflight += 1
        fut = self.pool().submit(fn, *args)
        fut.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise FailOpen("timeout") from None

    def back_off(self) -> None:
        """After a database error, fail open without trying for `error_backoff_s`."""
        self.backoff_until = time.monotonic() + self.settings.error_backoff_s

    def db_errors_open(self, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except (SQLAlchemyError, OSError):
            self.back_off()
            raise FailOpen("db_error") from None

    # --- model version ----------------------------------------------------------------------------------

    def fresh_version(self, now: float) -> Version | None:
        """The resolved version while it is still trusted (version_refresh_s), else None."""
        if self.version is not None and now - self.version_at < self.settings.version_refresh_s:
            return self.version
        return None

    def version_params(self) -> tuple[str, dict[str, Any]]:
        s = self.settings
        if s.model_version is not None:
            return "version_pinned", {"model": s.model, "version": s.model_version}
        return "version", {"model": s.model}

    def found_version(self, row: Any, now: float) -> Version:
        if row is None:
            raise FailOpen("no_model_version")
        found = (int(row[0]), str(row[1]), float(row[2]))
        self.version, self.version_at = found, now
        return found

    def resolve_version(self, conn: Any) -> Version:
        """(version id, version, epoch): the epoch (when the model last changed version) is part of every
        LRU key, so switching to another version and back never serves what the LRU held before."""
        now = time.time()
        fresh = self.fresh_version(now)
        if fresh is not None:
            return fresh
        which, params = self.version_params()
        return self.found_version(conn.execute(version_statement(which == "version_pinned"), params).first(), now)

    # --- LRU --------------------------------------------------------------------------------------------

    def cached(self, key: Any, now: float) -> Cached | None:
        """A live LRU entry (counted as a cache hit), or None."""
        hit = self.cache.get(key)
        if hit is not None and now < hit.valid_until:
            self.metrics.cache_hits.inc()
            return hit
        return None

    def remember(self, key: Any, entry: Cached) -> Cached:
        self.cache.put(key, entry)
        return entry
