"""Online lookups for the router: exact (normalized-prompt hash) then semantic (cosine >= threshold).

Both are scoped to the tenant and the current model version, bounded by a deadline, and fail open: any
timeout or database error returns None (the request goes to the model) and is counted. The exact lookup (and
the model-version check) runs on the event loop through the fast path of fastpath.py: one prepared point
query, bounded on the loop. Semantic lookups (embedding, index search, candidate fetch), index refreshes and
statistics run in a small thread pool; a timed-out call is abandoned, not waited for.
Construction is cheap: no connection, no torch, no model load until the first lookup (or `warmup()`).

FeatureStoreLookup is the facade over the parts: LookupSettings (lookup_settings.py), the shared
LookupRuntime (lookup_runtime.py), ExactLookup (lookup_exact.py), SemanticLookup (lookup_semantic.py) and
LookupStats (lookup_stats.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from llmfleet.store.db import default_url as _default_url
from llmfleet.store.db import normalize_url
from llmfleet.store.lookup_cache import Cached, FailOpen, LookupResult
from llmfleet.store.lookup_exact import ExactLookup
from llmfleet.store.lookup_runtime import LookupRuntime
from llmfleet.store.lookup_semantic import SemanticLookup
from llmfleet.store.lookup_settings import LookupSettings
from llmfleet.store.lookup_stats import LookupStats
from llmfleet.store.normalize import (
    BadRequestError,
    normalized_prompt,
    params_hash,
    prompt_hash,
    split_request,
)

if TYPE_CHECKING:
    from llmfleet.api.inferenceservice import FeatureStoreSpec
    from llmfleet.store.embeddings import Embedder


class FeatureStoreLookup:
    """The router's view of the feature store. See docs/feature-store.md for the contract.

    `FeatureStoreLookup(url, model, **options)` takes LookupSettings' fields as keyword options;
    `FeatureStoreLookup.from_settings(settings)` takes the settings object itself.
    """

    def __init__(self, url: str | None, model: str, *, embedder: Embedder | str | None = None,
                 **options: Any) -> None:
        self._init(LookupSettings(normalize_url(url), model, **options), embedder)

    @classmethod
    def from_settings(cls, settings: LookupSettings, *, embedder: Embedder | str | None = None
                      ) -> FeatureStoreLookup:
        self = cls.__new__(cls)
        self._init(settings, embedder)
        return self

    def _init(self, settings: LookupSettings, embedder: Embedder | str | None) -> None:
        self.settings = settings
        self.runtime = LookupRuntime(settings)
        self.semantic = SemanticLookup(self.runtime, embedder)
        self.exact = ExactLookup(self.runtime, self.semantic)
        self.stats = LookupStats(self.runtime)

    @classmethod
    def from_spec(
        cls,
        spec: FeatureStoreSpec | None,
        model: str,
        *,
        run_dir: str | Path | None = None,
        embedder: Embedder | str | None = None,
        **options: Any,
    ) -> FeatureStoreLookup:
        """From an InferenceService's `spec.featureStore` (url, semanticThreshold, lookupTimeoutMs)."""
        url = spec.url if spec and spec.url else _default_url(run_dir)
        if spec is not None:
            options.setdefault("semantic_threshold", spec.semantic_threshold)
            options.setdefault("timeout_ms", spec.lookup_timeout_ms)
        return cls(url, model, embedder=embedder, **options)

    # --- settings the callers read (and tests adjust) ---------------------------------------------------

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def timeout_s(self) -> float:
        return self.settings.timeout_s

    @property
    def semantic_threshold(self) -> float:
        return self.settings.semantic_threshold

    @semantic_threshold.setter
    def semantic_threshold(self, value: float) -> None:
        self.settings.semantic_threshold = value

    @property
    def index_size(self) -> int:
        return self.semantic.index_size

    # --- public API -------------------------------------------------------------------------------------

    async def lookup(self, tenant: str, endpoint: str, body: dict[str, Any]) -> LookupResult | None:
        """A precomputed response for this request, or None (miss, timeout, error: go to the model)."""
        rt = self.runtime
        m = rt.metrics
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
            version = rt.fresh_version(time.time())
            if version is not None:
                hit = rt.cached((version[0], version[2], tenant, phash, pk), time.time())
                if hit is not None:
                    kind, result = hit.kind, "hit" if hit.body is not None else "miss"
                    return _result(hit)
            if time.monotonic() < rt.backoff_until:
                raise FailOpen("backoff")
            cached = await self.exact.lookup(tenant, text, phash, pk, time.monotonic() + self.settings.timeout_s)
            if cached is None:
                return None
            kind, result = cached.kind, "hit" if cached.body is not None else "miss"
            return _result(cached)
        except FailOpen as o:
            kind, result = "none", "error"
            m.errors.labels(o.reason).inc()
            return None
        finally:
            m.lookups.labels(kind, result).inc()
            m.lookup_seconds.observe(time.perf_counter() - t0)
            self.stats.count(tenant, kind, result)

    async def warmup(self) -> bool:
        """Connect, resolve the model version, load the embedder and build the vector index (no deadline).

        Returns False (and counts the reason) instead of raising when the store is not usable yet; lookups
        then keep failing open until it is.
        """
        errors = self.runtime.metrics.errors
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.runtime.pool(), self._warmup_sync)
        except FailOpen as o:
            errors.labels(o.reason).inc()
            return False
        except SQLAlchemyError:
            errors.labels("db_error").inc()
            return False
        except (ImportError, OSError, ValueError):
            errors.labels("embedder").inc()
            return False
        return True

    async def close(self) -> None:
        if self.runtime.closed:
            return
        self.runtime.closed = True
        await self.exact.aclose()
        await self.stats.close()
        self.runtime.shutdown()

    def drop_connections(self) -> None:
        """Close every pooled connection now (tests: what a database restart does to open handles)."""
        if self.exact.reader is not None:
            self.exact.reader.close()
        if self.runtime.engine is not None:
            self.runtime.engine.dispose()

    def _warmup_sync(self) -> None:
        with self.runtime.eng().connect() as conn:
            self.runtime.resolve_version(conn)
        if self.settings.semantic:
            self.semantic.warm()


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
