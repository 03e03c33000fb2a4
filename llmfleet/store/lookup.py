"""Online lookups for the router: exact (normalized-prompt hash) then semantic (cosine >= threshold).

Both are scoped to the tenant and the current model version, bounded by a deadline, and fail open: any
timeout or database error returns None (the request goes to the model) and is counted. The exact lookup (and
the model-version check) runs on the event loop through the fast path of fastpath.py: one prepared point
query, bounded on the loop. Semantic lookups (embedding, index search, candidate fetch), index refreshes and
statistics run in a small thread pool; a timed-out call is abandoned, not waited for.
Construction is cheap: no connection, no torch, no model load until the first lookup (or `warmup()`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
from sqlalchemy import Engine, Table, select
from sqlalchemy.exc import SQLAlchemyError

from llmfleet.store.db import default_url as _default_url
from llmfleet.store.db import dialect_insert, make_engine, normalize_url
from llmfleet.store.fastpath import (
    PostgresReader,
    ReaderDatabaseError,
    ReaderFallbackError,
    SqliteReader,
    backend_of,
    compiled_sql,
    exact_statement,
    live_responses,
    postgres_reader,
    version_statement,
)
from llmfleet.store.lookup_cache import LRU, Cached, LookupResult, Outcome
from llmfleet.store.metrics import store_metrics
from llmfleet.store.models import Embedding, LookupStat, PromptFeature, Response
from llmfleet.store.normalize import (
    BadRequestError,
    normalized_prompt,
    params_hash,
    prompt_hash,
    split_request,
)
from llmfleet.store.vector_index import VectorIndex

if TYPE_CHECKING:
    from llmfleet.api.inferenceservice import FeatureStoreSpec
    from llmfleet.store.embeddings import Embedder

_R = cast(Table, Response.__table__)
_E = cast(Table, Embedding.__table__)
_F = cast(Table, PromptFeature.__table__)
_S = cast(Table, LookupStat.__table__)
_T = TypeVar("_T")


class FeatureStoreLookup:
    """The router's view of the feature store. See docs/feature-store.md for the contract."""

    def __init__(
        self,
        url: str | None,
        model: str,
        *,
        model_version: str | None = None,
        semantic_threshold: float = 0.92,
        timeout_ms: float = 20.0,
        semantic: bool = True,
        embedder: Embedder | str | None = None,
        cache_size: int = 10_000,
        negative_ttl_s: float = 5.0,
        version_refresh_s: float = 5.0,
        index_refresh_s: float = 10.0,
        error_backoff_s: float = 1.0,
        stats_flush_s: float = 30.0,
        max_workers: int = 4,
        fast_path: bool = True,
        sqlite_on_loop_ms: float = 2.0,
        pg_driver: str | None = None,
    ) -> None:
        self.url = normalize_url(url)
        self.model = model
        self.pinned_version = model_version
        self.semantic_threshold = semantic_threshold
        self.timeout_s = timeout_ms / 1000.0
        self.semantic = semantic
        self._embedder_spec = embedder
        self._embedder: Embedder | None = None
        self.negative_ttl_s = negative_ttl_s
        self.version_refresh_s = version_refresh_s
        self.index_refresh_s = index_refresh_s
        self.error_backoff_s = error_backoff_s
        self.stats_flush_s = stats_flush_s
        self.max_workers = max_workers
        self._cache = LRU(cache_size)
        self._engine: Engine | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._inflight = 0
        self._version: tuple[int, str, float] | None = None
        self._version_at = 0.0
        self._backoff_until = 0.0
        # Semantic index: one VectorIndex per tenant, ids are prompt_features.id.
        self._indexes: dict[str, VectorIndex] = {}
        self._feature_hash: dict[int, str] = {}
        self._last_embedding_id = 0
        self._index_loaded_at = 0.0
        self._index_ready = False
        self._index_job: Any = None
        self._stats: dict[tuple[str, str, str], int] = {}
        self._stats_at = time.time()
        self._metrics = store_metrics()
        self._closed = False
        self._db_used = False  # a lookup reached the database: close() flushes the statistics
        # The exact-lookup fast path (on the event loop); False runs it in the thread pool like the rest.
        self._backend = backend_of(self.url) if fast_path else None
        self.sqlite_on_loop_s = sqlite_on_loop_ms / 1000.0
        if pg_driver not in (None, "asyncpg", "psycopg"):
            raise ValueError(f"pg_driver must be 'asyncpg' or 'psycopg', not {pg_driver!r}")
        self.pg_driver = pg_driver  # PostgreSQL client of the fast path; None: asyncpg when installed
        self._reader: SqliteReader | PostgresReader | None = None

    @classmethod
    def from_spec(
        cls,
        spec: FeatureStoreSpec | None,
        model: str,
        *,
        run_dir: str | Path | None = None,
        embedder: Embedder | str | None = None,
        **kwargs: Any,
    ) -> FeatureStoreLookup:
        """From an InferenceService's `spec.featureStore` (url, semanticThreshold, lookupTimeoutMs)."""
        url = spec.url if spec and spec.url else _default_url(run_dir)
        if spec is not None:
            kwargs.setdefault("semantic_threshold", spec.semantic_threshold)
            kwargs.setdefault("timeout_ms", spec.lookup_timeout_ms)
        return cls(url, model, embedder=embedder, **kwargs)

    # --- public API -------------------------------------------------------------------------------------

    async def lookup(self, tenant: str, endpoint: str, body: dict[str, Any]) -> LookupResult | None:
        """A precomputed response for this request, or None (miss, timeout, error: go to the model)."""
        m = self._metrics
        t0 = time.perf_counter()
        kind, result = "exact", "miss"
        try:
            prompt, messages, params = split_request(endpoint, body)
            text = normalized_prompt(endpoint, prompt, messages)
        except BadRequestError:
            m.lookups.labels("none", "unkeyable").inc()
            return None
        phash, pk = prompt_hash(endpoint, text), params_hash(params)
        try:
            version = self._version
            if version is not None and time.time() - self._version_at < self.version_refresh_s:
                hit = self._cache.get((version[0], version[2], tenant, phash, pk))
                if hit is not None and time.time() < hit.valid_until:
                    m.cache_hits.inc()
                    kind, result = hit.kind, "hit" if hit.body is not None else "miss"
                    return self._result(hit)
            if time.monotonic() < self._backoff_until:
                raise Outcome("backoff")
            deadline = time.monotonic() + self.timeout_s
            if self._backend is not None:
                cached = await self._lookup_fast(tenant, text, phash, pk, deadline)
            else:
                cached = await self._in_thread(deadline, self._lookup_sync, tenant, text, phash, pk)
            if cached is None:
                return None
            kind, result = cached.kind, "hit" if cached.body is not None else "miss"
            return self._result(cached)
        except Outcome as o:
            kind, result = "none", "error"
            m.errors.labels(o.reason).inc()
            return None
        finally:
            m.lookups.labels(kind, result).inc()
            m.lookup_seconds.observe(time.perf_counter() - t0)
            self._count(tenant, kind, result)

    async def warmup(self) -> bool:
        """Connect, resolve the model version, load the embedder and build the vector index (no deadline).

        Returns False (and counts the reason) instead of raising when the store is not usable yet; lookups
        then keep failing open until it is.
        """
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool(), self._warmup_sync)
        except Outcome as o:
            self._metrics.errors.labels(o.reason).inc()
            return False
        except SQLAlchemyError:
            self._metrics.errors.labels("db_error").inc()
            return False
        except (ImportError, OSError, ValueError):
            self._metrics.errors.labels("embedder").inc()
            return False
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            await self._reader.aclose()
        if self._engine is not None or (self._db_used and self._stats):
            try:
                await asyncio.wait_for(asyncio.to_thread(self._flush_stats), timeout=2.0)
            except (TimeoutError, SQLAlchemyError):
                self._metrics.errors.labels("stats_flush").inc()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._engine is not None:
            self._engine.dispose()

    @property
    def index_size(self) -> int:
        return sum(len(i) for i in self._indexes.values())

    # --- internals ----------------------------------------------------------------------------------------

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    # One spare thread for background work (index refresh, stats flush).
                    self._executor = ThreadPoolExecutor(self.max_workers + 1, thread_name_prefix="llmfleet-store")
        return self._executor

    def _eng(self) -> Engine:
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    self._engine = make_engine(self.url, connect_timeout_s=max(1.0, self.timeout_s),
                                               pool_size=self.max_workers + 1, autocommit=True)
        return self._engine

    def _done(self, fut: Any) -> None:
        with self._lock:
            self._inflight -= 1

    def _get_embedder(self) -> Embedder:
        if self._embedder is None:
            from llmfleet.store.embeddings import get_embedder

            self._embedder = get_embedder(self._embedder_spec)
        return self._embedder

    @staticmethod
    def _result(c: Cached) -> LookupResult | None:
        if c.body is None:
            return None
        return LookupResult(
            kind=c.kind,  # type: ignore[arg-type]
            response=json.loads(c.body),
            similarity=c.similarity,
            prompt_hash=c.prompt_hash,
            model_version=c.version,
            age_s=max(0.0, time.time() - c.created_at),
        )

    def _count(self, tenant: str, kind: str, result: str) -> None:
        key = (tenant, kind, result)
        self._stats[key] = self._stats.get(key, 0) + 1
        due = time.time() - self._stats_at > self.stats_flush_s
        if due and (self._engine is not None or self._db_used) and not self._closed:
            self._stats_at = time.time()
            self._pool().submit(self._flush_stats_safe)

    def _flush_stats_safe(self) -> None:
        try:
            self._flush_stats()
        except SQLAlchemyError:
            self._metrics.errors.labels("stats_flush").inc()

    def _flush_stats(self) -> None:
        stats, self._stats = self._stats, {}
        if not stats:
            return
        bucket = float(int(time.time() // 3600) * 3600)
        rows = [
            {"tenant": t, "model": self.model, "bucket_start": bucket, "kind": k, "result": r, "count": n}
            for (t, k, r), n in stats.items()
        ]
        with self._eng().begin() as conn:
            ins = dialect_insert(conn.dialect.name, _S)
            conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["tenant", "model", "bucket_start", "kind", "result"],
                    set_={"count": _S.c.count + ins.excluded.count},
                ),
                rows,
            )

    # --- exact lookups: fast path on the event loop ------------------------------------------------------

    def _get_reader(self) -> SqliteReader | PostgresReader:
        if self._reader is None:
            if self._backend == "sqlite":
                self._reader = SqliteReader(self.url, on_loop_budget_s=self.sqlite_on_loop_s)
            else:
                self._reader = postgres_reader(self.url, size=self.max_workers, connect_timeout_s=self.timeout_s,
                                               statement_timeout_ms=self.timeout_s * 1000.0, driver=self.pg_driver)
        return self._reader

    def _drop_connections(self) -> None:
        """Close every pooled connection now (tests: what a database restart does to open handles)."""
        if self._reader is not None:
            self._reader.close()
        if self._engine is not None:
            self._engine.dispose()

    def _version_params(self) -> tuple[str, dict[str, Any]]:
        if self.pinned_version is not None:
            return "version_pinned", {"model": self.model, "version": self.pinned_version}
        return "version", {"model": self.model}

    def _found_version(self, row: Any, now: float) -> tuple[int, str, float]:
        if row is None:
            raise Outcome("no_model_version")
        found = (int(row[0]), str(row[1]), float(row[2]))
        self._version, self._version_at = found, now
        return found

    async def _lookup_fast(self, tenant: str, text: str, phash: str, pk: str, deadline: float) -> Cached | None:
        reader = self._get_reader()
        backend = cast(str, self._backend)
        now = time.time()
        try:
            version = self._version
            if version is None or now - self._version_at >= self.version_refresh_s:
                which, params = self._version_params()
                version = self._found_version(await reader.fetch_one(compiled_sql(backend, which), params, deadline),
                                              now)
            vid, version_name, epoch = version
            key = (vid, epoch, tenant, phash, pk)
            hit = self._cache.get(key)
            if hit is not None and now < hit.valid_until:  # another lookup filled it since the caller looked
                self._metrics.cache_hits.inc()
                return hit
            row = await reader.fetch_one(compiled_sql(backend, "exact"),
                                         {"vid": vid, "tenant": tenant, "phash": phash, "pk": pk, "now": now},
                                         deadline)
        except ReaderFallbackError as e:  # SQLite locked or slow: the thread path, with what is left of the deadline
            self._metrics.fast_path_fallbacks.labels(e.reason).inc()
            return await self._in_thread(deadline, self._lookup_sync, tenant, text, phash, pk)
        except ReaderDatabaseError:
            self._backoff_until = time.monotonic() + self.error_backoff_s
            raise Outcome("db_error") from None
        except TimeoutError:
            raise Outcome("timeout") from None
        self._db_used = True
        if row is not None:
            return self._remember(key, self._exact_hit(row, phash, version_name, now))
        if self.semantic:
            sem = await self._in_thread(deadline, self._semantic_sync, tenant, text, pk, vid, version_name)
            if sem is not None:
                return self._remember(key, sem)
        self._remember(key, self._exact_miss(phash, version_name, now))
        return None

    @staticmethod
    def _exact_hit(row: Any, phash: str, version: str, now: float) -> Cached:
        """A (response, created_at, expires_at) row as a cache entry (an hour when the row has no expiry)."""
        return Cached("exact", row[0], 1.0, phash, version, row[1], row[2] or now + 3600)

    def _exact_miss(self, phash: str, version: str, now: float) -> Cached:
        return Cached("exact", None, 0.0, phash, version, now, now + self.negative_ttl_s)

    def _remember(self, key: Any, entry: Cached) -> Cached:
        self._cache.put(key, entry)
        return entry

    # --- the thread path: semantic lookups, and exact ones when the fast path is off or falls back ------

    async def _in_thread(self, deadline: float, fn: Callable[..., _T], *args: Any) -> _T:
        with self._lock:
            if self._inflight >= self.max_workers:
                raise Outcome("busy")
            self._inflight += 1
        fut = self._pool().submit(fn, *args)
        fut.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise Outcome("timeout") from None

    def _resolve_version(self, conn: Any) -> tuple[int, str, float]:
        """(version id, version, epoch): the epoch (when the model last changed version) is part of every
        LRU key, so switching to another version and back never serves what the LRU held before."""
        now = time.time()
        if self._version is not None and now - self._version_at < self.version_refresh_s:
            return self._version
        which, params = self._version_params()
        return self._found_version(conn.execute(version_statement(which == "version_pinned"), params).first(), now)

    def _db_errors_open(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (SQLAlchemyError, OSError):
            self._backoff_until = time.monotonic() + self.error_backoff_s
            raise Outcome("db_error") from None

    def _lookup_sync(self, tenant: str, text: str, phash: str, pk: str) -> Cached | None:
        return cast("Cached | None", self._db_errors_open(self._lookup_db, tenant, text, phash, pk))

    def _semantic_sync(self, tenant: str, text: str, pk: str, vid: int, version: str) -> Cached | None:
        def run() -> Cached | None:
            with self._eng().connect() as conn:
                return self._semantic(conn, tenant, text, pk, vid, version)

        return cast("Cached | None", self._db_errors_open(run))

    def _lookup_db(self, tenant: str, text: str, phash: str, pk: str) -> Cached | None:
        now = time.time()
        with self._eng().connect() as conn:
            vid, version, epoch = self._resolve_version(conn)
            key = (vid, epoch, tenant, phash, pk)
            hit = self._cache.get(key)
            if hit is not None and now < hit.valid_until:
                self._metrics.cache_hits.inc()
                return hit
            row = conn.execute(
                exact_statement(), {"vid": vid, "tenant": tenant, "phash": phash, "pk": pk, "now": now}
            ).first()
            self._db_used = True
            if row is not None:
                return self._remember(key, self._exact_hit(row, phash, version, now))
            if self.semantic:
                sem = self._semantic(conn, tenant, text, pk, vid, version)
                if sem is not None:
                    return self._remember(key, sem)
        self._remember(key, self._exact_miss(phash, version, now))
        return None

    def _semantic(self, conn: Any, tenant: str, text: str, pk: str, vid: int, version: str) -> Cached | None:
        self._maybe_refresh_index()
        if not self._index_ready:
            raise Outcome("index_not_ready")
        index = self._indexes.get(tenant)
        if index is None or not len(index):
            return None
        q = self._get_embedder().embed([text])[0]
        cands = index.search(q, k=8, threshold=self.semantic_threshold)
        if not cands:
            return None
        sims = {self._feature_hash[fid]: s for fid, s in cands if fid in self._feature_hash}
        now = time.time()
        # The exact statement's liveness and scoping, for the candidates' prompt hashes.
        live = live_responses(_R.c.prompt_hash, _R.c.response, _R.c.created_at, _R.c.expires_at)
        rows = conn.execute(
            live.where(_R.c.prompt_hash.in_(list(sims))), {"vid": vid, "tenant": tenant, "pk": pk, "now": now}
        ).all()
        if not rows:
            return None
        best = max(rows, key=lambda r: sims[r[0]])
        until = min(best[3] or now + 3600, now + self.index_refresh_s * 6)
        return Cached("semantic", best[1], sims[best[0]], best[0], version, best[2], until)

    # Vector index: built once in the background, then extended with embeddings whose id > the last seen.

    def _maybe_refresh_index(self) -> None:
        due = time.time() - self._index_loaded_at > self.index_refresh_s
        if (not self._index_ready or due) and (self._index_job is None or self._index_job.done()):
            self._index_loaded_at = time.time()
            self._index_job = self._pool().submit(self._refresh_index_safe)

    def _refresh_index_safe(self) -> None:
        try:
            self._refresh_index()
        except SQLAlchemyError:
            self._metrics.errors.labels("index_refresh").inc()
        except (ImportError, OSError, ValueError):  # the embedder cannot load: semantic lookups stay off
            self._metrics.errors.labels("embedder").inc()

    def _refresh_index(self) -> None:
        emb = self._get_embedder()
        name = emb.name  # known without loading the model
        loaded = False
        while True:
            q = (
                select(_E.c.id, _E.c.feature_id, _E.c.vector, _F.c.tenant, _F.c.prompt_hash)
                .select_from(_E.join(_F, _E.c.feature_id == _F.c.id))
                .where(_E.c.embedder == name, _F.c.model == self.model, _E.c.id > self._last_embedding_id)
                .order_by(_E.c.id)
                .limit(20_000)
            )
            with self._eng().connect() as conn:
                rows = conn.execute(q).all()
            if not rows:
                break
            if not loaded:
                # Load the model here, in the background, and only once there is something to search:
                # never inside a lookup's deadline, never in a router whose store has no embeddings.
                load = getattr(emb, "load", None)
                if load is not None:
                    load()
                loaded = True
            by_tenant: dict[str, list[Any]] = {}
            for r in rows:
                by_tenant.setdefault(r[3], []).append(r)
                self._feature_hash[int(r[1])] = r[4]
            for tenant, rs in by_tenant.items():
                vecs = np.frombuffer(b"".join(bytes(r[2]) for r in rs), dtype="<f4").reshape(len(rs), -1)
                index = self._indexes.get(tenant)
                if index is None:
                    index = self._indexes[tenant] = VectorIndex(vecs.shape[1])
                if vecs.shape[1] == index.dim:
                    index.add([int(r[1]) for r in rs], vecs)
            self._last_embedding_id = int(rows[-1][0])
            if len(rows) < 20_000:
                break
        self._index_ready = True
        self._metrics.index_vectors.set(self.index_size)

    def _warmup_sync(self) -> None:
        with self._eng().connect() as conn:
            self._resolve_version(conn)
        if self.semantic:
            self._refresh_index()
            self._index_loaded_at = time.time()
