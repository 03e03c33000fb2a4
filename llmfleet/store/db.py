"""Engines, migrations and the one dialect-specific bit (upserts) for SQLite and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from llmfleet.api.contracts import FEATURE_STORE_DB_FILE

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
DB_FILE = FEATURE_STORE_DB_FILE


class StoreConfigError(ValueError):
    """A bad database URL or an unsupported backend."""


def run_dir() -> Path:
    """The embedded runtime's state folder (LLMFLEET_RUN_DIR, default ./.run)."""
    return Path(os.environ.get("LLMFLEET_RUN_DIR", ".run"))


def default_url(folder: str | Path | None = None) -> str:
    """SQLite file in the run folder: the embedded default."""
    path = Path(folder) if folder is not None else run_dir()
    return f"sqlite:///{(path / DB_FILE).resolve()}"


def normalize_url(url: str | None) -> str:
    """Fill in the default and the psycopg 3 driver for bare postgresql:// URLs."""
    if not url:
        return default_url()
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as e:  # make_url's two ways of saying "not a URL"
        raise StoreConfigError(f"invalid database URL {url!r}: {e}") from e
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StoreConfigError(f"unsupported database {backend!r}: use sqlite:/// or postgresql+psycopg://")
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def redacted(url: str) -> str:
    """The URL with its password hidden (for messages)."""
    return make_url(url).render_as_string(hide_password=True)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers never block the writer and vice versa; NORMAL sync is durable across process crashes.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(
    url: str | None,
    *,
    connect_timeout_s: float = 5.0,
    pool_size: int = 4,
    writer: bool = False,
    autocommit: bool = False,
) -> Engine:
    """An engine with WAL + busy timeout on SQLite and a connect timeout on PostgreSQL.

    `writer=True` on SQLite starts every transaction with BEGIN IMMEDIATE: a transaction that reads and then
    writes takes the write lock up front (waiting up to busy_timeout) instead of failing with "database is
    locked" when another writer got there between its read and its write.
    `autocommit=True` (the online lookups: single reads) saves the BEGIN and the ROLLBACK on connection
    return, i.e. two of the three round trips of a PostgreSQL lookup.
    """
    extra: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        _ensure_dir(url)
        engine = create_engine(
            url,
            connect_args={"timeout": 30, "check_same_thread": False},
            pool_size=pool_size,
            max_overflow=pool_size,
            **extra,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        if writer:
            _begin_immediate(engine)
        return engine
    return create_engine(
        url,
        connect_args={"connect_timeout": max(1, int(connect_timeout_s))},
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=False,
        pool_recycle=1800,
        **extra,
    )


def _begin_immediate(engine: Engine) -> None:
    # The SQLAlchemy recipe: turn off pysqlite's own BEGIN handling and emit ours.
    @event.listens_for(engine, "connect")
    def _no_autobegin(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _ensure_dir(url: str) -> None:
    db = make_url(url).database
    if db and db != ":memory:" and not db.startswith("file:"):
        Path(db).parent.mkdir(parents=True, exist_ok=True)


def make_nullpool_engine(url: str | None) -> Engine:
    """For alembic: one connection, closed afterwards."""
    url = normalize_url(url)
    if make_url(url).get_backend_name() == "sqlite":
        _ensure_dir(url)
    engine = create_engine(url, poolclass=NullPool)
    if make_url(url).get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def alembic_config(url: str | None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str | None, revision: str = "head") -> None:
    """Apply migrations up to `revision` (idempotent)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current_revision(url: str | None) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = make_nullpool_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def dialect_insert(engine_or_name: Engine | str, table: Table) -> Any:
    """INSERT that supports .on_conflict_do_update/.on_conflict_do_nothing on both backends."""
    name = engine_or_name if isinstance(engine_or_name, str) else engine_or_name.dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise StoreConfigError(f"unsupported database dialect {name!r}")
