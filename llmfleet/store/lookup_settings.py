"""Settings of the router's feature-store lookups: one object instead of a long constructor."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.store.db import normalize_url

PG_DRIVERS = (None, "asyncpg", "psycopg")


@dataclass
class LookupSettings:
    """What a FeatureStoreLookup is configured with. Mutable on purpose: the parts of one lookup share this
    object, so a change (e.g. `semantic_threshold`) reaches all of them."""

    url: str
    """SQLAlchemy URL of the store (normalized: psycopg for PostgreSQL)."""
    model: str
    """Served model name the lookups are scoped to."""
    model_version: str | None = None
    """Pin one version; None follows the model's current version."""
    semantic_threshold: float = 0.92
    """Minimum cosine similarity of a semantic hit."""
    timeout_ms: float = 20.0
    """Deadline of one lookup."""
    semantic: bool = True
    """Try a semantic lookup after an exact miss."""
    cache_size: int = 10_000
    """Entries of the in-process LRU (hits and misses)."""
    negative_ttl_s: float = 5.0
    """How long an exact miss is remembered."""
    version_refresh_s: float = 5.0
    """How long the resolved model version is trusted."""
    index_refresh_s: float = 10.0
    """How often the vector index picks up new embeddings."""
    error_backoff_s: float = 1.0
    """After a database error, lookups fail open without trying for this long."""
    stats_flush_s: float = 30.0
    """How often the per-tenant lookup counts are written to the store."""
    max_workers: int = 4
    """Thread-pool lookups in flight at once (one more thread runs background work)."""
    fast_path: bool = True
    """Exact lookups on the event loop (fastpath.py); False runs them in the thread pool."""
    sqlite_on_loop_ms: float = 2.0
    """Budget of one SQLite query on the event loop before it falls back to the thread pool."""
    pg_driver: str | None = None
    """PostgreSQL client of the fast path: 'asyncpg', 'psycopg', or None (asyncpg when installed)."""

    def __post_init__(self) -> None:
        self.url = normalize_url(self.url)
        if self.pg_driver not in PG_DRIVERS:
            raise ValueError(f"pg_driver must be 'asyncpg' or 'psycopg', not {self.pg_driver!r}")

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000.0

    @property
    def sqlite_on_loop_s(self) -> float:
        return self.sqlite_on_loop_ms / 1000.0
