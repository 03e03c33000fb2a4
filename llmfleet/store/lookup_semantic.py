"""Semantic lookups: embed the normalized prompt, search the tenant's vector index (cosine >= threshold),
and fetch the best live response among the candidates.

The index is built once in the background, then extended with embeddings whose id > the last seen; the
embedding model loads there, never inside a lookup's deadline and never while the store has no embeddings.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from sqlalchemy import Table, select
from sqlalchemy.exc import SQLAlchemyError

from llmfleet.store.fastpath import live_responses
from llmfleet.store.lookup_cache import Cached, FailOpen
from llmfleet.store.lookup_runtime import LookupRuntime
from llmfleet.store.models import Embedding, PromptFeature, Response
from llmfleet.store.vector_index import VectorIndex

if TYPE_CHECKING:
    from llmfleet.store.embeddings import Embedder

_R = cast(Table, Response.__table__)
_E = cast(Table, Embedding.__table__)
_F = cast(Table, PromptFeature.__table__)
_PAGE = 20_000  # embeddings read per query while (re)building the index


class SemanticLookup:
    """One vector index per tenant, ids are prompt_features.id."""

    def __init__(self, runtime: LookupRuntime, embedder: Embedder | str | None = None) -> None:
        self.runtime = runtime
        self._embedder_spec = embedder
        self._embedder: Embedder | None = None
        self.indexes: dict[str, VectorIndex] = {}
        self._feature_hash: dict[int, str] = {}
        self._last_embedding_id = 0
        self._index_loaded_at = 0.0
        self._index_ready = False
        self._index_job: Any = None

    @property
    def index_size(self) -> int:
        return sum(len(i) for i in self.indexes.values())

    def embedder(self) -> Embedder:
        if self._embedder is None:
            from llmfleet.store.embeddings import get_embedder

            self._embedder = get_embedder(self._embedder_spec)
        return self._embedder

    # --- lookups ------------------------------------------------------------------------------------------

    def lookup_sync(self, tenant: str, text: str, pk: str, vid: int, version: str) -> Cached | None:
        """`lookup` on its own connection (the thread path after an exact miss on the fast path)."""

        def run() -> Cached | None:
            with self.runtime.eng().connect() as conn:
                return self.lookup(conn, tenant, text, pk, vid, version)

        return self.runtime.db_errors_open(run)

    def lookup(self, conn: Any, tenant: str, text: str, pk: str, vid: int, version: str) -> Cached | None:
        self._maybe_refresh_index()
        if not self._index_ready:
            raise FailOpen("index_not_ready")
        index = self.indexes.get(tenant)
        if index is None or not len(index):
            return None
        settings = self.runtime.settings
        q = self.embedder().embed([text])[0]
        cands = index.search(q, k=8, threshold=settings.semantic_threshold)
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
        until = min(best[3] or now + 3600, now + settings.index_refresh_s * 6)
        return Cached("semantic", best[1], sims[best[0]], best[0], version, best[2], until)

    # --- the vector index ---------------------------------------------------------------------------------

    def warm(self) -> None:
        """Build the index now, in the caller's thread (warmup: no deadline)."""
        self.refresh_index()
        self._index_loaded_at = time.time()

    def _maybe_refresh_index(self) -> None:
        due = time.time() - self._index_loaded_at > self.runtime.settings.index_refresh_s
        if (not self._index_ready or due) and (self._index_job is None or self._index_job.done()):
            self._index_loaded_at = time.time()
            self._index_job = self.runtime.pool().submit(self._refresh_index_safe)

    def _refresh_index_safe(self) -> None:
        try:
            self.refresh_index()
        except SQLAlchemyError:
            self.runtime.metrics.errors.labels("index_refresh").inc()
        except (ImportError, OSError, ValueError):  # the embedder cannot load: semantic lookups stay off
            self.runtime.metrics.errors.labels("embedder").inc()

    def refresh_index(self) -> None:
        emb = self.embedder()
        name = emb.name  # known without loading the model
        loaded = False
        while True:
            q = (
                select(_E.c.id, _E.c.feature_id, _E.c.vector, _F.c.tenant, _F.c.prompt_hash)
                .select_from(_E.join(_F, _E.c.feature_id == _F.c.id))
                .where(_E.c.embedder == name, _F.c.model == self.runtime.settings.model,
                       _E.c.id > self._last_embedding_id)
                .order_by(_E.c.id)
                .limit(_PAGE)
            )
            with self.runtime.eng().connect() as conn:
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
            self._add(rows)
            self._last_embedding_id = int(rows[-1][0])
            if len(rows) < _PAGE:
                break
        self._index_ready = True
        self.runtime.metrics.index_vectors.set(self.index_size)

    def _add(self, rows: Sequence[Any]) -> None:
        by_tenant: dict[str, list[Any]] = {}
        for r in rows:
            by_tenant.setdefault(r[3], []).append(r)
            self._feature_hash[int(r[1])] = r[4]
        for tenant, rs in by_tenant.items():
            vecs = np.frombuffer(b"".join(bytes(r[2]) for r in rs), dtype="<f4").reshape(len(rs), -1)
            index = self.indexes.get(tenant)
            if index is None:
                index = self.indexes[tenant] = VectorIndex(vecs.shape[1])
            if vecs.shape[1] == index.dim:
                index.add([int(r[1]) for r in rs], vecs)
