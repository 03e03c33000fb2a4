"""A pool that names no model preset is planned from the shape its replicas report: the serving wrapper's
`llmfleet:model_shape` gauges (from the model's config.json), read back by the autoscaler's signals (scraped or
through Prometheus: tests/integration/autoscaler/test_autoscaler_prometheus.py) and used for the pool's seed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from llmfleet.api import InferenceService, parse_resource
from llmfleet.api.contracts import MODEL_SHAPE_METRIC
from llmfleet.api.trainingjob import ModelShape
from llmfleet.autoscaler.actuation import ObservedReplica
from llmfleet.autoscaler.capacity import DEFAULT_SEED
from llmfleet.autoscaler.controller import autoscale_step
from llmfleet.autoscaler.policy import PolicyState, PoolSignals
from llmfleet.autoscaler.seeds import known_shapes, seed_for_pool, seeds_for_service
from llmfleet.autoscaler.signals import PoolRef, ScrapeSignals, agreed_shape, shape_samples
from llmfleet.plan.models import PRESETS, shape_dims, shape_from_dims, shape_from_hf_config
from llmfleet.util.prom_text import parse_samples
from llmfleet.workers.serve.worker import served_model_metrics
from tests.local_http import serve_app

# Llama-3-8B's config.json, as on the Hub (the keys the planner reads and a few it does not)
LLAMA_3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256, "torch_dtype": "bfloat16",
}


def service(annotations: dict[str, str] | None = None, gpu_type: str | None = "H200") -> InferenceService:
    """A service whose models come from local folders (no Hub repository, so no preset unless annotated)."""
    resources = {"gpus": 1, **({"gpuType": gpu_type} if gpu_type else {})}
    obj = parse_resource({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "annotations": annotations or {}},
        "spec": {"model": {"path": "/models/ft"}, "replicas": 1, "maxReplicas": 10, "resources": resources,
                 "slo": {"ttftP95Ms": 1000}, "autoscaling": {"policy": "slo"},
                 "fallback": {"pools": [{"name": "small", "model": {"path": "/models/s"}, "replicas": 0,
                                         "maxReplicas": 2}]}},
    })
    assert isinstance(obj, InferenceService)
    return obj


# --- the shape as numbers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_survives_the_trip_through_numbers(name: str) -> None:
    assert shape_from_dims(shape_dims(PRESETS[name])) == PRESETS[name]


def test_a_sliding_window_and_bad_numbers() -> None:
    windowed = PRESETS["mistral-7b"].model_copy(update={"sliding_window": 4096})
    assert shape_from_dims(shape_dims(windowed)) == windowed
    dims = shape_dims(PRESETS["llama-3-8b"])
    with pytest.raises(ValueError, match="kv_heads missing"):
        shape_from_dims({k: v for k, v in dims.items() if k != "kv_heads"})
    with pytest.raises(ValueError, match="layers must be a whole number"):
        shape_from_dims({**dims, "layers": 31.5})
    with pytest.raises(ValueError, match="tie_embeddings must be 0 or 1"):
        shape_from_dims({**dims, "tie_embeddings": 2.0})
    with pytest.raises(ValueError):  # 4096 is not divisible by 3 heads
        shape_from_dims({**dims, "heads": 3.0, "kv_heads": 1.0})


# --- the serving wrapper's gauges ---------------------------------------------------------------------------------

def test_the_wrapper_reports_the_served_models_shape(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B_CONFIG))
    text = served_model_metrics(["--model", str(tmp_path), "--dtype", "bfloat16"]).decode()
    assert agreed_shape([shape_samples(parse_samples(text))]) == PRESETS["llama-3-8b"]
    assert shape_from_hf_config(LLAMA_3_8B_CONFIG) == PRESETS["llama-3-8b"]
    # what the planner has no shape for adds nothing: a mixture-of-experts, a remote or missing model
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(json.dumps({**LLAMA_3_8B_CONFIG, "num_local_experts": 8}))
    moe = served_model_metrics(["--model", str(tmp_path / "moe")]).decode()
    assert "llmfleet:kv_cache_bytes_per_token " in moe and MODEL_SHAPE_METRIC not in moe  # its KV size is known
    assert served_model_metrics(["--model", "hf://org/model"]) == b""
    assert served_model_metrics(["--model", str(tmp_path / "missing")]) == b""


def test_replicas_that_disagree_report_no_shape() -> None:
    small, big = shape_dims(PRESETS["llama-3-8b"]), shape_dims(PRESETS["llama-3-70b"])
    assert agreed_shape([small, {}, small]) == PRESETS["llama-3-8b"]  # a replica reporting none is left out
    assert agreed_shape([small, big]) is None  # a rollout to another model under way
    assert agreed_shape([{}, {}]) is None
    assert agreed_shape([{**small, "layers": 0.0}]) is None  # no valid shape


def _metrics_app(text: str) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


@pytest.mark.timeout(30)
async def test_scraped_signals_carry_the_replicas_shape(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B_CONFIG))
    wrapper = served_model_metrics(["--model", str(tmp_path)]).decode()
    router_text = '# TYPE llmfleet_router_requests counter\nllmfleet_router_requests_total{pool="primary"} 5\n'
    replica_text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n" + wrapper
    runners = []
    try:
        for text in (router_text, replica_text, replica_text):
            runners.append(await serve_app(_metrics_app(text)))
        (_, router), (_, a), (_, b) = runners
        scrape = ScrapeSignals(router)
        pools = [PoolRef("primary", "primary", 2, 2), PoolRef("small", "student", 0, 0)]
        sigs = await scrape.collect(pools, {"primary": [a, b]})
        assert sigs[0].model_shape == PRESETS["llama-3-8b"]
        assert sigs[1].model_shape is None  # no replicas: nothing reported
    finally:
        for runner, _ in runners:
            await runner.cleanup()


# --- seeds --------------------------------------------------------------------------------------------------------

def _same_seed(a: object, b: object) -> bool:
    """Equal seeds: the same numbers at the reference mix and at another (their closures are distinct objects)."""
    from llmfleet.autoscaler.capacity import CapacitySeed

    assert isinstance(a, CapacitySeed) and isinstance(b, CapacitySeed)
    return all(x.for_mix(*mix).prefill_tokens_per_s == y.for_mix(*mix).prefill_tokens_per_s
               and x.for_mix(*mix).decode_tokens_per_s == y.for_mix(*mix).decode_tokens_per_s
               for x, y in ((a, b),) for mix in ((2048, 256, 0.0), (9000, 400, 0.4)))


def test_a_pool_without_a_preset_is_seeded_from_its_reported_shape() -> None:
    reported = {"primary": PRESETS["llama-3-8b"]}
    plain = seeds_for_service(service())
    assert plain["primary"] == DEFAULT_SEED and plain["small"] == DEFAULT_SEED
    from_shape = seeds_for_service(service(), reported)
    annotated = seeds_for_service(service({"llmfleet.io/model-preset": "llama-3-8b"}))
    assert from_shape["primary"] != DEFAULT_SEED and _same_seed(from_shape["primary"], annotated["primary"])
    assert from_shape["small"] == DEFAULT_SEED  # it reported nothing
    # the preset is what the spec says: it wins over what the replicas report
    contrary = seeds_for_service(service({"llmfleet.io/model-preset": "llama-3-8b"}), {"primary": PRESETS["llama-3-70b"]})
    assert _same_seed(contrary["primary"], annotated["primary"])
    # no GPU to plan for (CPU replicas): the default seed, whatever the replicas report
    assert seeds_for_service(service(gpu_type=None), reported)["primary"] == DEFAULT_SEED
    # weights that do not fit the GPU: the default seed, never an autoscaler that stops
    huge = ModelShape(layers=160, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256, seq_len=8192)
    assert seed_for_pool(service().pool("primary"), huge) == DEFAULT_SEED


class _Replicas:
    async def list_replicas(self, pool: str) -> list[ObservedReplica]:
        return [ObservedReplica(pool, "r0", "http://r0", ready=True)] if pool == "primary" else []

    async def set_replicas(self, desired: object, *, reason: str, state_json: str | None = None) -> None:
        pass


class _Loaded:
    """20 req/s of 2,000-token prompts on the one primary, which reports `shape` (or nothing)."""

    def __init__(self, shape: ModelShape | None) -> None:
        self.shape = shape

    async def collect(self, pools: list[PoolRef], now: float | None = None) -> list[PoolSignals]:
        return [PoolSignals(p.name, p.role, now or 0.0, p.replicas, p.ready_replicas, arrival_rate=20.0,
                            queue_depth=0.0, mean_input_tokens=2000, mean_output_tokens=100, ttft_p95_ms=300.0,
                            model_shape=self.shape if p.name == "primary" else None) for p in pools]


def test_a_step_plans_a_pool_without_a_preset_from_its_reported_shape() -> None:
    """At 40k prompt tokens/s the default seed (8k/s per replica) asks for several primaries; Llama-3-8B's roofline
    on an H200 (and so the same shape reported by the replicas) asks for fewer."""
    def desired(isvc: InferenceService, shape: ModelShape | None) -> int:
        result = asyncio.run(autoscale_step(isvc, _Replicas(), _Loaded(shape), PolicyState(), 1000.0))
        return result.decision.pools["primary"].desired

    unplanned = desired(service(), None)
    planned = desired(service(), PRESETS["llama-3-8b"])
    assert planned < unplanned
    assert planned == desired(service({"llmfleet.io/model-preset": "llama-3-8b"}), None)


def test_the_last_agreed_shape_is_remembered_and_persisted() -> None:
    """While the replicas report no shape (restarting, at zero, a rollout where they disagree) the pool keeps the last
    one they agreed on, in the state and in its annotation: its seed, and the efficiency learned against it, do not
    fall back to the default and return."""
    first = asyncio.run(autoscale_step(service(), _Replicas(), _Loaded(PRESETS["llama-3-8b"]), PolicyState(), 1000.0))
    state = first.decision.state
    assert state.pools["primary"].model_shape == shape_dims(PRESETS["llama-3-8b"])
    assert state.pools["small"].model_shape is None  # it reported nothing
    restored = PolicyState.from_json(state.to_json(5.0), 5.0)
    assert restored.pools["primary"].model_shape == shape_dims(PRESETS["llama-3-8b"])
    for st in (state, restored):
        later = asyncio.run(autoscale_step(service(), _Replicas(), _Loaded(None), st, 1015.0))
        assert later.decision.pools["primary"].desired == first.decision.pools["primary"].desired
        assert later.decision.state.pools["primary"].model_shape == shape_dims(PRESETS["llama-3-8b"])
    # what the replicas report now wins over what was remembered
    assert known_shapes([_signals("primary", PRESETS["llama-3-70b"])], state)["primary"] == PRESETS["llama-3-70b"]
    # an annotation edited into something that is no shape is left out, never an error
    bad = json.loads(state.to_json())
    bad["primary"]["modelShape"]["layers"] = 0.5
    assert known_shapes([], PolicyState.from_json(json.dumps(bad))) == {}
    bad["primary"]["modelShape"] = {"layers": "many"}
    assert PolicyState.from_json(json.dumps(bad)).pools["primary"].model_shape is None


def _signals(pool: str, shape: ModelShape | None) -> PoolSignals:
    return PoolSignals(pool, "primary", 0.0, 1, 1, model_shape=shape)


def test_cli_decide_reads_a_reported_shape(tmp_path: Path) -> None:
    """`llmfleet autoscaler decide --signals`: a primary's `model_shape` (ModelShape's fields) plans a service that
    names no preset, as the controller does."""
    import yaml
    from typer.testing import CliRunner

    from llmfleet.cli.main import app

    svc = tmp_path / "svc.yaml"
    svc.write_text(yaml.safe_dump(service().model_dump(by_alias=True, exclude_none=True, mode="json")))
    base = {"pool": "primary", "role": "primary", "now": 0.0, "replicas": 1, "ready_replicas": 1, "arrival_rate": 20.0,
            "mean_input_tokens": 2000, "mean_output_tokens": 100, "queue_depth": 0, "ttft_p95_ms": 300.0}
    student = {"pool": "small", "role": "student", "now": 0.0, "replicas": 0, "ready_replicas": 0}

    def desired(primary: dict[str, object]) -> int:
        sigs = tmp_path / "sigs.json"
        sigs.write_text(json.dumps([primary, student]))
        res = CliRunner().invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs)])
        assert res.exit_code == 0, res.output
        return int(json.loads(res.output)["pools"]["primary"]["desired"])

    shape = PRESETS["llama-3-8b"].model_dump(mode="json")
    assert desired({**base, "model_shape": shape}) < desired(base)
    # a shape missing what ModelShape's training defaults would fill in wrongly: one line naming the field
    sigs = tmp_path / "partial.json"
    sigs.write_text(json.dumps([{**base, "model_shape": {"layers": 32, "hidden": 4096, "heads": 32}}, student]))
    res = CliRunner().invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs)])
    assert res.exit_code == 2 and "0/model_shape: Value error, a model shape needs vocab, seq_len" in res.output
    # the printed state keeps the shape, so a decision from it (--state) is planned from it too
    sigs, state = tmp_path / "sigs.json", tmp_path / "state.json"
    sigs.write_text(json.dumps([{**base, "model_shape": shape}, student]))
    res = CliRunner().invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs)])
    state.write_text(json.dumps(json.loads(res.output)["state"]))
    sigs.write_text(json.dumps([base, student]))
    res = CliRunner().invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs), "--state", str(state)])
    assert res.exit_code == 0 and json.loads(res.output)["pools"]["primary"]["desired"] == desired(
        {**base, "model_shape": shape})


class _CountValues:
    """prometheus-api-client's custom_query answering `shape_query` as Prometheus does: one series per (dim,
    distinct value), the value in label `value` as Prometheus formats it."""

    def __init__(self, *replicas: dict[str, float]) -> None:
        self.replicas = replicas
        self.queries: list[str] = []

    def custom_query(self, promql: str, timeout: int) -> list[dict[str, Any]]:
        self.queries.append(promql)
        counts: dict[tuple[str, str], int] = {}
        for dims in self.replicas:
            for dim, v in dims.items():
                key = (dim, repr(v).removesuffix(".0"))  # shortest round trip, as Go's FormatFloat(v, 'f', -1)
                counts[key] = counts.get(key, 0) + 1
        return [{"metric": {"dim": d, "value": v}, "value": [0, str(n)]} for (d, v), n in counts.items()]


def test_prometheus_shape_is_one_count_values_query() -> None:
    from llmfleet.autoscaler.signals import PrometheusSignals, Selectors, shape_query

    sig = PrometheusSignals("http://127.0.0.1:9", "chat")
    small, big = shape_dims(PRESETS["llama-3-8b"]), shape_dims(PRESETS["llama-3-70b"])
    promql = shape_query("chat", "default", "primary", Selectors())
    assert promql.startswith('count_values by (dim) ("value", {__name__=~"llmfleet[:_]model_shape",')
    sig._prom = _CountValues(small, small, {})  # type: ignore[assignment]
    assert sig._query_shape(promql) == PRESETS["llama-3-8b"]
    sig._prom = _CountValues(small, big)  # type: ignore[assignment]  # a rollout: two values of some fields
    assert sig._query_shape(promql) is None
    sig._prom = _CountValues()  # type: ignore[assignment]
    assert sig._query_shape(promql) is None
    sig._prom = _CountValues(small)  # type: ignore[assignment]
    sig._prom.custom_query = lambda q, timeout: [{"metric": {"dim": "layers", "value": "x"}}]  # type: ignore[method-assign]
    assert sig._query_shape(promql) is None  # no number: left out, and no shape without its layers


@pytest.mark.timeout(30)
async def test_scrapes_run_at_once_and_a_failing_replica_marks_only_its_pool() -> None:
    """Replica a answers only once replica b has been asked: one at a time, a's scrape would time out."""
    b_asked = asyncio.Event()
    page = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"

    async def a_metrics(_: web.Request) -> web.Response:
        await asyncio.wait_for(b_asked.wait(), 5)
        b_asked.clear()  # each collect: b asked before a can answer
        return web.Response(text=page, content_type="text/plain")

    async def b_metrics(_: web.Request) -> web.Response:
        b_asked.set()
        return web.Response(text=page, content_type="text/plain")

    async def broken(_: web.Request) -> web.Response:
        return web.Response(status=500)

    apps = []
    for handler in (b_metrics, a_metrics, b_metrics, broken):
        app = web.Application()
        app.router.add_get("/metrics", handler)
        apps.append(app)
    apps[0] = _metrics_app('llmfleet_router_requests_total{pool="primary"} 5\n')
    runners = [await serve_app(app) for app in apps]
    try:
        (_, router), (_, a), (_, b), (_, bad) = runners
        scrape = ScrapeSignals(router, timeout_s=2.0)
        pools = [PoolRef("primary", "primary", 2, 2), PoolRef("small", "student", 1, 1)]
        urls = {"primary": [a, b], "small": [bad]}
        await scrape.collect(pools, urls)  # the first collect has no earlier one to take rates from
        primary, small = await scrape.collect(pools, urls)
        assert not primary.stale and small.stale
        assert primary.running == 2  # both replicas' gauges
    finally:
        for runner, _ in runners:
            await runner.cleanup()


