"""The router against fake OpenAI replicas: API, streaming, errors, retries, drain, limits, metrics."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmfleet.router.config import TenantConfig, TenantsConfig

from .conftest import config, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


async def test_openai_client_chat_completion_and_stream(fakes, routers) -> None:
    from openai import AsyncOpenAI

    a = await fakes(name="a")
    r = await routers(config({"primary": ("m", [a.url])}))
    client = AsyncOpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["m"]
        out = await client.chat.completions.with_raw_response.create(**CHAT)
        assert out.headers["x-llmfleet-pool"] == "primary" and out.headers["x-llmfleet-degraded"] == "false"
        assert out.parse().choices[0].message.content == "a a a "
        stream = await client.chat.completions.create(**CHAT, stream=True)
        texts = [c.choices[0].delta.content async for c in stream if c.choices]
        assert texts == ["a0 ", "a1 ", "a2 "]
        comp = await client.completions.create(model="m", prompt="x", max_tokens=2)
        assert comp.choices[0].text == "a a "
        with pytest.raises(Exception) as ei:  # noqa: B017 - openai raises its NotFoundError
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        assert getattr(ei.value, "status_code", None) == 404
    finally:
        await client.close()
    assert a.requests[-1]["model"] == "m"


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1,2]", 400, "JSON object"),
        (json.dumps({"messages": []}).encode(), 400, "'model'"),
        (json.dumps({"model": "m", "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), 400,
         "stream"),
        (json.dumps({"model": "other", "messages": [{"role": "user", "content": "x"}]}).encode(), 404, "does not exist"),
    ],
)
async def test_bad_requests_get_openai_errors(fakes, routers, http, body: bytes, status: int, fragment: str) -> None:
    a = await fakes()
    r = await routers(config({"primary": ("m", [a.url])}))
    async with http.post(r.url + "/v1/chat/completions", data=body) as resp:
        assert resp.status == status
        err = (await resp.json())["error"]
        assert fragment in err["message"] and "type" in err
    assert a.requests == []


async def test_size_limit_unknown_route_and_method(fakes, routers, http) -> None:
    a = await fakes()
    r = await routers(config({"primary": ("m", [a.url])}, limits={"max_request_bytes": 2048}))
    big = json.dumps({"model": "m", "prompt": "x" * 5000}).encode()
    async with http.post(r.url + "/v1/completions", data=big) as resp:
        assert resp.status == 413 and "larger than 2048" in (await resp.json())["error"]["message"]
    async with http.get(r.url + "/v1/nothing") as resp:
        assert resp.status == 404 and "error" in await resp.json()
    async with http.get(r.url + "/v1/chat/completions") as resp:
        assert resp.status == 405


async def test_retry_on_another_replica_before_first_byte(fakes, routers, http) -> None:
    bad = await fakes(name="bad", fail="500")
    good = await fakes(name="good")
    dead_url = "http://127.0.0.1:9"  # nothing listens on the discard port
    r = await routers(config({"primary": ("m", [bad.url, dead_url, good.url])},
                             limits={"scrape_interval_seconds": 30}))
    for _ in range(4):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["x-llmfleet-replica"] == good.url
    text = (await (await http.get(r.url + "/metrics")).read()).decode()
    assert "llmfleet_router_retries_total" in text
    state = {x["replica"]: x for x in (await (await http.get(r.url + "/debug/replicas")).json())["replicas"]}
    assert state[dead_url]["healthy"] is False  # connection refused marks it down at once
    assert all(x.awaiting_first_byte == 0 for x in r.router.pools["primary"].replicas.replicas.values())


async def test_upstream_failures_are_counted_per_pool_for_the_error_rate(fakes, routers, http) -> None:
    """Every try on a replica counts (ok / error / overloaded), retried ones included: one failing replica shows
    in its pool's error rate even while retries keep every client answer a 200."""
    from llmfleet.autoscaler.signals import PoolRef, values_from_scrapes
    from llmfleet.util.prom_text import parse_samples

    bad, good, student = await fakes(name="bad", fail="500"), await fakes(name="good"), await fakes(name="s")
    r = await routers(config({"primary": ("m", [bad.url, good.url]), "small": ("s", [student.url])},
                             limits={"scrape_interval_seconds": 30}))
    for _ in range(6):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200, await resp.text()
    async with http.post(r.url + "/v1/chat/completions", json={**CHAT, "model": "s"}) as resp:
        assert resp.status == 200
    samples = parse_samples(await (await http.get(r.url + "/metrics")).text())
    attempts = {dict(labels)["pool"] + "/" + dict(labels)["outcome"]: v for (name, labels), v in samples.items()
                if name == "llmfleet_router_upstream_attempts_total"}
    assert attempts["primary/ok"] == 6 and attempts["primary/error"] >= 1 and "small/error" not in attempts
    primary = values_from_scrapes(PoolRef("primary", "primary", 2, 2), {}, samples, {}, {}, 1.0)["error_rate"]
    small = values_from_scrapes(PoolRef("small", "student", 1, 1), {}, samples, {}, {}, 1.0)["error_rate"]
    assert 0 < primary < 1 and small == 0.0  # type: ignore[operator]


