"""The feature store against real SQLite and a real PostgreSQL (each test runs on both)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import inspect, select

from llmfleet.store import db, generation, repo
from llmfleet.store.embeddings import HashingEmbedder
from llmfleet.store.lookup import FeatureStoreLookup
from llmfleet.store.models import LookupStat
from llmfleet.testing.fake_openai import FakeOpenAI, chat_body, log_record, write_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TABLES = {"models", "model_versions", "prompt_features", "embeddings", "responses", "lookup_stats", "log_progress"}


def _tables(url: str) -> set[str]:
    engine = db.make_nullpool_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migration_up_down_up(store_url: str) -> None:
    db.upgrade(store_url)
    assert TABLES <= _tables(store_url)
    assert db.current_revision(store_url) == "0001"
    db.upgrade(store_url)  # idempotent
    db.downgrade(store_url, "base")
    assert not (TABLES & _tables(store_url))
    assert db.current_revision(store_url) is None
    db.upgrade(store_url)
    assert TABLES <= _tables(store_url)


def _frequencies(engine, model: str = "tiny") -> dict[str, int]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        rows = conn.execute(
            select(repo.features_t.c.text, repo.features_t.c.frequency).where(repo.features_t.c.model == model)
        ).all()
    return {t: int(f) for t, f in rows}


def test_concurrent_writers(migrated_url: str, tmp_path: Path) -> None:
    # Four writers ingest four different logs that share prompts; two more ingest the SAME log at once.
    prompts = [f"prompt number {i}" for i in range(40)]
    logs = []
    for w in range(4):
        recs = [log_record(p, ts=float(i)) for i, p in enumerate(prompts) for _ in range(w + 1)]
        logs.append(write_log(tmp_path / f"log{w}.jsonl", recs))
    shared = write_log(tmp_path / "shared.jsonl", [log_record(p, ts=1.0) for p in prompts])
    engine = db.make_engine(migrated_url, writer=True, pool_size=8)
    errors: list[BaseException] = []

    def work(path: Path) -> None:
        try:
            generation.ingest_log(engine, path, batch_lines=7)
        except BaseException as e:  # noqa: BLE001 - collected and re-raised by the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(p,)) for p in [*logs, shared, shared]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    freq = _frequencies(engine)
    # 1+2+3+4 from the four logs, +1 from the shared log counted exactly once.
    assert freq == {normalize(p): 11 for p in prompts}
    engine.dispose()


def normalize(p: str) -> str:
    return f"user: {p}"


def test_crash_during_ingest_then_rerun(migrated_url: str, tmp_path: Path) -> None:
    recs = [log_record(f"q{i % 13}", ts=float(i)) for i in range(100)]
    log = write_log(tmp_path / "log.jsonl", recs)
    engine = db.make_engine(migrated_url, writer=True)

    def crash(n: int) -> None:
        if n == 2:
            raise KeyboardInterrupt("simulated crash after the third batch")

    with pytest.raises(KeyboardInterrupt):
        generation.ingest_log(engine, log, batch_lines=10, after_batch=crash)
    assert sum(_frequencies(engine).values()) == 30  # three committed batches, nothing more
    generation.ingest_log(engine, log, batch_lines=10)
    generation.ingest_log(engine, log, batch_lines=10)  # a rerun with nothing new changes nothing
    expected = {normalize(f"q{k}"): sum(1 for i in range(100) if i % 13 == k) for k in range(13)}
    assert _frequencies(engine) == expected
    # The log grows (and its last line is half written): only complete new lines are counted.
    with log.open("a") as f:
        f.write('{"ts": 200, "tenant": "acme", "model": "tiny", "endpoint": "chat", "prompt": null, "messages": '
                '[{"role": "user", "content": "q0"}], "params": {}, "status": 200}\n{"ts": 201, "ten')
    generation.ingest_log(engine, log, batch_lines=10)
    assert _frequencies(engine)[normalize("q0")] == expected[normalize("q0")] + 1
    engine.dispose()


async def test_invalidation_on_model_version_change(migrated_url: str, tmp_path: Path,
                                                   fake_openai: FakeOpenAI) -> None:
    log = write_log(tmp_path / "log.jsonl", [log_record("hello there") for _ in range(3)])
    engine = db.make_engine(migrated_url, writer=True)
    generation.ingest_log(engine, log)
    v1 = repo.set_current_version(engine, "tiny", "/models/v1")
    report = await generation.precompute_responses(engine, model="tiny", version_id=v1.version_id,
                                                   endpoint_url=fake_openai.url, min_frequency=3)
    assert report.responses_ok == 1
    store = FeatureStoreLookup(migrated_url, "tiny", semantic=False, timeout_ms=2000, version_refresh_s=0,
                               negative_ttl_s=0)
    # connect and resolve the version first, as the router does at startup: a first lookup that also connects can
    # overrun its 2 s deadline on a loaded machine and fail open (a miss), which is not what this test is about
    assert await store.warmup()
    hit = await store.lookup("acme", "chat", chat_body("hello   there"))
    assert hit is not None and hit.kind == "exact" and hit.model_version == "/models/v1"
    assert "hello there" in hit.response["choices"][0]["message"]["content"]
    assert await store.lookup("other-tenant", "chat", chat_body("hello there")) is None
    assert await store.lookup("acme", "chat", chat_body("hello there", max_tokens=99)) is None

    v2 = repo.set_current_version(engine, "tiny", "/models/v2")
    assert v2.changed and v2.invalidated == 1
    assert await store.lookup("acme", "chat", chat_body("hello there")) is None  # LRU keyed by version too
    assert repo.valid_response_keys(engine, v1.version_id) == set()
    # Regenerating for v2 answers again; switching back to v1 does not resurrect v1's responses.
    await generation.precompute_responses(engine, model="tiny", version_id=v2.version_id,
                                          endpoint_url=fake_openai.url, min_frequency=3)
    hit = await store.lookup("acme", "chat", chat_body("hello there"))
    assert hit is not None and hit.model_version == "/models/v2"
    repo.set_current_version(engine, "tiny", "/models/v1")
    assert await store.lookup("acme", "chat", chat_body("hello there")) is None
    await store.close()
    engine.dispose()


async def test_semantic_neighbour_and_threshold(migrated_url: str, tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    prompts = ["What is the capital of France?", "How do I bake sourdough bread at home?",
               "Explain the theory of relativity simply", "List three prime numbers above one hundred"]
    recs = [log_record(p) for p in prompts for _ in range(3)] + [log_record(prompts[0], tenant="globex")] * 3
    log = write_log(tmp_path / "log.jsonl", recs)
    engine = db.make_engine(migrated_url, writer=True)
    generation.ingest_log(engine, log)
    v = repo.set_current_version(engine, "tiny", "v1")
    emb = HashingEmbedder(256)
    generation.embed_features(engine, emb)
    await generation.precompute_responses(engine, model="tiny", version_id=v.version_id,
                                          endpoint_url=fake_openai.url, min_frequency=3)
    store = FeatureStoreLookup(migrated_url, "tiny", embedder=emb, semantic_threshold=0.8, timeout_ms=5000)
    await store.warmup()
    assert store.index_size == 5
    hit = await store.lookup("acme", "chat", chat_body("what is the capital of france"))
    assert hit is not None and hit.kind == "semantic" and 0.8 <= hit.similarity < 1.0
    assert "capital of France" in hit.response["choices"][0]["message"]["content"]
    hit = await store.lookup("acme", "chat", chat_body("How do I bake sourdough bread at home ??"))
    assert hit is not None and "sourdough" in hit.response["choices"][0]["message"]["content"]
    assert await store.lookup("acme", "chat", chat_body("Who painted the Mona Lisa?")) is None
    await store.close()
    strict = FeatureStoreLookup(migrated_url, "tiny", embedder=emb, semantic_threshold=0.999, timeout_ms=5000)
    await strict.warmup()
    assert await strict.lookup("acme", "chat", chat_body("what is the capital of france")) is None
    # Embeddings added later reach the index incrementally (no rebuild), then answer.
    write_log(log, [log_record("Name the largest ocean on Earth")] * 3, mode="a")
    generation.ingest_log(engine, log)
    generation.embed_features(engine, emb)
    await generation.precompute_responses(engine, model="tiny", version_id=v.version_id,
                                          endpoint_url=fake_openai.url, min_frequency=3)
    strict.semantic_threshold = 0.8
    strict.semantic.refresh_index()
    assert strict.index_size == 6
    hit = await strict.lookup("acme", "chat", chat_body("name the largest ocean on earth!"))
    assert hit is not None and "largest ocean" in hit.response["choices"][0]["message"]["content"]
    await strict.close()
    # close() flushed the lookup statistics (additively, per hour bucket).
    with engine.connect() as conn:
        stats = {(r.kind, r.result): r.count for r in conn.execute(select(LookupStat.__table__))}
    assert stats[("semantic", "hit")] >= 1 and stats[("exact", "miss")] >= 1
    engine.dispose()
