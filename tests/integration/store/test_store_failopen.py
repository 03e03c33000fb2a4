"""Lookups fail open: a stopped database or a missed deadline returns None quickly and is counted."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from llmfleet.store import db, generation, repo
from llmfleet.store.embeddings import HashingEmbedder
from llmfleet.store.lookup import FeatureStoreLookup
from llmfleet.store.pgtemp import TempPostgres, find_bin_dir
from llmfleet.testing.fake_openai import FakeOpenAI, chat_body, log_record, write_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _errors(reason: str) -> float:
    return REGISTRY.get_sample_value("llmfleet_store_lookup_errors_total", {"reason": reason}) or 0.0


async def _populate(url: str, tmp_path: Path, fake: FakeOpenAI, prompts: Sequence[str]) -> None:
    log = write_log(tmp_path / f"log-{uuid.uuid4().hex[:6]}.jsonl", [log_record(p) for p in prompts for _ in range(3)])
    engine = db.make_engine(url, writer=True)
    generation.ingest_log(engine, log)
    v = repo.set_current_version(engine, "tiny", "v1")
    generation.embed_features(engine, HashingEmbedder(64))
    await generation.precompute_responses(engine, model="tiny", version_id=v.version_id, endpoint_url=fake.url,
                                          min_frequency=3)
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def stoppable(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    """(url, stop(), start()) of a database this test alone may take down."""
    if request.param == "sqlite":
        folder = tmp_path / "db"
        url = f"sqlite:///{folder / 'featurestore.db'}"
        db.upgrade(url)
        yield url, lambda: folder.rename(tmp_path / "gone"), lambda: (tmp_path / "gone").rename(folder)
        return
    if find_bin_dir() is None:
        pytest.skip("PostgreSQL binaries not installed")
    # Durable commits: an immediate stop is a crash, and this server must keep what it acknowledged.
    pg = TempPostgres(fsync=True).start()
    url = pg.url()
    db.upgrade(url)
    yield url, lambda: pg.stop("immediate"), pg.restart
    pg.cleanup()


async def test_fail_open_on_stopped_database(stoppable, tmp_path: Path, fake_openai: FakeOpenAI) -> None:  # type: ignore[no-untyped-def]
    url, stop, start = stoppable
    await _populate(url, tmp_path, fake_openai, ["cached prompt", "other prompt"])
    store = FeatureStoreLookup(url, "tiny", semantic=False, timeout_ms=3000, error_backoff_s=0.2)
    assert await store.lookup("acme", "chat", chat_body("cached prompt")) is not None
    errors_before = _errors("db_error") + _errors("backoff")
    stop()
    store.drop_connections()  # SQLite: drop open file handles (fast path and engine), as a restart would
    t0 = time.perf_counter()
    assert await store.lookup("acme", "chat", chat_body("other prompt")) is None
    assert time.perf_counter() - t0 < 3.0
    assert _errors("db_error") + _errors("backoff") == errors_before + 1
    # What the LRU already holds is still served while the database is down.
    assert await store.lookup("acme", "chat", chat_body("cached prompt")) is not None
    start()
    deadline = time.monotonic() + 30
    hit = None
    while hit is None and time.monotonic() < deadline:
        hit = await store.lookup("acme", "chat", chat_body("other prompt"))
        if hit is None:
            time.sleep(0.1)
    assert hit is not None, "lookups did not recover after the database came back"
    await store.close()


class SlowEmbedder(HashingEmbedder):
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(2.0)
        return super().embed(texts)


async def test_deadline_fails_open(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    db.upgrade(url)
    await _populate(url, tmp_path, fake_openai, ["what is the answer"])
    store = FeatureStoreLookup(url, "tiny", embedder=SlowEmbedder(64), timeout_ms=50)
    await store.warmup()
    before = _errors("timeout")
    t0 = time.perf_counter()
    assert await store.lookup("acme", "chat", chat_body("what is the answer, please")) is None
    assert time.perf_counter() - t0 < 1.5  # the deadline (50 ms), not the 2 s embedder, ended it
    assert _errors("timeout") == before + 1
    # Exact hits do not need the embedder and stay fast.
    assert await store.lookup("acme", "chat", chat_body("what is the answer")) is not None
    await store.close()