async def test_the_router_sums_powers_of_prompt_tokens_for_the_autoscaler(fakes, routers, http) -> None:
    """The autoscaler's spread of prefill times reads E[L^2..L^4] of the prompt lengths from the router's power sums
    over its input-token count: for identical requests they are the powers of the mean, exactly."""
    from llmfleet.autoscaler.signals import PoolRef, assemble, values_from_scrapes
    from llmfleet.util.prom_text import parse_samples

    up = await fakes(name="a")
    r = await routers(config({"primary": ("m", [up.url])}, limits={"scrape_interval_seconds": 30}))
    for _ in range(4):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200, await resp.text()
    samples = parse_samples(await (await http.get(r.url + "/metrics")).text())
    v = values_from_scrapes(PoolRef("primary", "primary", 1, 1), {}, samples, {}, {}, 1.0)
    mean = v["mean_input_tokens"]
    assert mean is not None and mean > 0
    for k in (2, 3, 4):
        assert v[f"input_tokens_power_{k}"] == pytest.approx(mean ** k)
    moments = assemble(PoolRef("primary", "primary", 1, 1), 0.0, v, stale_after_s=30).input_tokens_moments
    assert moments == pytest.approx((mean ** 2, mean ** 3, mean ** 4))


async def test_all_replicas_failing_gives_503_json(fakes, routers, http) -> None:
    bad = await fakes(fail="close")
    r = await routers(config({"primary": ("m", [bad.url])}, limits={"scrape_interval_seconds": 30}))
    async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 503
        assert "no replica" in (await resp.json())["error"]["message"]


async def test_slow_replica_first_byte_deadline_then_retry(fakes, routers, http) -> None:
    slow = await fakes(name="slow", fail="hang")
    fast = await fakes(name="fast")
    cfg = config({"primary": ("m", [slow.url, fast.url])},
                 limits={"first_byte_timeout_seconds": 0.3, "scrape_interval_seconds": 30},
                 scorers={"running-requests": 1.0})
    r = await routers(cfg)
    for _ in range(3):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200 and resp.headers["x-llmfleet-replica"] == fast.url


async def test_drain_and_health(fakes, routers, http) -> None:
    a = await fakes(name="a")
    b = await fakes(name="b")
    r = await routers(config({"primary": ("m", [a.url, b.url])}, scorers={"running-requests": 1.0}))
    async with http.get(r.url + "/health") as resp:
        assert resp.status == 200 and (await resp.json())["routable"] == {"primary": 2}
    async with http.post(r.url + "/admin/drain", json={"replica": a.url}) as resp:
        assert resp.status == 200
    async with http.get(r.url + "/health") as resp:
        assert (await resp.json())["routable"] == {"primary": 1}  # a draining replica takes no new requests
    for _ in range(6):
        async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.headers["x-llmfleet-replica"] == b.url
    async with http.post(r.url + "/admin/drain", json={"replica": "http://nope:1"}) as resp:
        assert resp.status == 404
    await http.post(r.url + "/admin/drain", json={"replica": a.url, "draining": False})
    b.healthy = False  # health checks take b out of rotation
    await wait_for(lambda: not r.router.pools["primary"].replicas.replicas[b.url].healthy)
    async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.headers["x-llmfleet-replica"] == a.url
    a.healthy = False
    await wait_for(lambda: not r.router.pools["primary"].replicas.routable())
    async with http.get(r.url + "/health") as resp:
        assert resp.status == 503 and (await resp.json())["routable"] == {"primary": 0}


