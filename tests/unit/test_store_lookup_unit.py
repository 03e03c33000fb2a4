"""Lookup client behaviour that needs no database server: cheap construction, fail open, LRU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llmfleet.store.lookup import FeatureStoreLookup


def test_import_and_construction_are_cheap() -> None:
    code = (
        "import sys, time; t=time.perf_counter();"
        "from llmfleet.store.lookup import FeatureStoreLookup;"
        "FeatureStoreLookup(None, 'm'); FeatureStoreLookup('postgresql://nobody@127.0.0.1:1/x', 'm');"
        "assert 'torch' not in sys.modules and 'sentence_transformers' not in sys.modules, 'heavy import';"
        "print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


async def test_unreachable_database_fails_open(tmp_path: Path) -> None:
    # Port 1 on localhost: connection refused at once.
    store = FeatureStoreLookup("postgresql://nobody@127.0.0.1:1/x", "m", timeout_ms=2000, semantic=False)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert await store.lookup("t", "chat", body) is None
    assert await store.lookup("t", "chat", body) is None  # within the backoff: not even tried
    assert await store.warmup() is False
    await store.close()


async def test_unkeyable_request_is_a_miss() -> None:
    store = FeatureStoreLookup(None, "m")
    assert await store.lookup("t", "chat", {"messages": []}) is None
    assert await store.lookup("t", "embeddings", {"input": "x"}) is None
    await store.close()


async def test_missing_schema_fails_open(tmp_path: Path) -> None:
    store = FeatureStoreLookup(f"sqlite:///{tmp_path / 'empty.db'}", "m", timeout_ms=2000)
    assert await store.lookup("t", "completions", {"prompt": "hello"}) is None
    await store.close()


def test_from_spec() -> None:
    from llmfleet.api.inferenceservice import FeatureStoreSpec

    spec = FeatureStoreSpec(url="postgresql://u@h/db", semantic_threshold=0.8, lookup_timeout_ms=15)
    store = FeatureStoreLookup.from_spec(spec, "m")
    assert store.url == "postgresql+psycopg://u@h/db" and store.semantic_threshold == 0.8
    assert abs(store.timeout_s - 0.015) < 1e-9
    default = FeatureStoreLookup.from_spec(None, "m", run_dir="/tmp/run")
    assert default.url == "sqlite:////tmp/run/featurestore.db"


def test_router_with_empty_store_never_loads_the_embedding_model(tmp_path: Path) -> None:
    code = f"""
import asyncio, sys
from llmfleet.store import db, repo
from llmfleet.store.lookup import FeatureStoreLookup
url = "sqlite:///{tmp_path / 'fs.db'}"
db.upgrade(url)
repo.set_current_version(db.make_engine(url, writer=True), "m", "v1")
async def main():
    store = FeatureStoreLookup(url, "m")  # default embedder: MiniLM
    assert await store.warmup()
    assert await store.lookup("t", "chat", {{"messages": [{{"role": "user", "content": "hi"}}]}}) is None
    await store.close()
asyncio.run(main())
assert "torch" not in sys.modules and "sentence_transformers" not in sys.modules, "model loaded"
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_settings_object_is_shared_by_the_parts() -> None:
    import pytest

    from llmfleet.store.lookup_settings import LookupSettings

    settings = LookupSettings("postgresql://u@h/db", "m", timeout_ms=15, semantic=False)
    store = FeatureStoreLookup.from_settings(settings)
    assert store.url == "postgresql+psycopg://u@h/db" and abs(store.timeout_s - 0.015) < 1e-9
    store.semantic_threshold = 0.5  # one object: every part sees the change
    assert store.exact.runtime.settings.semantic_threshold == store.semantic.runtime.settings.semantic_threshold == 0.5
    with pytest.raises(ValueError, match="pg_driver"):
        FeatureStoreLookup(None, "m", pg_driver="odbc")
    with pytest.raises(TypeError):
        FeatureStoreLookup(None, "m", no_such_option=1)
