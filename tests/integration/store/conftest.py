"""Fixtures of the feature-store integration tests: every store test runs against SQLite and PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.store.pgtemp import PostgresUnavailableError, TempPostgres, find_bin_dir
from llmfleet.testing.fake_openai import FakeOpenAI


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TempPostgres]:
    if find_bin_dir() is None and not os.environ.get("LLMFLEET_REQUIRE_POSTGRES"):
        pytest.skip("PostgreSQL binaries not installed (apt-get install postgresql; make test does when it may)")
    try:
        pg = TempPostgres().start()
    except PostgresUnavailableError as e:
        pytest.fail(str(e))
    yield pg
    pg.cleanup()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database (no schema yet)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store' / 'featurestore.db'}"
        return
    pg: TempPostgres = request.getfixturevalue("pg_server")
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = pg.create_database(name)
    yield url
    pg.drop_database(name)


@pytest.fixture
def migrated_url(store_url: str) -> str:
    from llmfleet.store import db

    db.upgrade(store_url)
    return store_url


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()