async def test_client_disconnect_cancels_upstream(fakes, routers, http) -> None:
    a = await fakes(tokens=1000, token_delay_s=0.01)
    r = await routers(config({"primary": ("m", [a.url])}))
    resp = await http.post(r.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 1000, "stream": True})
    await resp.content.readline()
    resp.close()  # client goes away mid-stream
    await wait_for(lambda: a.cancelled == 1)
    await wait_for(lambda: r.router.pools["primary"].replicas.replicas[a.url].in_flight == 0)
    assert r.router.pools["primary"].replicas.replicas[a.url].awaiting_first_byte == 0


async def test_load_metrics_scraped_and_stale(fakes, routers) -> None:
    a = await fakes(metrics={"vllm:num_requests_running": 3, "vllm:num_requests_waiting": 7,
                             "vllm:kv_cache_usage_perc": 0.5, "vllm:prefix_cache_hits_total": 10})
    b = await fakes()  # no vllm series: stays stale
    r = await routers(config({"primary": ("m", [a.url, b.url])}))
    reps = r.router.pools["primary"].replicas.replicas
    await wait_for(lambda: not reps[a.url].stale)
    assert (reps[a.url].running, reps[a.url].waiting, reps[a.url].kv_usage, reps[a.url].prefix_hits) == (3, 7, 0.5, 10)
    assert reps[b.url].stale
    a.healthy = False
    await wait_for(lambda: reps[a.url].stale, timeout=6)


async def test_prefix_affinity_and_sessions(fakes, routers, http) -> None:
    a = await fakes(name="a")
    b = await fakes(name="b")
    r = await routers(config({"primary": ("m", [a.url, b.url])},
                             scorers={"prefix-cache": 2.0, "running-requests": 1.0, "session-affinity": 3.0}))
    shared = "You are a helpful assistant. " * 40
    seen = set()
    for i in range(6):
        body = {"model": "m", "messages": [{"role": "system", "content": shared},
                                           {"role": "user", "content": f"q{i}"}]}
        async with http.post(r.url + "/v1/chat/completions", json=body) as resp:
            seen.add(resp.headers["x-llmfleet-replica"])
    assert len(seen) == 1  # shared prefix sticks to one replica
    other = seen.pop()
    sess = set()
    for i in range(4):
        body = {"model": "m", "messages": [{"role": "user", "content": f"unrelated {i} " * 30}]}
        async with http.post(r.url + "/v1/chat/completions", json=body, headers={"x-session-id": "s1"}) as resp:
            sess.add(resp.headers["x-llmfleet-replica"])
    assert len(sess) == 1
    text = (await (await http.get(r.url + "/metrics")).read()).decode()
    assert 'llmfleet_router_prefix_affinity_hits_total{pool="primary"} 5.0' in text
    assert 'llmfleet_router_session_affinity_hits_total{pool="primary"} 3.0' in text
    assert other in text  # exclusive-blocks gauge per replica


