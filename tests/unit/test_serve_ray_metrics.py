"""engine: ray-serve's /metrics: vLLM's series from Ray's metrics agent, under vLLM's names, plus the wrapper's own."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmfleet.autoscaler.signals import agreed_shape, shape_samples
from llmfleet.plan.models import shape_from_hf_config
from llmfleet.router.replicas import parse_vllm_metrics
from llmfleet.util.prom_text import parse_samples
from llmfleet.workers.serve.drain import DrainProxy
from llmfleet.workers.serve.ray_metrics import RAY_METRICS_PORT_ENV, RAY_PROCESS_LABELS, vllm_series
from llmfleet.workers.serve.worker import engine_env, served_model_metrics
from tests.local_http import serve_app

# As Ray 2.60's metrics agent exports vLLM 0.32's series (abridged from a real page: Ray's own series around them,
# Ray's process labels on every series).
_RAY = ('Component="core_worker",NodeAddress="192.0.2.2",ReplicaId="14nz6hly",SessionName="session_2026",'
        'Version="2.60.0",WorkerId="0c8a"')
_OTEL = 'otel_scope_name="ray._private.telemetry",otel_scope_schema_url="",otel_scope_version=""'
RAY_PAGE = f"""# HELP ray_tasks Current number of tasks.
# TYPE ray_tasks gauge
ray_tasks{{{_RAY},State="RUNNING"}} 2.0
# HELP ray_vllm_num_requests_running Number of requests in model execution batches.
# TYPE ray_vllm_num_requests_running gauge
ray_vllm_num_requests_running{{{_RAY},engine="0",model_name="tiny",{_OTEL}}} 3.0
# HELP ray_vllm_num_requests_waiting Number of requests waiting to be processed.
# TYPE ray_vllm_num_requests_waiting gauge
ray_vllm_num_requests_waiting{{Component="core_worker",engine="0",model_name="tiny",{_OTEL}}} 1.0
# HELP ray_vllm_prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE ray_vllm_prefix_cache_hits_total counter
ray_vllm_prefix_cache_hits_total{{{_RAY},engine="0",model_name="tiny",{_OTEL}}} 384.0
# HELP ray_vllm_prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE ray_vllm_prefix_cache_queries_total counter
ray_vllm_prefix_cache_queries_total{{{_RAY},engine="0",model_name="tiny",{_OTEL}}} 604.0
# HELP ray_vllm_cache_config_info Information of the LLMEngine CacheConfig
# TYPE ray_vllm_cache_config_info gauge
ray_vllm_cache_config_info{{{_RAY},block_size="128",engine="0",num_gpu_blocks="4096",{_OTEL}}} 1.0
# HELP ray_vllm_time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE ray_vllm_time_to_first_token_seconds histogram
ray_vllm_time_to_first_token_seconds_bucket{{{_RAY},engine="0",le="0.1",model_name="tiny",{_OTEL}}} 3.0
ray_vllm_time_to_first_token_seconds_bucket{{{_RAY},engine="0",le="+Inf",model_name="tiny",{_OTEL}}} 4.0
ray_vllm_time_to_first_token_seconds_count{{{_RAY},engine="0",model_name="tiny",{_OTEL}}} 4.0
ray_vllm_time_to_first_token_seconds_sum{{{_RAY},engine="0",model_name="tiny",{_OTEL}}} 0.25
# HELP ray_vllm_engine_sleep_state Engine sleep state
# TYPE ray_vllm_engine_sleep_state gauge
ray_vllm_engine_sleep_state{{Component="core_worker",{_OTEL}}} 0.0
# HELP ray_node_cpu_count Total CPUs available on a ray node
# TYPE ray_node_cpu_count gauge
ray_node_cpu_count{{{_RAY}}} 2.0
""".encode()


def test_vllm_series_renames_rays_export_and_drops_the_rest() -> None:
    text = vllm_series(RAY_PAGE).decode()
    assert "ray_" not in text and "Ray" not in text.replace("ReplicaId", "")  # Ray's own series and labels went
    assert not any(f"{label}=" in text for label in RAY_PROCESS_LABELS)
    samples = parse_samples(text)
    assert samples[("vllm:num_requests_running",
                    (("ReplicaId", "14nz6hly"), ("engine", "0"), ("model_name", "tiny")))] == 3.0
    # the first label removed, or every label: still a valid line
    assert '\nvllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0\n' in text
    assert "\nvllm:engine_sleep_state 0.0\n" in text
    # the families the router and the autoscaler read, under vLLM's names
    cache_info: dict[str, str] = {}
    assert parse_vllm_metrics(text, cache_info) == {"running": 3.0, "waiting": 1.0, "prefix_hits": 384.0,
                                                    "prefix_queries": 604.0, "cache_capacity_blocks": 4096.0}
    assert cache_info["block_size"] == "128"
    assert samples[("vllm:time_to_first_token_seconds_bucket",
                       (("ReplicaId", "14nz6hly"), ("engine", "0"), ("le", "0.1"), ("model_name", "tiny")))] == 3.0
    assert "# TYPE vllm:time_to_first_token_seconds histogram\n" in text
    assert vllm_series(b"") == b"" and vllm_series(b"ray_tasks 1\n# HELP ray_tasks x\n") == b""
    # a removed label's value with an escaped quote and a comma in it goes whole
    assert vllm_series(b'ray_vllm_w{engine="0",WorkerId="a\\",b"} 4\n') == b'vllm:w{engine="0"} 4\n'


def test_a_ray_serve_engine_is_told_where_rays_metrics_go() -> None:
    assert engine_env(["--model", "/m"]) is None
    env = engine_env(["--model", "/m"], ray_metrics_port=9123)
    assert env is not None and env[RAY_METRICS_PORT_ENV] == "9123" and "PATH" in env
    lora = engine_env(["--model", "/m", "--enable-lora"], ray_metrics_port=9123)
    assert lora is not None and lora[RAY_METRICS_PORT_ENV] == "9123" and len(lora) > len(env)


@pytest.mark.timeout(30)
async def test_the_wrapper_serves_rays_vllm_series_and_its_own(tmp_path: Path) -> None:
    accepts: list[str] = []

    async def agent(request: web.Request) -> web.Response:  # Ray's metrics agent
        accepts.append(request.headers.get("Accept", ""))
        return web.Response(body=RAY_PAGE, content_type="text/plain")

    async def no_metrics(_: web.Request) -> web.Response:  # Ray Serve's HTTP proxy has no /metrics route
        return web.Response(status=404)

    agent_app, engine_app = web.Application(), web.Application()
    agent_app.router.add_get("/metrics", agent)
    engine_app.router.add_get("/metrics", no_metrics)
    config = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
              "intermediate_size": 512, "vocab_size": 4096, "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(config))
    own = served_model_metrics(["--model", str(tmp_path)])
    runners = [await serve_app(agent_app), await serve_app(engine_app)]
    (_, agent_url), (_, engine_url) = runners
    proxy = DrainProxy(engine_url, extra_metrics=own, metrics_url=agent_url + "/metrics", metrics_filter=vllm_series)
    runners.append(await serve_app(proxy.app()))
    # a model that is no local folder: nothing of the wrapper's own, Ray's series all the same
    bare = DrainProxy(engine_url, metrics_url=agent_url + "/metrics", metrics_filter=vllm_series)
    runners.append(await serve_app(bare.app()))
    try:
        async with aiohttp.ClientSession() as s:
            # Prometheus asks for OpenMetrics first; the filter reads the text format, which is what it gets
            async with s.get(runners[2][1] + "/metrics",
                             headers={"Accept": "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"}) as r:
                assert r.status == 200
                text = await r.text()
        assert accepts == ["text/plain; version=0.0.4"]
        assert text.startswith("# HELP vllm:num_requests_running ") and "ray_" not in text
        assert parse_vllm_metrics(text)["running"] == 3.0
        samples = parse_samples(text)
        assert samples[("llmfleet:kv_cache_bytes_per_token", ())] == 4 * 2 * 64 * 2 * 2
        assert agreed_shape([shape_samples(samples)]) == shape_from_hf_config(config)
        async with aiohttp.ClientSession() as s, s.get(runners[3][1] + "/metrics") as r:
            assert r.status == 200 and await r.read() == vllm_series(RAY_PAGE)
    finally:
        for runner, _ in reversed(runners):
            await runner.cleanup()
