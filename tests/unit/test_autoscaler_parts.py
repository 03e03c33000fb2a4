"""Unit tests of the autoscaler's pure parts: scale-in choice, arbitration, signals math, actuation patches,
planner seeds and the `llmfleet autoscaler decide` command."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.api import InferenceService, parse_resource
from llmfleet.api.contracts import SUSPENDED_BY_ANNOTATION
from llmfleet.autoscaler.actuation import ObservedReplica, replicas_patch, wait_drained
from llmfleet.autoscaler.arbitration import (
    UNBOUNDED,
    MalformedTrainingJob,
    ServingNeed,
    TrainingJobInfo,
    arbitrate,
    job_info,
    job_infos,
    job_patch,
    serving_need,
)
from llmfleet.autoscaler.policy import PolicyConfig
from llmfleet.autoscaler.scalein import choose_victims, lost_blocks_from_index, lost_blocks_from_metrics
from llmfleet.autoscaler.seeds import seed_from_capacity, seeds_for_service
from llmfleet.autoscaler.signals import (
    PoolRef,
    Selectors,
    assemble,
    build_queries,
    histogram_quantile,
    values_from_scrapes,
)
from llmfleet.cli.main import app
from llmfleet.util.prom_text import parse_samples

ISVC_DOC = {
    "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
    "metadata": {"name": "chat", "annotations": {"llmfleet.io/model-preset": "llama-3-8b"}},
    "spec": {"model": {"path": "/m"}, "replicas": 2, "maxReplicas": 10, "resources": {"gpus": 1, "gpuType": "H200"},
             "slo": {"ttftP95Ms": 1000},
             "fallback": {"pools": [{"name": "small", "model": {"path": "/s"}, "replicas": 0, "maxReplicas": 2}]}},
}


def isvc() -> InferenceService:
    obj = parse_resource(ISVC_DOC)
    assert isinstance(obj, InferenceService)
    return obj


# --- cache-aware scale-in ---------------------------------------------------------------------------------------

def test_choose_victims_prefers_not_ready_then_fewest_exclusive_blocks_then_idle() -> None:
    reps = [ObservedReplica("primary", "a", "http://a:8000"), ObservedReplica("primary", "b", "http://b:8000"),
            ObservedReplica("primary", "c", "http://c:8000"), ObservedReplica("primary", "d", "http://d:8000", ready=False)]
    lost = {"http://a:8000": 500, "http://b:8000": 20, "http://c:8000": 20}
    flight = {"http://b:8000": 5.0, "http://c:8000": 1.0}
    assert [r.name for r in choose_victims(reps, 3, lost, flight)] == ["d", "c", "b"]
    # a replica the index does not know is never chosen on a guess while others are known
    assert [r.name for r in choose_victims(reps[:2] + [ObservedReplica("primary", "x", "http://x:8000")], 1, lost)] == ["b"]
    assert choose_victims(reps, 0, lost) == []


def test_lost_blocks_from_the_router_prefix_index() -> None:
    from llmfleet.router.block_keys import BlockHasher
    from llmfleet.router.prefix_index import PrefixIndex

    index = PrefixIndex()
    shared = BlockHasher(1).keys(list(range(10)))
    only_a = BlockHasher(1).keys(list(range(100, 140)))
    index.insert("http://a:8000", shared + only_a)
    index.insert("http://b:8000", shared)
    reps = [ObservedReplica("primary", "a", "http://a:8000"), ObservedReplica("primary", "b", "http://b:8000")]
    lost = lost_blocks_from_index(index, reps)
    assert lost["http://a:8000"] > lost["http://b:8000"]
    assert choose_victims(reps, 1, lost)[0].name == "b"


def test_lost_blocks_from_router_metrics() -> None:
    text = ('# TYPE llmfleet_router_replica_exclusive_blocks gauge\n'
            'llmfleet_router_replica_exclusive_blocks{pool="primary",replica="http://a:8000"} 12\n'
            'llmfleet_router_replica_exclusive_blocks{pool="small",replica="http://s:8000"} 3\n')
    assert lost_blocks_from_metrics(parse_samples(text), "primary") == {"http://a:8000": 12}


# --- arbitration -------------------------------------------------------------------------------------------------

JOBS = [TrainingJobInfo("low", -5, 4, False), TrainingJobInfo("lower", -10, 2, False),
        TrainingJobInfo("high", 10, 8, False), TrainingJobInfo("done", -20, 8, False, finished=True)]


@pytest.mark.parametrize("missing,expected", [(1, ["lower"]), (2, ["lower"]), (3, ["lower", "low"]), (100, ["lower", "low"])])
def test_arbitrate_suspends_lowest_priority_until_covered(missing: int, expected: list[str]) -> None:
    acts = arbitrate(ServingNeed("chat", 0, burning=True, gpus_missing=missing, gpus_surplus=0), JOBS)
    assert [a.job for a in acts] == expected and all(a.action == "suspend" for a in acts)


def test_arbitrate_needs_burning_and_missing_gpus_and_resumes_only_its_own() -> None:
    assert arbitrate(ServingNeed("chat", 0, burning=False, gpus_missing=4, gpus_surplus=0), JOBS) == []
    assert arbitrate(ServingNeed("chat", 0, burning=True, gpus_missing=0, gpus_surplus=0), JOBS) == []
    jobs = [TrainingJobInfo("mine", -5, 4, True, suspended_by="chat"), TrainingJobInfo("other", -5, 4, True)]
    acts = arbitrate(ServingNeed("chat", 0, burning=False, gpus_missing=0, gpus_surplus=UNBOUNDED), jobs)
    assert [(a.job, a.action) for a in acts] == [("mine", "resume")]
    assert arbitrate(ServingNeed("chat", 0, burning=True, gpus_missing=0, gpus_surplus=UNBOUNDED), jobs) == []


def test_serving_need_budget_and_pending() -> None:
    n = serving_need("chat", 0, gpu_budget=4, desired_gpus=6, pending_gpus=0, burning=True)
    assert n.gpus_missing == 2 and n.gpus_surplus == 0
    n = serving_need("chat", 0, gpu_budget=None, desired_gpus=6, pending_gpus=2, burning=True)
    assert n.gpus_missing == 2
    n = serving_need("chat", 0, gpu_budget=8, desired_gpus=6, pending_gpus=0, burning=False)
    assert n.gpus_missing == 0 and n.gpus_surplus == UNBOUNDED


def test_job_info_and_patch() -> None:
    obj = {"metadata": {"name": "j", "annotations": {SUSPENDED_BY_ANNOTATION: "chat"}},
           "spec": {"workers": {"count": 2, "gpusPerWorker": 4}, "scheduling": {"priority": -3}, "suspend": True},
           "status": {"phase": "Suspended"}}
    assert job_info(obj) == TrainingJobInfo("j", -3, 8, True, "chat", False)
    acts = arbitrate(ServingNeed("chat", 0, True, 1, 0), [TrainingJobInfo("j", -3, 8, False)])
    assert job_patch(acts[0], "chat") == {"metadata": {"annotations": {SUSPENDED_BY_ANNOTATION: "chat"}},
                                          "spec": {"suspend": True}}


def test_a_malformed_job_is_left_out_and_the_others_are_arbitrated() -> None:
    good = {"metadata": {"name": "good"}, "spec": {"workers": {"count": 2, "gpusPerWorker": 2}}}
    bad = {"metadata": {"name": "bad"}, "spec": {"workers": {"count": "two", "gpusPerWorker": 2}}}
    worse = {"metadata": {"name": "worse"}, "spec": "string"}
    with pytest.raises(MalformedTrainingJob, match=r"^spec.workers.count: expected an integer, got 'two'"):
        job_info(bad)
    infos, skipped = job_infos([bad, good, worse])
    assert [i.name for i in infos] == ["good"]
    assert skipped == {"bad": "spec.workers.count: expected an integer, got 'two'",
                       "worse": "spec: expected an object, got str"}
    acts = arbitrate(ServingNeed("chat", 1, True, 1, 0), infos)
    assert [(a.job, a.action) for a in acts] == [("good", "suspend")]


# --- signals -----------------------------------------------------------------------------------------------------

def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    buckets = {0.1: 10.0, 0.5: 60.0, 1.0: 90.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (50 - 10) / 50)
    assert histogram_quantile(0.95, buckets) == 1.0  # falls in +Inf: the highest finite bound
    assert histogram_quantile(0.95, {}) is None


def test_build_queries_select_pool_and_service() -> None:
    q = build_queries("chat", "ml", "small", "student", Selectors(), "1m")
    assert 'pool="small"' in q["arrival_rate"] and 'llmfleet_io_inferenceservice="chat"' in q["arrival_rate"]
    assert 'vllm[:_]num_requests_waiting' in q["queue_depth"] and 'llmfleet_io_pool="small"' in q["queue_depth"]
    primary = build_queries("chat", "ml", "primary", "primary", Selectors(), "1m")
    assert 'pool="primary"' not in primary["arrival_rate"]  # the primary is sized for the whole service
    # The error rate is the pool's own, for the primary too.
    assert 'pool="primary",outcome="error"' in primary["error_rate"]
    assert 'vllm[:_]request_queue_time_seconds_bucket' in q["queue_time_p95_ms"]
    # running sequences over KV usage, both summed over the pool's engines (either name of vLLM's usage gauge)
    assert q["kv_full_sequences"].startswith('sum({__name__=~"vllm[:_]num_requests_running"')
    assert 'vllm[:_]kv_cache_usage_perc' in q["kv_full_sequences"] and 'llmfleet_io_pool="small"' in q["kv_full_sequences"]
    assert 'llmfleet_router_upstream_attempts_total{llmfleet_io_inferenceservice="chat",pool="small"}' in q["error_rate"]
    # the prompt-length moments: each power sum over the input-token histogram's count, the pool's own
    assert q["input_tokens_power_3"] == (
        'sum(rate(llmfleet_router_input_tokens_power_total{llmfleet_io_inferenceservice="chat",pool="small",power="3"}'
        '[1m])) / sum(rate(llmfleet_router_input_tokens_count{llmfleet_io_inferenceservice="chat",pool="small"}[1m]))')


def test_values_from_two_scrapes_and_staleness() -> None:
    def router(n: float, slow: float) -> str:
        return ('# TYPE llmfleet_router_requests counter\n'
                f'llmfleet_router_requests_total{{pool="primary",degraded="false"}} {n}\n'
                f'llmfleet_router_requests_total{{pool="small",degraded="true"}} {n / 10}\n'
                '# TYPE llmfleet_router_ttft_seconds histogram\n'
                f'llmfleet_router_ttft_seconds_bucket{{pool="primary",le="0.5"}} {n - slow}\n'
                f'llmfleet_router_ttft_seconds_bucket{{pool="primary",le="2.0"}} {n}\n'
                f'llmfleet_router_ttft_seconds_bucket{{pool="primary",le="+Inf"}} {n}\n'
                f'llmfleet_router_ttft_seconds_count{{pool="primary"}} {n}\n'
                f'llmfleet_router_ttft_seconds_sum{{pool="primary"}} {n * 0.3}\n'
                '# TYPE llmfleet_router_upstream_attempts counter\n'
                f'llmfleet_router_upstream_attempts_total{{pool="primary",outcome="ok"}} {n}\n'
                f'llmfleet_router_upstream_attempts_total{{pool="primary",outcome="error"}} {slow * 3}\n'
                f'llmfleet_router_upstream_attempts_total{{pool="primary",outcome="overloaded"}} {slow}\n'
                f'llmfleet_router_upstream_attempts_total{{pool="small",outcome="error"}} {n}\n'
                '# TYPE llmfleet_router_input_tokens histogram\n'
                f'llmfleet_router_input_tokens_count{{pool="primary",model="m"}} {n}\n'
                f'llmfleet_router_input_tokens_sum{{pool="primary",model="m"}} {n * 1000}\n'
                '# TYPE llmfleet_router_input_tokens_power counter\n'
                + "".join(f'llmfleet_router_input_tokens_power_total{{pool="primary",model="m",power="{k}"}} '
                          f'{n * 3 * 1000.0 ** k}\n' for k in (2, 3, 4)))
    replica = ('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 4\n'
               '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n'
               '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.25\n'
               '# TYPE vllm:request_queue_time_seconds histogram\n'
               'vllm:request_queue_time_seconds_bucket{le="0.1"} 90\n'
               'vllm:request_queue_time_seconds_bucket{le="1.0"} 100\n'
               'vllm:request_queue_time_seconds_bucket{le="+Inf"} 100\n'
               'vllm:request_queue_time_seconds_count 100\nvllm:request_queue_time_seconds_sum 8\n')
    pool = PoolRef("primary", "primary", 2, 2)
    v = values_from_scrapes(pool, parse_samples(router(100, 0)), parse_samples(router(200, 10)),
                            {}, parse_samples(replica), 10.0)
    assert v["arrival_rate"] == pytest.approx(11.0)  # (100 + 10) / 10 s, the service's whole demand
    assert v["degraded_fraction"] == pytest.approx(10 / 110)
    assert v["error_rate"] == pytest.approx(30 / (100 + 30 + 10))  # this pool's failed tries / all its tries
    assert 500 < v["ttft_p95_ms"] <= 2000  # type: ignore[operator]
    assert v["queue_depth"] == 4 and v["running"] == 2
    # 2 running sequences in a quarter of the cache: a full one holds 8 of them; averaged over 2 replicas, 12.5 % each
    assert v["kv_full_sequences"] == pytest.approx(8.0) and v["kv_utilization"] == pytest.approx(0.125)
    assert 100 < v["queue_time_p95_ms"] <= 1000  # type: ignore[operator]  # in the (0.1, 1] s bucket
    assert v["input_tokens_power_2"] == pytest.approx(3e6) and v["input_tokens_power_4"] == pytest.approx(3e12)
    fresh = assemble(pool, 0.0, {**v, "router_age_s": 1.0, "replica_age_s": 1.0}, stale_after_s=30)
    assert not fresh.stale and fresh.arrival_rate == pytest.approx(11.0)
    assert fresh.input_tokens_moments == pytest.approx((3e6, 3e9, 3e12))
    assert fresh.queue_time_p95_ms == v["queue_time_p95_ms"]
    assert fresh.kv_full_sequences == pytest.approx(8.0)
    # an empty cache measures no footprint (never a division by zero)
    idle = values_from_scrapes(pool, {}, {}, {}, parse_samples(replica.replace("kv_cache_usage_perc 0.25",
                                                                               "kv_cache_usage_perc 0")), 10.0)
    assert idle["kv_full_sequences"] is None
    # one power missing: no moments (the policy then assumes M/M/c's spread), never a partial tuple
    assert assemble(pool, 0.0, {**v, "input_tokens_power_3": None}, stale_after_s=30).input_tokens_moments is None
    old = assemble(pool, 0.0, {**v, "router_age_s": 100.0, "replica_age_s": 1.0}, stale_after_s=30)
    assert old.stale
    assert assemble(pool, 0.0, {}, stale_after_s=30).stale


# --- actuation ----------------------------------------------------------------------------------------------------

def test_replicas_patch_targets_primary_and_students() -> None:
    spec = {"replicas": 2, "fallback": {"pools": [{"name": "a"}, {"name": "b", "replicas": 1}]}}
    ops = replicas_patch(spec, {"primary": 3, "b": 0})
    assert {"op": "test", "path": "/spec/fallback/pools/1/name", "value": "b"} in ops
    assert {"op": "replace", "path": "/spec/fallback/pools/1/replicas", "value": 0} in ops
    assert {"op": "replace", "path": "/spec/replicas", "value": 3} in ops
    assert {"op": "add", "path": "/spec/fallback/pools/0/replicas", "value": 1} in replicas_patch(spec, {"a": 1})
    with pytest.raises(KeyError):
        replicas_patch(spec, {"zzz": 1})


def test_wait_drained_polls_until_idle_and_never_guesses() -> None:
    values = iter([3.0, None, 1.0, 0.0])

    async def probe(_: ObservedReplica) -> float | None:
        return next(values)

    drained, _, last = asyncio.run(wait_drained(ObservedReplica("p", "r"), probe, timeout_s=5, poll_s=0.01))
    assert drained and last == 0.0

    async def unknown(_: ObservedReplica) -> float | None:
        return None

    drained, waited, last = asyncio.run(wait_drained(ObservedReplica("p", "r"), unknown, timeout_s=0.05, poll_s=0.01))
    assert not drained and last is None and waited >= 0.05


# --- planner seeds ------------------------------------------------------------------------------------------------

def test_seeds_come_from_the_planner_roofline() -> None:
    from llmfleet.plan.capacity import TrafficShape, replica_capacity
    from llmfleet.plan.hardware import get_gpu
    from llmfleet.plan.models import get_model
    from llmfleet.plan.roofline import StepCostModel

    w = TrafficShape(input_tokens=2048, output_tokens=256)
    cap = replica_capacity(get_model("llama-3-8b"), get_gpu("H200"), w)
    seed = seed_from_capacity(cap, w)
    # a replica's throughput prices each prefill batched with the running decodes, not as a step of its own
    assert seed.prefill_tokens_per_s == pytest.approx(2048 / cap.prefill_batched_s)
    assert cap.prefill_batched_s < cap.prefill_s
    # with the step cost model it also carries what the queueing estimate reads: the decodes' FLOPs alone (a decode
    # step is memory-bound, so compute-only decoding is several times faster) and the prefill's attention ratio
    cost = StepCostModel.build(get_model("llama-3-8b"), get_gpu("H200"))
    full = seed_from_capacity(cap, w, cost)
    assert full.prefill_tokens_per_s == seed.prefill_tokens_per_s
    assert full.decode_compute_tokens_per_s == pytest.approx(1.0 / cost.decode_compute_time(2048 + 128))
    assert full.decode_compute_tokens_per_s > 3 * full.decode_tokens_per_s  # type: ignore[operator]
    assert full.prefill_attention_ratio == pytest.approx(cost.attn_flops_per_ctx / (2 * cost.flops_per_token))
    assert seed.decode_compute_tokens_per_s is None and seed.prefill_attention_ratio == 0.0
    seeds = seeds_for_service(isvc())
    assert seeds["primary"].prefill_tokens_per_s > 1000
    assert seeds["small"].prefill_tokens_per_s == 8000.0  # no preset/GPU for the student: default seed
    cfg = PolicyConfig.from_service(isvc(), seeds=seeds)
    assert cfg.pool("primary").seed == seeds["primary"]


def test_a_planner_seed_is_the_roofline_at_any_measured_mix() -> None:
    """The primary's seed carries the planner's roofline at another mix: long prompts make a replica slower per token
    (attention over the prompt, the batch's KV read every decode step), so Mooncake-like requests get the planner's
    throughput at their own shape rather than at the 2,048 / 256 reference. The student without a preset keeps the
    default seed at every mix, and an unmeasured mix keeps the reference."""
    from llmfleet.autoscaler.capacity import DEFAULT_SEED
    from llmfleet.plan.capacity import TrafficShape, replica_capacity
    from llmfleet.plan.hardware import get_gpu
    from llmfleet.plan.models import get_model
    from llmfleet.plan.roofline import StepCostModel

    seeds = seeds_for_service(isvc())
    ref = seeds["primary"]
    assert ref.for_mix(2048, 256, 0.0) == ref and ref.for_mix(None, 256, 0.0) is ref
    w = TrafficShape(input_tokens=15000, output_tokens=170, prefix_hit_rate=0.1, ttft_slo_s=1.0, tpot_slo_s=0.1)
    cost = StepCostModel.build(get_model("llama-3-8b"), get_gpu("H200"))
    expected = seed_from_capacity(replica_capacity(get_model("llama-3-8b"), get_gpu("H200"), w), w, cost)
    long = ref.for_mix(15000.4, 169.6, 0.1)  # means are fractional: whole tokens
    assert long == expected
    assert long.prefill_tokens_per_s < 0.95 * ref.prefill_tokens_per_s  # attention over a 15k prompt
    assert long.decode_tokens_per_s < 0.5 * ref.decode_tokens_per_s  # KV reads of 15k-token contexts
    assert ref.for_mix(3000, 100, 7.0) == ref.for_mix(3000, 100, 1.0)  # a hit rate is clamped to [0, 1]
    assert seeds["small"] == DEFAULT_SEED and seeds["small"].for_mix(15000, 170, 0.1) is seeds["small"]


# --- CLI ----------------------------------------------------------------------------------------------------------

def test_cli_decide_prints_decision_and_rejects_bad_input(tmp_path: Path) -> None:
    import yaml

    svc = tmp_path / "svc.yaml"
    svc.write_text(yaml.safe_dump(ISVC_DOC))
    sigs = tmp_path / "sigs.json"
    sigs.write_text(json.dumps([
        {"pool": "primary", "role": "primary", "now": 0.0, "replicas": 2, "ready_replicas": 2, "arrival_rate": 40.0,
         "mean_input_tokens": 2000, "mean_output_tokens": 200, "queue_depth": 20},
        {"pool": "small", "role": "student", "now": 0.0, "replicas": 0, "ready_replicas": 0, "arrival_rate": 0.0},
    ]))
    runner = CliRunner()
    res = runner.invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["pools"]["primary"]["action"] == "up" and out["pools"]["primary"]["desired"] > 2
    sigs.write_text(json.dumps([{"pool": "primary"}]))
    res = runner.invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs)])
    assert res.exit_code == 2 and "error:" in res.output and "0/replicas: Field required" in res.output
    base = {"pool": "primary", "role": "primary", "now": 0.0, "replicas": 2, "ready_replicas": 2}
    # Each bad value exits 2 with one line naming its field, never a traceback.
    for bad, named in (({"mean_input_tokens": "x"}, "0/mean_input_tokens"),
                       ({"input_tokens_moments": [1.0, 2.0]}, "0/input_tokens_moments"),
                       ({"arrival_rates": 3.0}, "0/arrival_rates"),
                       ({"ttft_p95_ms": "nan"}, "0/ttft_p95_ms"),
                       ({"role": "teacher"}, "0/role"),
                       ({"replicas": -1}, "0/replicas: Input should be greater than or equal to 0 (got -1)"),
                       ({"kv_full_sequences": -3.0}, "0/kv_full_sequences: Input should be greater than or equal to 0 (got -3)"),
                       ({"arrival_rate": -1.0}, "0/arrival_rate: Input should be greater than or equal to 0"),
                       ({"prefix_hit_rate": 1.5}, "0/prefix_hit_rate: Input should be less than or equal to 1 (got 1.5)"),
                       ({"window_s": 0.0}, "0/window_s: Input should be greater than 0 (got 0)"),
                       ({"input_tokens_moments": [1.0, -2.0, 3.0]}, "0/input_tokens_moments/1: Input should be greater than or equal to 0")):
        sigs.write_text(json.dumps([{**base, **bad}]))
        res = runner.invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs)])
        assert res.exit_code == 2 and named in res.output, (bad, res.output)
        assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    sigs.write_text(json.dumps({"pool": "primary"}))  # an object, not a list
    res = runner.invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs)])
    assert res.exit_code == 2 and "valid list" in res.output
    # --state: a state annotation's value; a file that is no JSON object is reported, not silently read as fresh
    sigs.write_text(json.dumps([base, {**base, "pool": "small", "role": "student", "replicas": 0, "ready_replicas": 0}]))
    state = tmp_path / "state.json"
    for text, said in (("[1, 2]", "a policy state is a JSON object"), ("{bad", "state.json")):
        state.write_text(text)
        res = runner.invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs), "--state", str(state)])
        assert res.exit_code == 2 and said in res.output and len(res.output.strip().splitlines()) == 1, res.output
    state.write_text("{}")
    res = runner.invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs), "--state", str(state)])
    assert res.exit_code == 0, res.output
    # a readable state is restored, not started fresh: its measured cold start comes back in the decision's state
    state.write_text(json.dumps({"primary": {"coldStartSeconds": 123.0}}))
    res = runner.invoke(app, ["autoscaler", "decide", str(svc), "--signals", str(sigs), "--state", str(state)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["state"]["primary"]["coldStartSeconds"] == 123.0


def test_kopf_handlers_register_a_timer_on_import() -> None:
    """In a subprocess: importing registers on kopf's default registry, which the operator tests also use."""
    import subprocess
    import sys

    code = ("import kopf, llmfleet.autoscaler.kopf_handlers as kh\n"
            "hs = kopf.get_default_registry()._spawning._handlers\n"
            "print(any(getattr(h, 'fn', None) is kh.autoscale_inferenceservice for h in hs))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"


def test_every_numeric_signal_declares_its_range() -> None:
    """A numeric PoolSignals field added later is refused below its range by the JSON reader (its type carries the
    range), so `decide --signals` cannot plan from a sign slip in it. `now` is a clock reading, not a measurement."""
    import dataclasses
    import typing

    from llmfleet.autoscaler.types import PoolSignals, signals_from_json

    base = {"pool": "primary", "role": "primary", "now": 0.0, "replicas": 2, "ready_replicas": 2}
    hints = typing.get_type_hints(PoolSignals)
    numeric = [f.name for f in dataclasses.fields(PoolSignals)
               if f.name != "now" and any(t in str(hints[f.name]) for t in ("float", "int"))]
    assert {"arrival_rate", "kv_full_sequences", "input_tokens_moments", "window_s", "replicas"} <= set(numeric)
    for name in numeric:
        bad = [1.0, -1.0, 1.0] if name == "input_tokens_moments" else (0 if name == "window_s" else -1)
        with pytest.raises(ValueError, match=f"0/{name}"):
            signals_from_json([{**base, name: bad}])
    assert signals_from_json([{**base, "now": -5.0, "kv_utilization": 1.0, "window_s": 0.5}])[0].now == -5.0


def test_the_kubernetes_timer_decides_on_its_interval_held_requests_or_a_burst() -> None:
    """A burst marked by the wake-up daemon makes the next tick decide once the router's detection window has passed
    since the last decision; otherwise the interval rules (or held requests). In a subprocess, as above."""
    import subprocess
    import sys

    code = ("import llmfleet.autoscaler.kopf_handlers as kh\n"
            "from llmfleet.autoscaler.controller import Burst\n"
            "from llmfleet.autoscaler.policy import PolicyState\n"
            "m = kh._Memory(PolicyState(), last_run=100.0)\n"
            "r = [kh._due(m, 15.0, 102.0), kh._due(m, 15.0, 115.0)]\n"
            "m.burst = Burst(30.0, 3.0)\n"
            "r += [kh._due(m, 15.0, 102.0), kh._due(m, 15.0, 103.5)]\n"
            "m.burst, m.held = None, {'small': 1}\n"
            "r += [kh._due(m, 15.0, 100.5)]\n"
            "m.held, m.follow_up_at = {}, 103.0\n"  # a woken decision that measured a diluted burst asked for one more
            "r += [kh._due(m, 15.0, 102.5), kh._due(m, 15.0, 103.0)]\n"
            "print(r)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[False, True, False, True, True, False, True]"


def test_the_kubernetes_timer_decides_again_when_a_step_asks_for_a_follow_up() -> None:
    """The timer handler itself, ticking every second on a fake clock: a step that returns follow_up_s = 3 is decided
    again 3 s later (not at the next tick), and that one, asking for none, is followed by the regular interval. The
    step, the router's metrics and arbitration are stubbed; the handler's memory and `_due` are the real ones. In a
    subprocess, like the other kopf_handlers tests (importing registers handlers)."""
    code = """
import asyncio, kopf
import llmfleet.autoscaler.kopf_handlers as kh
from llmfleet.autoscaler.controller import StepResult
from llmfleet.autoscaler.policy import PolicyState
from llmfleet.autoscaler.types import ScalingDecision

clock, calls = [100.0], []
kh.time.monotonic = lambda: clock[0]

async def step(isvc, actuator, source, state, now, **kw):
    calls.append(now)
    return StepResult(ScalingDecision(now, "slo", {}, PolicyState()), follow_up_s=3.0 if len(calls) == 1 else None)

async def nothing(*a, **kw):
    return None

kh.autoscale_step, kh._lost_blocks, kh._arbitrate = step, nothing, nothing
memo = kopf.Memo()
kh.share_client(memo, lambda: object())
body = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "s", "namespace": "default", "uid": "u1"},
        "spec": {"model": {"path": "/m"}, "replicas": 1, "maxReplicas": 4,
                 "autoscaling": {"policy": "slo", "intervalSeconds": 15}}}
for t in range(100, 125):
    clock[0] = float(t)
    asyncio.run(kh.autoscale_inferenceservice(body=body, memo=memo, patch=kopf.Patch()))
print(calls)
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[100.0, 103.0, 118.0]"


def test_a_woken_step_that_measured_a_diluted_burst_asks_for_a_follow_up() -> None:
    """autoscale_step: with the router's burst at 40 req/s and the primary's rate since the last decision at 15 (13 s,
    mostly before the burst) the next decision comes one detection window later; not when the rate measured holds the
    burst (Prometheus: with_burst put the detector's own rate there), nor without a burst."""
    import asyncio

    from llmfleet.autoscaler.actuation import ObservedReplica
    from llmfleet.autoscaler.controller import Burst, autoscale_step
    from llmfleet.autoscaler.policy import PolicyState, PoolSignals
    from llmfleet.router.burst import WINDOW_S
    from llmfleet.sim.production import make_service

    isvc = make_service(policy="slo", replicas=2)

    class Act:
        async def list_replicas(self, pool: str) -> list[ObservedReplica]:
            return [ObservedReplica(pool, f"r{i}", f"http://r{i}", ready=True) for i in range(2)]

        async def set_replicas(self, desired: object, *, reason: str, state_json: str | None = None) -> None:
            pass

    class Scraped:
        def __init__(self, rate: float, window_s: float | None) -> None:
            self.rate, self.window_s = rate, window_s

        async def collect(self, pools: list, now: float | None = None) -> list[PoolSignals]:  # type: ignore[type-arg]
            return [PoolSignals(p.name, p.role, now or 0.0, p.replicas, p.ready_replicas, arrival_rate=self.rate,
                                window_s=self.window_s, queue_depth=0.0, mean_input_tokens=1000,
                                mean_output_tokens=100) for p in pools]

    def follow(rate: float, window_s: float | None, burst: Burst | None) -> float | None:
        result = asyncio.run(autoscale_step(isvc, Act(), Scraped(rate, window_s), PolicyState(), 1000.0, burst=burst))
        return result.follow_up_s

    assert follow(15.0, 13.0, Burst(40.0, 3.0)) == WINDOW_S
    assert follow(30.0, 13.0, Burst(40.0, 3.0)) is None  # the window holds it at more than 1 / BURST_RATIO
    assert follow(15.0, None, Burst(40.0, 3.0)) is None  # Prometheus: the detector's rate replaced the primary's
    assert follow(15.0, 13.0, None) is None


def test_live_metrics_status_from_the_primary_signals() -> None:
    from llmfleet.api.inferenceservice import LiveMetrics
    from llmfleet.autoscaler.live_metrics import live_metrics
    from llmfleet.autoscaler.policy import PoolSignals

    primary = PoolSignals(pool="primary", role="primary", now=0.0, replicas=2, ready_replicas=2, arrival_rate=12.5,
                          ttft_p95_ms=420.0, tpot_p95_ms=31.0, prefix_hit_rate=0.8, kv_utilization=0.4,
                          kv_full_sequences=88.5, degraded_fraction=0.05, error_rate=0.001)
    student = PoolSignals(pool="student", role="student", now=0.0, replicas=1, ready_replicas=1, ttft_p95_ms=99.0,
                          error_rate=0.25, arrival_rate=0.6)
    out = live_metrics([student, primary], "2026-11-30T00:00:00Z")
    assert out == {"ttftP95Ms": 420.0, "tpotP95Ms": 31.0, "errorRate": 0.001, "prefixCacheHitRate": 0.8,
                   "kvCacheUtilization": 0.4, "kvFullSequences": 88.5, "qps": 12.5, "degradedFraction": 0.05, "stale": False,
                   "updatedAt": "2026-11-30T00:00:00Z",
                   "pools": [{"name": "student", "ttftP95Ms": 99.0, "errorRate": 0.25, "qps": 0.6, "stale": False},
                             {"name": "primary", "ttftP95Ms": 420.0, "tpotP95Ms": 31.0, "errorRate": 0.001,
                              "qps": 12.5, "stale": False}]}
    LiveMetrics.model_validate(out)  # the status schema accepts it
    stale = PoolSignals(pool="primary", role="primary", now=0.0, replicas=1, ready_replicas=0, stale=True)
    assert live_metrics([stale], "t") == {"stale": True, "updatedAt": "t", "pools": [{"name": "primary", "stale": True}]}
    assert live_metrics([student], "t") is None


def test_the_persisted_state_carries_unix_times_and_the_timer_reads_them_on_its_own_clock() -> None:
    """`autoscale_step` decides on time.monotonic() and writes the annotation in Unix seconds; the Kubernetes timer
    of a new process (a restarted operator: another monotonic origin) reads it back on its own clock. In a
    subprocess, like the other kopf_handlers tests (importing registers handlers)."""
    code = """
import asyncio, json, time
import llmfleet.autoscaler.kopf_handlers as kh
from llmfleet.api import parse_resource
from llmfleet.api.contracts import AUTOSCALER_STATE_ANNOTATION
from llmfleet.autoscaler.actuation import ObservedReplica
from llmfleet.autoscaler.controller import autoscale_step
from llmfleet.autoscaler.policy import PolicyState, PoolSignals

isvc = parse_resource({"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "s"},
                       "spec": {"model": {"path": "/m", "servedName": "m"}, "replicas": 1, "maxReplicas": 4}})

class Act:
    written = None
    async def list_replicas(self, pool):
        return [ObservedReplica(pool, "r0", "http://r0", ready=True)]
    async def set_replicas(self, desired, *, reason, state_json=None):
        Act.written = state_json

class Busy:  # a queue of 40 on one replica: the policy scales out (an action, so the state is written)
    async def collect(self, pools, now=None):
        return [PoolSignals(p.name, p.role, now, p.replicas, p.ready_replicas, arrival_rate=30.0, queue_depth=40.0,
                            mean_input_tokens=2000, mean_output_tokens=200) for p in pools]

asyncio.run(autoscale_step(isvc, Act(), Busy(), PolicyState(), time.monotonic()))
written = json.loads(Act.written)["primary"]["lastActionAt"]
print(abs(written - time.time()) < 5)
isvc.metadata.annotations[AUTOSCALER_STATE_ANNOTATION] = json.dumps({"primary": {"lastActionAt": time.time() - 40}})
mem = kh._service_memory(kh._Memo(), isvc)
print(round(time.monotonic() - mem.state.pools["primary"].last_action_at))
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "40"]