async def test_fallback_to_student_headers_metrics_and_log(fakes, routers, http, tmp_path) -> None:
    big = await fakes(name="big")
    small = await fakes(name="small")
    logf = tmp_path / "requests.jsonl"
    cfg = config({"primary": ("m", [big.url]), "student": ("m-small", [small.url])},
                 fallback={"long_context_tokens": 50, "sheddable_classes": ["batch"], "max_degraded_fraction": 1.0},
                 request_log=str(logf))
    r = await routers(cfg)
    async with http.post(r.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}) as resp:
        assert resp.headers["x-llmfleet-pool"] == "primary"
    async with http.post(r.url + "/v1/completions", json={"model": "m", "prompt": "word " * 200}) as resp:
        assert resp.headers["x-llmfleet-pool"] == "student" and resp.headers["x-llmfleet-degraded"] == "true"
        assert resp.headers["x-llmfleet-fallback-reason"] == "long-context"
    assert small.requests[-1]["model"] == "m-small"  # rewritten to the student's served name
    async with http.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                         headers={"x-llmfleet-class": "batch"}) as resp:
        assert resp.headers["x-llmfleet-degraded"] == "true"
        assert b"[DONE]" in await resp.read()
    async with http.post(r.url + "/v1/chat/completions", json={**CHAT, "model": "m-small"}) as resp:
        assert resp.headers["x-llmfleet-pool"] == "student" and resp.headers["x-llmfleet-degraded"] == "false"
    big.healthy = False
    await wait_for(lambda: not r.router.pools["primary"].replicas.routable())
    async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200 and resp.headers["x-llmfleet-fallback-reason"] == "unavailable"
    text = (await (await http.get(r.url + "/metrics")).read()).decode()
    assert 'llmfleet_router_fallbacks_total{pool="student",reason="long-context"} 1.0' in text
    assert 'llmfleet_router_ttft_seconds_count{model="m",pool="student"} 1.0' in text
    await r.runner.cleanup()
    lines = [json.loads(x) for x in logf.read_text().splitlines()]
    assert len(lines) == 5
    keys = {"ts", "tenant", "model", "endpoint", "prompt", "messages", "params", "input_tokens", "output_tokens",
            "pool", "degraded", "ttft_ms", "e2e_ms", "status"}
    assert all(set(x) == keys for x in lines)
    assert lines[0]["endpoint"] == "completions" and lines[0]["prompt"] == "hi" and lines[0]["output_tokens"] == 2
    assert lines[2]["messages"] == CHAT["messages"] and lines[2]["ttft_ms"] is not None and lines[2]["degraded"]


