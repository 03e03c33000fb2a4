"""Writes and offline reads of the feature store (sync SQLAlchemy Core, one short transaction each)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, and_, func, or_, select, update

from llmfleet.store.db import dialect_insert
from llmfleet.store.models import Embedding, LogProgress, Model, ModelVersion, PromptFeature, Response

features_t = cast(Table, PromptFeature.__table__)
embeddings_t = cast(Table, Embedding.__table__)
responses_t = cast(Table, Response.__table__)
models_t = cast(Table, Model.__table__)
versions_t = cast(Table, ModelVersion.__table__)
progress_t = cast(Table, LogProgress.__table__)


class ProgressConflictError(RuntimeError):
    """Another process ingested the same log range first; re-read the progress and continue from there."""


@dataclass
class FeatureAgg:
    """What one batch of the log says about one (tenant, model, prompt hash)."""

    tenant: str
    model: str
    prompt_hash: str
    endpoint: str
    text: str
    request: dict[str, Any]
    token_count: int
    prefix_blocks: list[str]
    first_seen: float
    last_seen: float
    frequency: int = 0


@dataclass
class VersionChange:
    model: str
    version: str
    version_id: int
    changed: bool
    invalidated: int = 0


def set_current_version(engine: Engine, model: str, version: str) -> VersionChange:
    """Make `version` current for `model`; responses made by every other version are invalidated."""
    now = time.time()
    with engine.begin() as conn:
        ins = dialect_insert(conn.dialect.name, models_t)
        conn.execute(ins.values(name=model, updated_at=now).on_conflict_do_nothing(index_elements=["name"]))
        q = select(models_t.c.id, models_t.c.current_version_id).where(models_t.c.name == model)
        if conn.dialect.name == "postgresql":
            q = q.with_for_update()  # serialize concurrent version changes of one model
        model_id, current = conn.execute(q).one()
        ins = dialect_insert(conn.dialect.name, versions_t)
        conn.execute(
            ins.values(model_id=model_id, version=version, created_at=now).on_conflict_do_nothing(
                index_elements=["model_id", "version"]
            )
        )
        vid = conn.execute(
            select(versions_t.c.id).where(versions_t.c.model_id == model_id, versions_t.c.version == version)
        ).scalar_one()
        if current == vid:
            return VersionChange(model, version, vid, changed=False)
        conn.execute(update(models_t).where(models_t.c.id == model_id).values(current_version_id=vid, updated_at=now))
        others = select(versions_t.c.id).where(versions_t.c.model_id == model_id, versions_t.c.id != vid)
        res = conn.execute(
            update(responses_t)
            .where(responses_t.c.model_version_id.in_(others), responses_t.c.invalidated_at.is_(None))
            .values(invalidated_at=now)
        )
        return VersionChange(model, version, vid, changed=True, invalidated=res.rowcount or 0)


def current_version(conn: Connection, model: str) -> tuple[int, str] | None:
    row = conn.execute(
        select(versions_t.c.id, versions_t.c.version)
        .select_from(models_t.join(versions_t, models_t.c.current_version_id == versions_t.c.id))
        .where(models_t.c.name == model)
    ).first()
    return (int(row[0]), str(row[1])) if row else None


def log_offset(engine: Engine, source: str) -> tuple[int, int]:
    """(byte offset, lines) already ingested from the log whose first line hashes to `source`."""
    with engine.connect() as conn:
        row = conn.execute(select(progress_t.c.offset, progress_t.c.lines).where(progress_t.c.source == source)).first()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def ingest_batch(
    engine: Engine,
    *,
    source: str,
    path: str,
    start_offset: int,
    end_offset: int,
    lines: int,
    features: Iterable[FeatureAgg],
) -> None:
    """Upsert one batch of features and move the log's offset, atomically.

    The offset is checked inside the transaction (row lock on PostgreSQL, BEGIN IMMEDIATE on SQLite): if it
    moved since the batch was read, another process already counted these lines and the batch is dropped.
    """
    now = time.time()
    with engine.begin() as conn:
        name = conn.dialect.name
        # Make sure the row exists so that the lock below has something to lock (a concurrent first insert
        # of the same source waits here for the other transaction, then does nothing).
        conn.execute(
            dialect_insert(name, progress_t)
            .values(source=source, path=path, offset=0, lines=0, updated_at=now)
            .on_conflict_do_nothing(index_elements=["source"])
        )
        q = select(progress_t.c.offset, progress_t.c.lines).where(progress_t.c.source == source)
        row = conn.execute(q.with_for_update() if name == "postgresql" else q).first()
        done = int(row[0]) if row else 0
        if done != start_offset:
            raise ProgressConflictError(f"log {path}: offset is {done}, batch starts at {start_offset}")
        # Sorted by key: concurrent PostgreSQL upserts then lock rows in one order and cannot deadlock.
        rows = sorted((f.__dict__ for f in features), key=lambda r: (r["tenant"], r["model"], r["prompt_hash"]))
        if rows:
            ins = dialect_insert(name, features_t)
            excl = ins.excluded
            conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["tenant", "model", "prompt_hash"],
                    set_={
                        "frequency": features_t.c.frequency + excl.frequency,
                        "first_seen": func.min(features_t.c.first_seen, excl.first_seen)
                        if name == "sqlite"
                        else func.least(features_t.c.first_seen, excl.first_seen),
                        "last_seen": func.max(features_t.c.last_seen, excl.last_seen)
                        if name == "sqlite"
                        else func.greatest(features_t.c.last_seen, excl.last_seen),
                        "token_count": excl.token_count,
                        "request": excl.request,
                    },
                ),
                rows,
            )
        total = (int(row[1]) if row else 0) + lines
        conn.execute(
            update(progress_t)
            .where(progress_t.c.source == source)
            .values(offset=end_offset, lines=total, path=path, updated_at=now)
        )


def features_without_embedding(
    engine: Engine, embedder: str, *, after_id: int = 0, limit: int = 256, model: str | None = None
) -> list[tuple[int, str]]:
    """(feature id, text) of features with no embedding under `embedder`, by id, after `after_id`."""
    missing = ~select(embeddings_t.c.id).where(
        embeddings_t.c.feature_id == features_t.c.id, embeddings_t.c.embedder == embedder
    ).exists()
    q = select(features_t.c.id, features_t.c.text).where(features_t.c.id > after_id, missing)
    if model:
        q = q.where(features_t.c.model == model)
    with engine.connect() as conn:
        return [(int(i), str(t)) for i, t in conn.execute(q.order_by(features_t.c.id).limit(limit))]


def save_embeddings(engine: Engine, embedder: str, ids: Sequence[int], vectors: Any) -> int:
    """Insert float32 vectors (one row of `vectors` per feature id); existing ones are kept."""
    now = time.time()
    dim = int(vectors.shape[1])
    rows = [
        {"feature_id": int(i), "embedder": embedder, "dim": dim, "vector": v.astype("<f4").tobytes(), "created_at": now}
        for i, v in zip(ids, vectors, strict=True)
    ]
    if not rows:
        return 0
    with engine.begin() as conn:
        ins = dialect_insert(conn.dialect.name, embeddings_t)
        conn.execute(ins.on_conflict_do_nothing(index_elements=["feature_id", "embedder"]), rows)
    return len(rows)


@dataclass
class HeadPrompt:
    feature_id: int
    tenant: str
    prompt_hash: str
    endpoint: str
    request: dict[str, Any]
    frequency: int
    params_hash: str = field(default="")


def head_prompts(engine: Engine, model: str, min_frequency: int, limit: int | None = None) -> list[HeadPrompt]:
    """Prompts of `model` seen at least `min_frequency` times, most frequent first."""
    from llmfleet.store.normalize import params_hash

    q = (
        select(
            features_t.c.id,
            features_t.c.tenant,
            features_t.c.prompt_hash,
            features_t.c.endpoint,
            features_t.c.request,
            features_t.c.frequency,
        )
        .where(features_t.c.model == model, features_t.c.frequency >= min_frequency)
        .order_by(features_t.c.frequency.desc(), features_t.c.id)
    )
    if limit:
        q = q.limit(limit)
    with engine.connect() as conn:
        out = [HeadPrompt(int(r[0]), r[1], r[2], r[3], dict(r[4]), int(r[5])) for r in conn.execute(q)]
    for h in out:
        h.params_hash = params_hash(h.request.get("params"))
    return out


def valid_response_keys(engine: Engine, version_id: int, now: float | None = None) -> set[tuple[str, str, str]]:
    """(tenant, prompt hash, params hash) of the live responses of one model version."""
    now = time.time() if now is None else now
    q = select(responses_t.c.tenant, responses_t.c.prompt_hash, responses_t.c.params_hash).where(
        responses_t.c.model_version_id == version_id,
        responses_t.c.invalidated_at.is_(None),
        or_(responses_t.c.expires_at.is_(None), responses_t.c.expires_at > now),
    )
    with engine.connect() as conn:
        return {(r[0], r[1], r[2]) for r in conn.execute(q)}


def save_response(
    engine: Engine,
    *,
    tenant: str,
    prompt_hash: str,
    version_id: int,
    params: dict[str, Any],
    params_hash: str,
    response: str,
    ttl_seconds: float | None,
) -> None:
    """Store one response. A live one with the same key is kept (no duplicates); a stale one is replaced."""
    now = time.time()
    values = {
        "tenant": tenant,
        "prompt_hash": prompt_hash,
        "model_version_id": version_id,
        "params_hash": params_hash,
        "params": params,
        "response": response,
        "created_at": now,
        "ttl_seconds": ttl_seconds,
        "expires_at": now + ttl_seconds if ttl_seconds else None,
        "invalidated_at": None,
    }
    with engine.begin() as conn:
        ins = dialect_insert(conn.dialect.name, responses_t).values(**values)
        stale = or_(
            responses_t.c.invalidated_at.is_not(None),
            and_(responses_t.c.expires_at.is_not(None), responses_t.c.expires_at <= now),
        )
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=["tenant", "prompt_hash", "model_version_id", "params_hash"],
                set_={k: ins.excluded[k] for k in ("response", "params", "created_at", "ttl_seconds", "expires_at",
                                                    "invalidated_at")},
                where=stale,
            )
        )


def counts(engine: Engine) -> dict[str, int]:
    """Row counts per table (for `llmfleet features stats` and tests)."""
    out = {}
    with engine.connect() as conn:
        for t in (features_t, embeddings_t, responses_t, models_t, versions_t):
            out[t.name] = int(conn.execute(select(func.count()).select_from(t)).scalar_one())
        out["live_responses"] = int(
            conn.execute(
                select(func.count()).select_from(responses_t).where(responses_t.c.invalidated_at.is_(None))
            ).scalar_one()
        )
    return out