@pytest.mark.timeout(30)
async def test_the_drain_probe_counts_running_and_waiting() -> None:
    """scrape_in_flight (the drain's probe): vLLM's running + waiting over every engine; None when a page has neither,
    answers an error or is not a metrics page."""
    from llmfleet.autoscaler.actuation import ObservedReplica, scrape_in_flight

    pages = {
        "/busy/metrics": ('vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 1\n'
                          'vllm:num_requests_waiting{engine="0"} 4\nvllm:num_requests_waiting_by_reason 9\n', 200),
        "/idle/metrics": ("vllm:num_requests_running 0\n", 200),
        "/other/metrics": ("python_gc_objects_collected_total 3\n", 200),
        "/broken/metrics": ("vllm:num_requests_running{engine=0} 1\n", 200),
        "/down/metrics": ("", 503),
    }

    async def metrics(request: web.Request) -> web.Response:
        text, status = pages[request.path]
        return web.Response(text=text, status=status, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{name}/metrics", metrics)
    runner, url = await serve_app(app)
    try:
        got = {name: await scrape_in_flight(ObservedReplica("p", name, f"{url}/{name}"))
               for name in ("busy", "idle", "other", "broken", "down")}
    finally:
        await runner.cleanup()
    assert got == {"busy": 7, "idle": 0, "other": None, "broken": None, "down": None}


@pytest.mark.timeout(30)
async def test_scrapes_past_the_connection_bound_wait_for_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet larger than SCRAPE_CONNECTIONS with slow replicas: the scrapes in flight stay within the bound, and
    those queued behind two rounds of slow answers still count (httpx's default pool wait, the request timeout,
    failed them and marked the pool stale)."""
    import llmfleet.autoscaler.signals as signals

    monkeypatch.setattr(signals, "SCRAPE_CONNECTIONS", 8)
    in_flight, most = 0, 0

    async def slow(_: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.3)
        in_flight -= 1
        return web.Response(text="vllm:num_requests_running 1\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", slow)
    app.router.add_get("/{replica}/metrics", slow)
    runner, url = await serve_app(app)
    try:
        scrape = ScrapeSignals(url, timeout_s=0.7)  # four rounds of 0.3 s: the last waits past the timeout
        pools = [PoolRef("primary", "primary", 1, 32)]
        urls = {"primary": [f"{url}/r{i}" for i in range(31)]}
        await scrape.collect(pools, urls)
        (primary,) = await scrape.collect(pools, urls)
    finally:
        await runner.cleanup()
    assert most == 8
    assert not primary.stale and primary.running == 31