async def test_api_keys_and_rate_limit(fakes, routers, http, tmp_path) -> None:
    a = await fakes()
    keyfile = tmp_path / "tenants.yaml"
    keyfile.write_text("tenants:\n- name: filed\n  apiKeys: [k-file]\n")
    tenants = TenantsConfig(require_api_key=True, file=str(keyfile),
                            tenants=[TenantConfig(name="t1", api_keys=["k1"], requests_per_second=0.01, burst=2)])
    r = await routers(config({"primary": ("m", [a.url])}, tenants=tenants))
    url = r.url + "/v1/chat/completions"
    async with http.post(url, json=CHAT) as resp:
        assert resp.status == 401 and (await resp.json())["error"]["type"] == "authentication_error"
    async with http.post(url, json=CHAT, headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401
    async with http.post(url, json=CHAT, headers={"Authorization": "Bearer k-file"}) as resp:
        assert resp.status == 200
    statuses = []
    for _ in range(3):
        async with http.post(url, json=CHAT, headers={"Authorization": "Bearer k1"}) as resp:
            statuses.append(resp.status)
            retry_after = resp.headers.get("Retry-After")
    assert statuses == [200, 200, 429] and retry_after is not None


async def test_router_sends_the_replicas_key_and_never_the_clients(fakes, routers, http, monkeypatch) -> None:
    """A replica that requires a key (vLLM --api-key) answers the router, which holds the key, and refuses a
    direct caller; the client's own tenant key is not passed upstream."""
    replica = await fakes(api_key="replica-secret")
    async with http.post(replica.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 401  # a pod calling the pool directly
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "replica-secret")
    tenants = TenantsConfig(require_api_key=True, tenants=[TenantConfig(name="t1", api_keys=["client-key"])])
    r = await routers(config({"primary": ("m", [replica.url])}, tenants=tenants, upstream_api_key_env="TEST_UPSTREAM_KEY"))
    async with http.post(r.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer client-key"}) as resp:
        assert resp.status == 200, await resp.text()
    # Its load scrapes carry the key as well: behind a proxy that guards /metrics the replica's load still arrives.
    guarded = await fakes(api_key="replica-secret", guard_metrics=True, metrics={"vllm:num_requests_running": 2})
    async with http.get(guarded.url + "/metrics") as resp:
        assert resp.status == 401
    g = await routers(config({"primary": ("m", [guarded.url])}, upstream_api_key_env="TEST_UPSTREAM_KEY"))
    state = g.router.pools["primary"].replicas.replicas[guarded.url]
    await wait_for(lambda: not state.stale)
    assert state.healthy and state.running == 2
    # The router's own calls to the replicas' /v1 (LoRA adapter loads) carry the key too.
    from llmfleet.router.config import AdapterConfig

    base = config({"primary": ("m", [replica.url])}, tenants=tenants, upstream_api_key_env="TEST_UPSTREAM_KEY")
    pool = base.pools[0].model_copy(update={"adapters": [AdapterConfig(name="sql", path="/a/sql")], "adapter_slots": 2})
    lora = await routers(base.model_copy(update={"pools": [pool]}))
    async with http.post(lora.url + "/v1/chat/completions", json={**CHAT, "model": "sql"},
                         headers={"Authorization": "Bearer client-key"}) as resp:
        assert resp.status == 200 and replica.adapters == {"sql": "/a/sql"}, await resp.text()
    # Without the key the router does not start: a clear error, not 401s from every replica.
    monkeypatch.delenv("TEST_UPSTREAM_KEY")
    with pytest.raises(ValueError, match="TEST_UPSTREAM_KEY is unset"):
        await routers(config({"primary": ("m", [replica.url])}, upstream_api_key_env="TEST_UPSTREAM_KEY"))


def test_rate_limit_share_per_router_replica() -> None:
    """N routers behind one Service each enforce 1/N of a tenant's rate and burst (the operator sets the share)."""
    from llmfleet.router.tenants import AuthError, Tenants

    tenant = TenantConfig(name="t", api_keys=["k"], requests_per_second=10, burst=8)
    whole, quarter = Tenants(TenantsConfig(tenants=[tenant])), Tenants(TenantsConfig(tenants=[tenant], limit_share=0.25))

    def admitted(t: Tenants, seconds: float) -> int:
        n, now = 0, 0.0
        while now < seconds:
            try:
                t.authenticate("Bearer k", now=now)
                n += 1
            except AuthError:
                pass
            now += 0.01
        return n

    assert admitted(whole, 10.0) == pytest.approx(8 + 100, abs=2)  # burst + 10 rps x 10 s
    assert 4 * admitted(quarter, 10.0) == pytest.approx(8 + 100, abs=8)  # four routers together: the same


async def test_feature_store_lookup_hit_miss_opt_out(fakes, routers, http) -> None:
    class Hit:
        kind = "exact"
        response = {"id": "stored", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "from store"},
                                 "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}

    class Lookup:
        calls = 0

        async def lookup(self, tenant, endpoint, body):  # type: ignore[no-untyped-def]
            self.calls += 1
            return Hit() if body["messages"][0]["content"] == "cached" else None

        async def close(self) -> None:
            pass

    a = await fakes(name="a")
    lk = Lookup()
    r = await routers(config({"primary": ("m", [a.url])}, feature_store={"enabled": True}), lookup=lk)
    hit_body = {"model": "m", "messages": [{"role": "user", "content": "cached"}]}
    async with http.post(r.url + "/v1/chat/completions", json=hit_body) as resp:
        assert resp.headers["x-llmfleet-pool"] == "feature-store"
        assert (await resp.json())["choices"][0]["message"]["content"] == "from store"
    async with http.post(r.url + "/v1/chat/completions", json={**hit_body, "stream": True}) as resp:
        assert b"from store" in await resp.read()
    async with http.post(r.url + "/v1/chat/completions", json=hit_body, headers={"x-llmfleet-no-lookup": "1"}) as resp:
        assert resp.headers["x-llmfleet-pool"] == "primary"
    async with http.post(r.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.headers["x-llmfleet-pool"] == "primary"
    assert lk.calls == 3 and len(a.requests) == 2
    text = (await (await http.get(r.url + "/metrics")).read()).decode()
    for result, n in (("hit", 2), ("miss", 1), ("skipped", 1)):
        assert f'llmfleet_router_lookups_total{{result="{result}"}} {n}.0' in text


async def test_concurrent_streams(fakes, routers, http) -> None:
    a = await fakes(name="a", tokens=20)
    b = await fakes(name="b", tokens=20)
    r = await routers(config({"primary": ("m", [a.url, b.url])}, scorers={"running-requests": 1.0}))

    async def one(i: int) -> int:
        async with http.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 20}) as resp:
            data = await resp.read()
            return data.count(b"data: ")

    counts = await asyncio.gather(*(one(i) for i in range(40)))
    assert counts == [21] * 40
    assert len(a.requests) > 5 and len(b.requests) > 5


async def test_kv_events_over_zmq_correct_the_index(fakes, routers) -> None:
    """A fake vLLM publishes KV events (ZMQ PUB, msgpack like vLLM's KVEventBatch); the index follows them."""
    import msgspec
    import zmq
    import zmq.asyncio

    from llmfleet.router.block_keys import BlockHasher

    a = await fakes(name="a")
    ctx = zmq.asyncio.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    cfg = config({"primary": ("m", [a.url])}, limits={"scrape_interval_seconds": 0.05})
    cfg.pools[0].kv_events_port = port
    cfg.pools[0].block_size = 4
    r = await routers(cfg)
    index = r.router.pools["primary"].index
    toks = list(range(1, 13))
    stored = {"type": "BlockStored", "block_hashes": [b"h1", b"h2", b"h3"], "parent_block_hash": None,
              "token_ids": toks, "block_size": 4, "lora_id": None, "medium": "GPU"}
    keys = BlockHasher(4).keys(toks)
    try:
        async def publish_until(pred) -> None:  # type: ignore[no-untyped-def]
            for _ in range(100):  # a SUB socket drops what was sent before it connected: resend
                await pub.send_multipart([b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode([1.0, events])])
                await asyncio.sleep(0.05)
                if pred():
                    return
            raise AssertionError("KV events not applied")

        events = [stored]
        await publish_until(lambda: index.match(keys).get(a.url) == 3)
        events = [{"type": "BlockRemoved", "block_hashes": [b"h3"], "medium": "GPU"}]
        await publish_until(lambda: index.match(keys).get(a.url) == 2)
        events = [{"type": "AllBlocksCleared"}]
        await publish_until(lambda: index.match(keys) == {})
    finally:
        pub.close(linger=0)


async def test_tokenizer_blocks_long_prompt_in_thread(fakes, routers, http, tmp_path) -> None:
    """prefixMode tokens with a tokenizer.json: long prompts are tokenized (off the loop) and stick by prefix."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = [f"w{i}" for i in range(50)]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    a = await fakes(name="a")
    b = await fakes(name="b")
    cfg = config({"primary": ("m", [a.url, b.url])}, scorers={"prefix-cache": 2.0, "running-requests": 1.0})
    cfg.pools[0].tokenizer_path = str(tmp_path)
    cfg.pools[0].prefix_mode = "tokens"
    r = await routers(cfg)
    pool = r.router.pools["primary"]
    assert pool.blocks.tokenizer is not None
    shared = " ".join(words[i % 50] for i in range(1500))  # > 4096 characters
    seen = set()
    for i in range(4):
        async with http.post(r.url + "/v1/completions", json={"model": "m", "prompt": f"{shared} w{i}"}) as resp:
            assert resp.status == 200
            seen.add(resp.headers["x-llmfleet-replica"])
    assert len(seen) == 1 and len(pool.index) == 1500 // 16


def test_prefix_mode_tokens_without_tokenizer_is_a_clear_error(tmp_path) -> None:
    from llmfleet.router.server import Router

    cfg = config({"primary": ("m", ["http://127.0.0.1:9"])})
    cfg.pools[0].prefix_mode = "tokens"
    cfg.pools[0].tokenizer_path = str(tmp_path)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Router(cfg)
