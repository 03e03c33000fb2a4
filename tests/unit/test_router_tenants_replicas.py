"""Token buckets, tenant keys, EndpointSlice parsing and vLLM /metrics parsing."""

from __future__ import annotations

import pytest

from llmfleet.router.config import LimitsConfig, PoolConfig, TenantConfig, TenantsConfig
from llmfleet.router.replicas import PoolReplicas, endpoints_from_slices, parse_vllm_metrics
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
    vals = parse_vllm_metrics(text)
    assert vals == {"running": 3, "waiting": 4, "kv_usage": 0.25, "prefix_queries": 100, "prefix_hits": 40,
                    "cache_capacity_blocks": 2048}
    r = pool.replicas["http://a"]
    pool.apply_scrape(r, vals, now=10.0)
    assert not r.stale and r.load == 7 and caps == {"http://a": 2048}
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
