"""The schema (SQLAlchemy 2 declarative). alembic migrations in `migrations/versions` create the same tables.

Times are UNIX seconds (double precision): cheap to compare in both backends and in Python.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets BIGINT (1M+ rows per table are expected).
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Model(Base):
    """A served model name (the OpenAI `model` field) and its current version."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    current_version_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("model_versions.id", use_alter=True, name="fk_models_current_version"), nullable=True
    )
    updated_at: Mapped[float] = mapped_column(Float)


class ModelVersion(Base):
    """One version of a model (e.g. its weights path or digest). Making another one current invalidates
    every response made by the others."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version", name="uq_model_versions_model_version"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(BigId, ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[float] = mapped_column(Float)


class PromptFeature(Base):
    """A distinct normalized prompt of one tenant to one model, with what the request log says about it."""

    __tablename__ = "prompt_features"
    __table_args__ = (
        UniqueConstraint("tenant", "model", "prompt_hash", name="uq_prompt_features_key"),
        Index("ix_prompt_features_head", "model", "frequency"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(255))
    model: Mapped[str] = mapped_column(String(255))
    prompt_hash: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)  # normalized prompt (what gets embedded)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"prompt"|"messages", "params"}: replayed to precompute
    token_count: Mapped[int] = mapped_column(Integer)
    prefix_blocks: Mapped[list[str]] = mapped_column(JSON)  # chained prefix-block hashes (normalize.py)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    frequency: Mapped[int] = mapped_column(BigInteger)


class Embedding(Base):
    """The sentence embedding of one prompt feature under one embedding model (float32, L2-normalized)."""

    __tablename__ = "embeddings"
    __table_args__ = (UniqueConstraint("feature_id", "embedder", name="uq_embeddings_feature_embedder"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)  # the index reads id > last
    feature_id: Mapped[int] = mapped_column(BigId, ForeignKey("prompt_features.id", ondelete="CASCADE"))
    embedder: Mapped[str] = mapped_column(String(255))
    dim: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)


class Response(Base):
    """A response precomputed by one model version for one prompt and sampling-parameter set."""

    __tablename__ = "responses"
    __table_args__ = (
        UniqueConstraint("tenant", "prompt_hash", "model_version_id", "params_hash", name="uq_responses_key"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(255))
    prompt_hash: Mapped[str] = mapped_column(String(64))
    model_version_id: Mapped[int] = mapped_column(BigId, ForeignKey("model_versions.id", ondelete="CASCADE"))
    params_hash: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    response: Mapped[str] = mapped_column(Text)  # the OpenAI response body, JSON text
    created_at: Mapped[float] = mapped_column(Float)
    ttl_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    invalidated_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class LookupStat(Base):
    """Online lookup outcomes, aggregated per hour (flushed by the lookup client in the background)."""

    __tablename__ = "lookup_stats"
    __table_args__ = (
        UniqueConstraint("tenant", "model", "bucket_start", "kind", "result", name="uq_lookup_stats_key"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(255))
    model: Mapped[str] = mapped_column(String(255))
    bucket_start: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    result: Mapped[str] = mapped_column(String(16))
    count: Mapped[int] = mapped_column(BigInteger)


class LogProgress(Base):
    """How far a request log has been ingested: committed in the same transaction as the features it added,
    so a crash loses nothing and a rerun counts nothing twice."""

    __tablename__ = "log_progress"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the log's path and first line
    path: Mapped[str] = mapped_column(Text)
    offset: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[float] = mapped_column(Float)
