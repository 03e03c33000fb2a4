"""Exact lookups: the normalized prompt's hash, scoped to tenant, parameters and model version.

They run on the event loop through the fast path of fastpath.py (one prepared point query, bounded on the
loop), or in the thread pool when the fast path is off or falls back. After an exact miss the semantic
lookup (when enabled) is tried; both answers, hits and misses, go into the shared LRU.
"""

from __future__ import annotations

import time
from typing import Any, cast

from llmfleet.store.fastpath import (
    PostgresReader,
    ReaderDatabaseError,
    ReaderFallbackError,
    SqliteReader,
    backend_of,
    compiled_sql,
    exact_statement,
    postgres_reader,
)
from llmfleet.store.lookup_cache import Cached, FailOpen
from llmfleet.store.lookup_runtime import LookupRuntime
from llmfleet.store.lookup_semantic import SemanticLookup


class ExactLookup:
    """Exact lookup with the semantic one as its fallback on a miss."""

    def __init__(self, runtime: LookupRuntime, semantic: SemanticLookup) -> None:
        self.runtime = runtime
        self.semantic = semantic
        settings = runtime.settings
        # The exact-lookup fast path (on the event loop); None runs it in the thread pool like the rest.
        self.backend = backend_of(settings.url) if settings.fast_path else None
        self.reader: SqliteReader | PostgresReader | None = None

    async def lookup(self, tenant: str, text: str, phash: str, pk: str, deadline: float) -> Cached | None:
        if self.backend is not None:
            return await self._lookup_fast(tenant, text, phash, pk, deadline)
        return await self.runtime.in_thread(deadline, self._lookup_sync, tenant, text, phash, pk)

    def get_reader(self) -> SqliteReader | PostgresReader:
        if self.reader is None:
            s = self.runtime.settings
            if self.backend == "sqlite":
                self.reader = SqliteReader(s.url, on_loop_budget_s=s.sqlite_on_loop_s)
            else:
                self.reader = postgres_reader(s.url, size=s.max_workers, connect_timeout_s=s.timeout_s,
                                              statement_timeout_ms=s.timeout_s * 1000.0, driver=s.pg_driver)
        return self.reader

    async def aclose(self) -> None:
        if self.reader is not None:
            await self.reader.aclose()

    # --- fast path on the event loop --------------------------------------------------------------------

    async def _lookup_fast(self, tenant: str, text: str, phash: str, pk: str, deadline: float) -> Cached | None:
        rt = self.runtime
        reader = self.get_reader()
        backend = cast(str, self.backend)
        now = time.time()
        try:
            version = rt.fresh_version(now)
            if version is None:
                which, params = rt.version_params()
                version = rt.found_version(await reader.fetch_one(compiled_sql(backend, which), params, deadline),
                                           now)
            vid, version_name, epoch = version
            key = (vid, epoch, tenant, phash, pk)
            hit = rt.cached(key, now)
            if hit is not None:  # another lookup filled it since the caller looked
                return hit
            row = await reader.fetch_one(compiled_sql(backend, "exact"),
                                         {"vid": vid, "tenant": tenant, "phash": phash, "pk": pk, "now": now},
                                         deadline)
        except ReaderFallbackError as e:  # SQLite locked or slow: the thread path, with what is left of the deadline
            rt.metrics.fast_path_fallbacks.labels(e.reason).inc()
            return await rt.in_thread(deadline, self._lookup_sync, tenant, text, phash, pk)
        except ReaderDatabaseError:
            rt.back_off()
            raise FailOpen("db_error") from None
        except TimeoutError:
            raise FailOpen("timeout") from None
        rt.db_used = True
        if row is not None:
            return rt.remember(key, _exact_hit(row, phash, version_name, now))
        if rt.settings.semantic:
            sem = await rt.in_thread(deadline, self.semantic.lookup_sync, tenant, text, pk, vid, version_name)
            if sem is not None:
                return rt.remember(key, sem)
        rt.remember(key, self._exact_miss(phash, version_name, now))
        return None

    # --- the thread path: when the fast path is off or falls back ---------------------------------------

    def _lookup_sync(self, tenant: str, text: str, phash: str, pk: str) -> Cached | None:
        return self.runtime.db_errors_open(self.lookup_db, tenant, text, phash, pk)

    def lookup_db(self, tenant: str, text: str, phash: str, pk: str) -> Cached | None:
        rt = self.runtime
        now = time.time()
        with rt.eng().connect() as conn:
            vid, version, epoch = rt.resolve_version(conn)
            key = (vid, epoch, tenant, phash, pk)
            hit = rt.cached(key, now)
            if hit is not None:
                return hit
            row = conn.execute(
                exact_statement(), {"vid": vid, "tenant": tenant, "phash": phash, "pk": pk, "now": now}
            ).first()
            rt.db_used = True
            if row is not None:
                return rt.remember(key, _exact_hit(row, phash, version, now))
            if rt.settings.semantic:
                sem = self.semantic.lookup(conn, tenant, text, pk, vid, version)
                if sem is not None:
                    return rt.remember(key, sem)
        rt.remember(key, self._exact_miss(phash, version, now))
        return None

    def _exact_miss(self, phash: str, version: str, now: float) -> Cached:
        return Cached("exact", None, 0.0, phash, version, now, now + self.runtime.settings.negative_ttl_s)


def _exact_hit(row: Any, phash: str, version: str, now: float) -> Cached:
    """A (response, created_at, expires_at) row as a cache entry (an hour when the row has no expiry)."""
    return Cached("exact", row[0], 1.0, phash, version, row[1], row[2] or now + 3600)
