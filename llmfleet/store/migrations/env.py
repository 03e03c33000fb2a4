"""alembic environment of the feature store (run through llmfleet.store.db.upgrade/downgrade)."""

from __future__ import annotations

from alembic import context

from llmfleet.store.db import make_nullpool_engine
from llmfleet.store.models import Base

target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = make_nullpool_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


def run_migrations_offline() -> None:
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
