"""initial schema: models, versions, prompt features, embeddings, responses, lookup stats, log progress

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("current_version_id", BigId, nullable=True),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("model_id", BigId, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
        sa.Column("version", sa.String(512), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("model_id", "version", name="uq_model_versions_model_version"),
    )
    with op.batch_alter_table("models") as batch:
        batch.create_foreign_key(
            "fk_models_current_version", "model_versions", ["current_version_id"], ["id"]
        )
    op.create_table(
        "prompt_features",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("prompt_hash", sa.String(64), nullable=False),
        sa.Column("endpoint", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("token_count", sa.Integer, nullable=False),
        sa.Column("prefix_blocks", sa.JSON, nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("frequency", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("tenant", "model", "prompt_hash", name="uq_prompt_features_key"),
    )
    op.create_index("ix_prompt_features_head", "prompt_features", ["model", "frequency"])
    op.create_table(
        "embeddings",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("feature_id", BigId, sa.ForeignKey("prompt_features.id", ondelete="CASCADE"), nullable=False),
        sa.Column("embedder", sa.String(255), nullable=False),
        sa.Column("dim", sa.Integer, nullable=False),
        sa.Column("vector", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("feature_id", "embedder", name="uq_embeddings_feature_embedder"),
    )
    op.create_table(
        "responses",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("prompt_hash", sa.String(64), nullable=False),
        sa.Column(
            "model_version_id", BigId, sa.ForeignKey("model_versions.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("params_hash", sa.String(32), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("response", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("ttl_seconds", sa.Float, nullable=True),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("invalidated_at", sa.Float, nullable=True),
        sa.UniqueConstraint("tenant", "prompt_hash", "model_version_id", "params_hash", name="uq_responses_key"),
    )
    op.create_table(
        "lookup_stats",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("bucket_start", sa.Float, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("tenant", "model", "bucket_start", "kind", "result", name="uq_lookup_stats_key"),
    )
    op.create_table(
        "log_progress",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("source", sa.String(64), nullable=False, unique=True),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("lines", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("log_progress")
    op.drop_table("lookup_stats")
    op.drop_table("responses")
    op.drop_table("embeddings")
    op.drop_index("ix_prompt_features_head", table_name="prompt_features")
    op.drop_table("prompt_features")
    with op.batch_alter_table("models") as batch:
        batch.drop_constraint("fk_models_current_version", type_="foreignkey")
    op.drop_table("model_versions")
    op.drop_table("models")
