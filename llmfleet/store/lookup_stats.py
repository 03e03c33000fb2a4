"""Per-tenant lookup counts, flushed to `lookup_stats` in hourly buckets (in the background, never in a
lookup's deadline)."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from sqlalchemy import Table
from sqlalchemy.exc import SQLAlchemyError

from llmfleet.store.db import dialect_insert
from llmfleet.store.lookup_runtime import LookupRuntime
from llmfleet.store.models import LookupStat

_S = cast(Table, LookupStat.__table__)


class LookupStats:
    """Counts (tenant, kind, result) in memory and upserts them every `stats_flush_s`."""

    def __init__(self, runtime: LookupRuntime) -> None:
        self.runtime = runtime
        self.counts: dict[tuple[str, str, str], int] = {}
        self.flushed_at = time.time()

    def _may_flush(self) -> bool:
        rt = self.runtime
        return rt.engine is not None or rt.db_used

    def count(self, tenant: str, kind: str, result: str) -> None:
        key = (tenant, kind, result)
        self.counts[key] = self.counts.get(key, 0) + 1
        due = time.time() - self.flushed_at > self.runtime.settings.stats_flush_s
        if due and self._may_flush() and not self.runtime.closed:
            self.flushed_at = time.time()
            self.runtime.pool().submit(self._flush_safe)

    async def close(self) -> None:
        """Flush what is left (bounded): only when a lookup ever reached the database."""
        rt = self.runtime
        if rt.engine is not None or (rt.db_used and self.counts):
            try:
                await asyncio.wait_for(asyncio.to_thread(self.flush), timeout=2.0)
            except (TimeoutError, SQLAlchemyError):
                rt.metrics.errors.labels("stats_flush").inc()

    def _flush_safe(self) -> None:
        try:
            self.flush()
        except SQLAlchemyError:
            self.runtime.metrics.errors.labels("stats_flush").inc()

    def flush(self) -> None:
        stats, self.counts = self.counts, {}
        if not stats:
            return
        bucket = float(int(time.time() // 3600) * 3600)
        model = self.runtime.settings.model
        rows = [
            {"tenant": t, "model": model, "bucket_start": bucket, "kind": k, "result": r, "count": n}
            for (t, k, r), n in stats.items()
        ]
        with self.runtime.eng().begin() as conn:
            ins = dialect_insert(conn.dialect.name, _S)
            conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["tenant", "model", "bucket_start", "kind", "result"],
                    set_={"count": _S.c.count + ins.excluded.count},
                ),
                rows,
            )
