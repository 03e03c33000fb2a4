"""The exact-lookup fast path (on the event loop) against real SQLite and PostgreSQL: same answers as the
thread path, the same scoping, TTL and fail-open behaviour, an index point query, a bounded pool."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, select, update

from llmfleet.store import db, repo
from llmfleet.store.fastpath import AsyncpgReader, PostgresReader, SqliteReader, exact_query_plan
from llmfleet.store.lookup import FeatureStoreLookup
from llmfleet.store.models import LookupStat
from llmfleet.store.normalize import normalized_prompt, params_hash, prompt_hash, split_request
from llmfleet.testing.fake_openai import chat_body

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _key(body: dict[str, Any]) -> tuple[str, str]:
    _, messages, params = split_request("chat", body)
    return prompt_hash("chat", normalized_prompt("chat", None, messages)), params_hash(params)


def _save(engine: Engine, tenant: str, body: dict[str, Any], version_id: int, answer: str,
          ttl: float | None = None) -> None:
    phash, pk = _key(body)
    params = split_request("chat", body)[2]
    repo.save_response(engine, tenant=tenant, prompt_hash=phash, version_id=version_id, params=params,
                       params_hash=pk, response=json.dumps({"answer": answer}), ttl_seconds=ttl)


def _store(url: str, **kw: Any) -> FeatureStoreLookup:
    kw = {"semantic": False, "timeout_ms": 3000, "cache_size": 0, "negative_ttl_s": 0, "version_refresh_s": 0} | kw
    return FeatureStoreLookup(url, "tiny", **kw)


QUERIES = [
    ("acme", chat_body("what is two plus two")),
    ("acme", chat_body("what   is two plus two ")),  # normalizes to the same key
    ("acme", chat_body("what is two plus two", max_tokens=99)),  # other sampling parameters: no response
    ("globex", chat_body("what is two plus two")),  # other tenant: its own answer
    ("initech", chat_body("what is two plus two")),  # a tenant without one
    ("acme", chat_body("name a colour")),
    ("acme", chat_body("never generated")),
]


@pytest.fixture
def populated(migrated_url: str) -> tuple[str, Engine, int]:
    engine = db.make_engine(migrated_url, writer=True)
    vid = repo.set_current_version(engine, "tiny", "v1").version_id
    _save(engine, "acme", chat_body("what is two plus two"), vid, "four")
    _save(engine, "globex", chat_body("what is two plus two"), vid, "vier")
    _save(engine, "acme", chat_body("name a colour"), vid, "blue", ttl=3600)
    return migrated_url, engine, vid


def _pg(driver: str) -> object:
    return pytest.param("postgresql", driver, marks=pytest.mark.postgres, id=f"postgresql-{driver}")


# Each test names the backends (store_url, conftest.py) and PostgreSQL clients it is about, so a combination
# that does not apply is not generated (rather than generated and skipped).
EVERY_BACKEND = pytest.mark.parametrize(  # the PostgreSQL client does not matter for SQLite
    ("store_url", "driver"), [pytest.param("sqlite", "asyncpg", id="sqlite"), _pg("asyncpg"), _pg("psycopg")],
    indirect=["store_url"],
)
POSTGRES_ONLY = pytest.mark.parametrize(
    ("store_url", "driver"), [_pg("asyncpg"), _pg("psycopg")], indirect=["store_url"]
)
SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


@EVERY_BACKEND
async def test_fast_path_answers_like_the_thread_path(populated: tuple[str, Engine, int], driver: str) -> None:
    url, engine, _ = populated
    fast, slow = _store(url, pg_driver=driver), _store(url, fast_path=False)
    hits_before = _sample("llmfleet_store_lookups_total", kind="exact", result="hit")
    got_fast = [await fast.lookup(t, "chat", b) for t, b in QUERIES]
    got_slow = [await slow.lookup(t, "chat", b) for t, b in QUERIES]
    answers = [r.response["answer"] if r else None for r in got_fast]
    assert answers == ["four", "four", None, "vier", None, "blue", None]
    strip = [(r.kind, r.response, r.prompt_hash, r.model_version, r.similarity) if r else None for r in got_fast]
    assert strip == [(r.kind, r.response, r.prompt_hash, r.model_version, r.similarity) if r else None
                     for r in got_slow]
    assert _sample("llmfleet_store_lookups_total", kind="exact", result="hit") == hits_before + 8
    # The fast path answered on the event loop: it never started the worker threads.
    assert fast.runtime.executor is None and slow.runtime.executor is not None
    await fast.close()
    await slow.close()
    # close() flushed the counts although the fast path never created the SQLAlchemy engine.
    with engine.connect() as conn:
        stats = {(r.tenant, r.kind, r.result): r.count for r in conn.execute(select(LookupStat.__table__))}
    assert stats[("acme", "exact", "hit")] == 2 * 3 and stats[("initech", "exact", "miss")] == 2
    engine.dispose()


async def test_ttl_invalidation_and_pinned_version(populated: tuple[str, Engine, int]) -> None:
    url, engine, vid = populated
    store = _store(url)
    assert (await store.lookup("acme", "chat", chat_body("name a colour"))) is not None
    with engine.begin() as conn:  # the response expires
        conn.execute(update(repo.responses_t).where(repo.responses_t.c.ttl_seconds.is_not(None))
                     .values(expires_at=time.time() - 1))
    assert await store.lookup("acme", "chat", chat_body("name a colour")) is None
    # A new current version invalidates v1's responses; v2's own answer is served, tagged v2.
    v2 = repo.set_current_version(engine, "tiny", "v2").version_id
    assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is None
    _save(engine, "acme", chat_body("what is two plus two"), v2, "4")
    hit = await store.lookup("acme", "chat", chat_body("what is two plus two"))
    assert hit is not None and hit.response == {"answer": "4"} and hit.model_version == "v2"
    # A client pinned to v1 sees nothing (invalidated); pinned to an unknown version it fails open, counted.
    pinned = _store(url, model_version="v1")
    assert await pinned.lookup("acme", "chat", chat_body("what is two plus two")) is None
    before = _sample("llmfleet_store_lookup_errors_total", reason="no_model_version")
    unknown = _store(url, model_version="v9")
    assert await unknown.lookup("acme", "chat", chat_body("what is two plus two")) is None
    assert _sample("llmfleet_store_lookup_errors_total", reason="no_model_version") == before + 1
    for s in (store, pinned, unknown):
        await s.close()
    engine.dispose()


async def test_lru_keyed_by_version_on_the_fast_path(populated: tuple[str, Engine, int]) -> None:
    url, engine, _ = populated
    store = _store(url, cache_size=100, version_refresh_s=0.0)
    assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is not None
    hits = _sample("llmfleet_store_cache_hits_total")
    assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is not None
    assert _sample("llmfleet_store_cache_hits_total") == hits + 1  # resolved the version, then the LRU answered
    repo.set_current_version(engine, "tiny", "v2")
    assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is None
    await store.close()
    engine.dispose()


async def test_exact_query_is_an_index_point_lookup(populated: tuple[str, Engine, int]) -> None:
    url, engine, vid = populated
    phash, pk = _key(chat_body("what is two plus two"))
    plan = await exact_query_plan(url, {"vid": vid, "tenant": "acme", "phash": phash, "pk": pk, "now": time.time()},
                                  no_seqscan=True)
    if url.startswith("sqlite"):
        # SQLite names the index of the uq_responses_key constraint sqlite_autoindex_responses_N.
        assert "USING INDEX sqlite_autoindex_responses" in plan and "tenant=? AND prompt_hash=?" in plan, plan
    else:
        # The generic plan of the prepared statement: the parameter types must let the unique index serve it.
        assert "Index Scan using uq_responses_key" in plan and "$2" in plan, plan
    engine.dispose()


@POSTGRES_ONLY  # SQLite: see test_sqlite_lock_falls_back_then_times_out
async def test_postgres_deadline_discards_the_connection(populated: tuple[str, Engine, int], driver: str) -> None:
    url, engine, _ = populated
    import psycopg

    store = _store(url, timeout_ms=200, pg_driver=driver)
    assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is not None
    before = _sample("llmfleet_store_lookup_errors_total", reason="timeout")
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(conninfo) as locker:
        await locker.execute("LOCK TABLE responses IN ACCESS EXCLUSIVE MODE")  # every SELECT now waits
        t0 = time.perf_counter()
        assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is None
        assert time.perf_counter() - t0 < 1.5
        assert _sample("llmfleet_store_lookup_errors_total", reason="timeout") == before + 1
        await locker.rollback()
    # The interrupted connection was thrown away, not reused mid-query: the next lookup works.
    assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is not None
    await store.close()
    engine.dispose()


@POSTGRES_ONLY  # the SQLite fast path has one connection and no awaits
async def test_postgres_pool_is_bounded_under_concurrency(populated: tuple[str, Engine, int], driver: str) -> None:
    url, engine, _ = populated
    store = _store(url, max_workers=2, pg_driver=driver)
    results = await asyncio.gather(*(store.lookup(t, "chat", b) for _ in range(10) for t, b in QUERIES))
    answers = [r.response["answer"] if r else None for r in results]
    assert answers == ["four", "four", None, "vier", None, "blue", None] * 10
    reader = store.exact.reader
    assert isinstance(reader, PostgresReader) and reader._opened <= 2 and not reader._waiters
    assert isinstance(reader, AsyncpgReader) == (driver == "asyncpg")
    await store.close()
    engine.dispose()


@SQLITE_ONLY  # PostgreSQL: see test_postgres_deadline_discards_the_connection
async def test_sqlite_lock_falls_back_then_times_out(populated: tuple[str, Engine, int]) -> None:
    url, engine, _ = populated
    engine.dispose()
    store = _store(url, timeout_ms=300)
    locked_before = _sample("llmfleet_store_fast_path_fallbacks_total", reason="locked")
    timeouts_before = _sample("llmfleet_store_lookup_errors_total", reason="timeout")
    # An exclusive-mode writer (it needs no other connection open to get there) shuts out WAL readers: the
    # fast path must not wait for it on the event loop; the thread path waits, until the deadline.
    locker = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    locker.execute("PRAGMA locking_mode=EXCLUSIVE")
    locker.execute("BEGIN EXCLUSIVE")
    try:
        t0 = time.perf_counter()
        assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is None
        assert time.perf_counter() - t0 < 2.0
        assert _sample("llmfleet_store_fast_path_fallbacks_total", reason="locked") == locked_before + 1
        assert _sample("llmfleet_store_lookup_errors_total", reason="timeout") == timeouts_before + 1
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert await store.lookup("acme", "chat", chat_body("what is two plus two")) is not None
    await store.close()
    engine.dispose()


@SQLITE_ONLY
async def test_sqlite_on_loop_budget_hands_over_to_the_thread_path(populated: tuple[str, Engine, int]) -> None:
    url, engine, _ = populated
    # A zero budget, checked at every step (a healthy point query is too short to reach the default check
    # interval): the progress handler interrupts the query on the loop, and the thread path answers.
    store = _store(url, sqlite_on_loop_ms=0)
    reader = store.exact.get_reader()
    assert isinstance(reader, SqliteReader)
    reader.progress_steps = 1
    before = _sample("llmfleet_store_fast_path_fallbacks_total", reason="budget")
    hit = await store.lookup("acme", "chat", chat_body("what is two plus two"))
    assert hit is not None and hit.response == {"answer": "four"}
    assert _sample("llmfleet_store_fast_path_fallbacks_total", reason="budget") == before + 1
    await store.close()
    engine.dispose()
