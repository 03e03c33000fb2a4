"""Planner formulas against hand-computed cases (Llama-3-8B on H200 unless stated)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.plan.capacity import TrafficShape, replica_capacity, replicas_needed
from llmfleet.plan.hardware import get_gpu
from llmfleet.plan.models import get_model, kv_bytes_per_token, matmul_params, total_params
from llmfleet.plan.roofline import (
    StepCostModel,
    attention_traffic,
    calibrate,
    calibrate_with_request_cost,
    decode_compute_bound_batch,
    decode_roofline,
    kv_capacity,
    prefill_roofline,
)
from llmfleet.plan.training import fsdp_comm_per_step, fsdp_memory_per_gpu, model_flops_per_token, utilization

L3 = get_model("llama-3-8b")
H200 = get_gpu("H200")


def test_params_llama3_8b() -> None:
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert total_params(L3) == 32 * layer + 2 * 128256 * 4096 + 4096 == 8_030_261_248


@pytest.mark.parametrize(("kv_heads", "dtype", "expected"), [
    (8, "bf16", 2 * 32 * 8 * 128 * 2),  # 131,072: GQA
    (8, "fp8", 65_536),
    (8, "int4", 32_768),
    (32, "bf16", 524_288),  # MHA
    (1, "bf16", 16_384),  # MQA
])
def test_kv_bytes_per_token(kv_heads: int, dtype: str, expected: int) -> None:
    assert kv_bytes_per_token(L3.model_copy(update={"kv_heads": kv_heads}), dtype) == expected


def test_roofline_verdicts() -> None:
    assert H200.ridge_point == pytest.approx(989 / 4.8, rel=1e-9)
    pre = prefill_roofline(L3, H200, 2048)
    assert pre.bound == "compute" and pre.intensity > 1000
    dec = decode_roofline(L3, H200, 1, 2048)
    assert dec.bound == "memory" and dec.intensity == pytest.approx(1.0, abs=0.05)
    # hand: B = ridge·W / (2·N_mm - ridge·kv) at context 0
    ridge = 989e12 / 4.8e12
    w = 8_030_261_248 * 2
    b = ridge * w / (2 * matmul_params(L3) - ridge * 131_072)
    assert decode_compute_bound_batch(L3, H200, 0) == pytest.approx(b) == pytest.approx(220.87, abs=0.01)
    assert decode_compute_bound_batch(L3, H200, 2048) is None  # KV reads keep long-context decode memory-bound


def test_kv_capacity_by_hand() -> None:
    cap = kv_capacity(L3, H200, block_size=16, tokens_per_sequence=4096)
    pool = 139.8 * 2**30 * 0.9 - 8_030_261_248 * 2 - 2 * 2**30
    blocks = int(pool // (131_072 * 16))
    assert cap.blocks == blocks and cap.tokens == blocks * 16 and cap.sequences == blocks // 256
    fp8 = kv_capacity(L3, H200, kv_dtype="fp8")
    assert fp8.tokens == pytest.approx(2 * cap.tokens, abs=16)
    with pytest.raises(ValueError, match="do not fit"):
        kv_capacity(get_model("llama-3-70b"), get_gpu("L40S"))


def test_attention_traffic_by_hand() -> None:
    a = attention_traffic(L3, H200, 1024)
    assert a.materialized_bytes == 32 * (4 * 1024 * 128 + 4 * 1024 * 1024) * 2
    assert a.block_rows == 128  # min(ceil(228 KiB / 2 B / (4·128)), 128)
    assert a.fused_bytes == 32 * (2 * 1024 * 128 + 8 * 2 * 1024 * 128) * 2
    assert a.materialized_memory == 32 * 1024 * 1024 * 2


def test_training_flops_mfu_fsdp() -> None:
    n = 8_030_261_248 - 128256 * 4096
    assert model_flops_per_token(L3) == 6 * n + 12 * 32 * 32 * 128 * 8192 == 57_914_449_920
    u = utilization(L3, 24_000, 8, 989e12)
    assert u.mfu == pytest.approx(24_000 * 57_914_449_920 / 8 / 989e12)
    full = utilization(L3, 24_000, 8, 989e12, activation_checkpointing="full")
    # one more forward of every block: 32 · (2 · 218,112,000 + 4 · 32 · 128 · 8192) FLOPs per token
    assert full.hardware_flops_per_token == 57_914_449_920 + 32 * (2 * 218_112_000 + 4 * 32 * 128 * 8192)
    assert full.hfu == pytest.approx(u.mfu * full.hardware_flops_per_token / 57_914_449_920) and full.mfu == u.mfu
    m = fsdp_memory_per_gpu(L3, 8)
    assert m.params_bytes + m.grads_bytes + m.optimizer_bytes == pytest.approx(16 * 8_030_261_248 / 8)
    assert fsdp_memory_per_gpu(L3, 16, replicate_groups=2).params_bytes == m.params_bytes
    assert fsdp_memory_per_gpu(L3, 8, activation_checkpointing="full").activation_bytes < m.activation_bytes
    with pytest.raises(ValueError):
        fsdp_memory_per_gpu(L3, 6, replicate_groups=4)
    c = fsdp_comm_per_step(L3, 8, 8192, 450.0, 989e12, mfu=0.5)
    assert c.bytes_per_gpu == pytest.approx(8_030_261_248 * 7 / 8 * (2 + 2 + 4))
    assert c.comm_s == pytest.approx(c.bytes_per_gpu / 450e9)
    assert c.compute_s == pytest.approx(8192 * 57_914_449_920 / (989e12 * 0.5))


def test_step_cost_and_calibration() -> None:
    c = StepCostModel.build(L3, H200)
    w = 8_030_261_248 * 2
    assert c.decode_step_time(1, 0) == pytest.approx(0.003 + (w + 131_072) / (4.8e12 * 0.8))
    assert c.prefill_time(8192) > c.prefill_time(4096, cached_prefix=4096) > c.decode_step_time(64, 2048)
    truth = StepCostModel(**{**c.__dict__, "compute_eff": 0.3, "bandwidth_eff": 0.4, "overhead_s": 0.005})
    pts = [{"tokens": t, "attendedContext": t * t / 2, "readContext": 0, "seconds": truth.step_time(t, t * t / 2, 0)}
           for t in (1, 64, 512, 2048, 8192)]
    fit = calibrate(c, pts)
    assert fit.overhead_s == pytest.approx(0.005, rel=1e-6)
    assert fit.step_time(1024, 1024 * 512, 0) == pytest.approx(truth.step_time(1024, 1024 * 512, 0), rel=1e-6)
    with pytest.raises(ValueError):
        calibrate(c, pts[:1])


def test_a_batched_prefill_costs_its_own_work_not_a_steps_fixed_costs() -> None:
    """A prefill joins the step of the running decodes, which pays the overhead and the weight read anyway: it adds
    its own FLOPs (or its KV traffic, whichever takes longer). Alone, on an idle replica, it pays the whole step."""
    c = StepCostModel.build(L3, H200)
    flops = c.flops_per_token * 100 + c.attn_flops_per_ctx * (100 * 4000 + 100 * 101 / 2)
    assert c.prefill_batched_time(100, 4000) == pytest.approx(flops / (c.peak_flops * c.compute_eff))
    # a short prompt alone is a memory-bound step (weights) plus the overhead: ~3x what it adds to a decode step
    assert c.prefill_time(100, 4000) > 2.5 * c.prefill_batched_time(100, 4000)
    assert c.prefill_time(100, 4000) - c.prefill_batched_time(100, 4000) > c.overhead_s
    # a long one is compute-bound either way: the two differ by the overhead
    assert c.prefill_time(8192) - c.prefill_batched_time(8192) == pytest.approx(c.overhead_s)
    assert c.prefill_batched_time(0) == 0.0
    # the planner's throughput is priced batched, its TTFT (a request's own latency) alone
    w = TrafficShape(input_tokens=300, output_tokens=200)
    cap = replica_capacity(L3, H200, w)
    assert cap.prefill_s == pytest.approx(c.prefill_time(300, 0))
    assert cap.requests_per_s == pytest.approx(1 / (c.prefill_batched_time(300, 0) + 200 * cap.decode_step_s
                                                   / cap.max_batch))


def test_a_measured_kv_footprint_sets_the_kv_limit_of_the_decode_batch() -> None:
    """Sequences per full cache measured on running engines replace the cache's tokens over the final context, within
    what the mix allows: no more than if every cached prompt token were shared, no fewer than if nothing were."""
    w = TrafficShape(input_tokens=19_000, output_tokens=5_000, prefix_hit_rate=0.7)
    own = replica_capacity(L3, H200, w)
    assert own.batch_limited_by == "KV cache" and own.max_batch == own.kv_tokens // 24_000
    measured = replica_capacity(L3, H200, replace(w, kv_sequences=80.5))
    assert measured.max_batch == 80 and "measured footprint (80 measured)" in measured.reasoning[0]
    assert measured.requests_per_s > own.requests_per_s
    # at most the cache over (1-h)·I + O/2: 5,700 uncached prompt tokens and half the answer, shared with nobody
    assert replica_capacity(L3, H200, replace(w, kv_sequences=5_000.0)).max_batch == own.kv_tokens // 8_200
    # at least the cache over I + O/2: a sequence sharing nothing, half-way through its answer
    assert replica_capacity(L3, H200, replace(w, kv_sequences=0.2)).max_batch == own.kv_tokens // 21_500
    # a context longer than the cache: one sequence, as without a measurement (never a batch of 0)
    assert replica_capacity(L3, H200, TrafficShape(input_tokens=2_000_000, output_tokens=100,
                                                   kv_sequences=50.0)).max_batch == 1


def test_calibration_with_a_per_request_cost() -> None:
    # whole 1-token requests pay a step plus a per-request cost; decode steps (single steps) only a step
    c = StepCostModel.build(L3, H200)
    truth = StepCostModel(**{**c.__dict__, "compute_eff": 0.3, "bandwidth_eff": 0.4, "overhead_s": 0.005})
    request_s = 0.02
    pts = [{"tokens": t, "attendedContext": t * t / 2, "readContext": 0, "wholeRequest": True,
            "seconds": truth.step_time(t, t * t / 2, 0) + request_s} for t in (64, 512, 2048, 8192)]
    pts += [{"tokens": 1, "attendedContext": ctx, "readContext": ctx, "seconds": truth.decode_step_time(1, ctx)}
            for ctx in (256, 4096, 32768)]
    fit = calibrate_with_request_cost(c, pts)
    assert fit.overhead_s == pytest.approx(0.005, rel=1e-6)
    assert fit.request_overhead_s == pytest.approx(request_s, rel=1e-6)
    assert fit.decode_step_time(1, 4096) == pytest.approx(truth.decode_step_time(1, 4096), rel=1e-6)
    # one constant for both kinds charges the decode steps part of the per-request cost
    assert calibrate(c, pts).decode_step_time(1, 4096) > truth.decode_step_time(1, 4096) + 0.005
    with pytest.raises(ValueError, match="whole-request points and single-step points"):
        calibrate_with_request_cost(c, pts[:4])


def test_replicas_needed_scales_with_rate() -> None:
    w = TrafficShape(input_tokens=2048, output_tokens=256, rate_rps=50, prefix_hit_rate=0.5)
    cap = replica_capacity(L3, H200, w)
    plan = replicas_needed(L3, H200, w)
    assert plan.replicas == math.ceil(50 / cap.slo_requests_per_s)
    assert replicas_needed(L3, H200, TrafficShape(rate_rps=200)).replicas > replicas_needed(L3, H200, TrafficShape(rate_rps=20)).replicas
    assert cap.decode_step_s <= w.tpot_slo_s and any("replicas" in line for line in plan.reasoning)


def test_a_sample_of_prompts_is_planned_at_their_mean_prefill() -> None:
    """Each sampled prompt is priced on its own: attention grows faster than a prompt's length, so prompts of 1k and
    23k tokens (mean 12k) cost more than two 12k prompts, and the plan holds fewer requests per replica for them."""
    cost = StepCostModel.build(L3, H200)
    w = TrafficShape(input_tokens=12_000, output_tokens=200, rate_rps=4.0, ttft_slo_s=6.0)
    at_mean = replica_capacity(L3, H200, w)
    varied = replica_capacity(L3, H200, w, prompts=[1_000, 23_000])
    assert varied.prefill_s == pytest.approx((cost.prefill_time(1_000, 0) + cost.prefill_time(23_000, 0)) / 2)
    assert varied.prefill_s > 1.05 * at_mean.prefill_s == pytest.approx(1.05 * cost.prefill_time(12_000, 0))
    assert varied.requests_per_s < at_mean.requests_per_s and varied.max_utilization <= at_mean.max_utilization
    assert replica_capacity(L3, H200, w, prompts=[12_000, 12_000]).prefill_s == pytest.approx(at_mean.prefill_s)
    # prefix hits: each prompt's cached share is not computed
    hit = replica_capacity(L3, H200, TrafficShape(input_tokens=12_000, prefix_hit_rate=0.5), prompts=[1_000, 23_000])
    assert hit.prefill_s == pytest.approx((cost.prefill_time(500, 500) + cost.prefill_time(11_500, 11_500)) / 2)
    assert any("sampled prompts" in line for line in varied.reasoning)
    assert replicas_needed(L3, H200, w, prompts=[1_000, 23_000]).replicas >= replicas_needed(L3, H200, w).replicas


def test_cli_json_and_errors() -> None:
    r = CliRunner().invoke(app, ["plan", "--json", "-"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["kvCache"]["bytesPerToken"] == 131_072 and rep["replicas"]["needed"] >= 1
    r = CliRunner().invoke(app, ["plan", "--gpu", "B999"])
    assert r.exit_code == 2 and "unknown GPU" in r.output
    r = CliRunner().invoke(app, ["plan", "--gpu-override", "hbmBandwidthTBs=9.6", "--json", "-"])
    assert json.loads(r.output)["gpu"]["hbm_bandwidth_tbs"] == 9.6


def test_cli_plans_a_sample_of_prompt_lengths(tmp_path: Path) -> None:
    """`llmfleet plan --prompts FILE`: the sample's mean prompt replaces --input and replicas are planned at the
    sample's mean prefill; a bad or empty file is a one-line error (exit 2)."""
    sample = tmp_path / "prompts.txt"
    sample.write_text("1000\n# a comment\n\n23000\n")
    args = ["plan", "--output", "200", "--rate", "10", "--ttft-ms", "6000", "--json", "-"]
    varied = json.loads(CliRunner().invoke(app, [*args, "--prompts", str(sample)]).output)["replicas"]
    at_mean = json.loads(CliRunner().invoke(app, [*args, "--input", "12000"]).output)["replicas"]
    assert any("2 sampled prompts" in line for line in varied["reasoning"])
    assert any("prefill of 12000 uncached tokens" in line for line in varied["reasoning"])  # the sample's mean
    assert varied["needed"] > at_mean["needed"]
    sample.write_bytes(b"\xef\xbb\xbf1000\r\n23000\r\n")  # a spreadsheet export: byte-order mark, CRLF
    assert json.loads(CliRunner().invoke(app, [*args, "--prompts", str(sample)]).output)["replicas"] == varied
    for text, msg in (("1000\nabc\n", "line 2: 'abc' is not a prompt length"), ("\n# nothing\n", "no prompt lengths")):
        sample.write_text(text)
        r = CliRunner().invoke(app, ["plan", "--prompts", str(sample)])
        assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args,named", [
    (["--seq-len", "0"], "--seq-len must be a finite number >= 1, got 0"),
    (["--block-size", "-1"], "--block-size must be a finite number >= 1"),
    (["--tp", "0"], "--tp must be a finite number >= 1"),
    (["--ttft-ms", "0"], "--ttft-ms must be a finite number > 0"),
    (["--ttft-ms", "nan"], "--ttft-ms must be a finite number > 0, got nan"),
    (["--tpot-ms", "inf"], "--tpot-ms must be a finite number > 0"),
    (["--rate", "inf"], "--rate must be a finite number > 0"),
    (["--hit-rate", "nan"], "--hit-rate must be within [0, 1]"),
    (["--input", "0"], "--input must be a finite number >= 1"),
    (["--train-seq-len", "0"], "--train-seq-len must be a finite number >= 1"),
    (["--gpu-override", "hbmBandwidthTBs=-1"], "GPU field 'hbmBandwidthTBs' must be a finite number > 0"),
    (["--gpu-override", "sms=nan"], "GPU field 'sms' must be a finite number > 0"),
])
def test_cli_plan_rejects_a_number_out_of_range_in_one_line_naming_the_option(args: list[str], named: str) -> None:
    """Out-of-range numbers exit 2 with one line naming the option, instead of a traceback (--seq-len 0, --rate inf)
    or a plan computed from nonsense (--ttft-ms 0, --tp 0 read as "0 GPUs of memory")."""
    r = CliRunner().invoke(app, ["plan", *args])
    assert r.exit_code == 2 and named in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_cli_plan_names_the_field_of_a_bad_model_shape(tmp_path: Path) -> None:
    shape = tmp_path / "shape.yaml"
    shape.write_text("layers: 2\nhidden: wide\n")
    r = CliRunner().invoke(app, ["plan", "--shape", str(shape)])
    assert r.exit_code == 2 and f"--shape {shape}: hidden: Input should be a valid integer" in r.output


def test_gpu_overrides_must_be_finite_and_positive_but_fp8_may_be_absent() -> None:
    assert get_gpu("H200", {"fp8Tflops": None}).fp8_tflops is None  # a part without fp8 tensor cores
    assert get_gpu("H200", {"sms": 100.0}).sms == 100
    for bad in ({"hbmGiB": 0.0}, {"bf16Tflops": None}, {"hbmBandwidthTBs": float("inf")}):
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            get_gpu("H200", bad)


QWEN_7B_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
                  "max_position_embeddings": 32768, "num_attention_heads": 28, "num_hidden_layers": 28,
                  "num_key_value_heads": 4, "rope_theta": 1000000.0, "sliding_window": 131072,
                  "use_sliding_window": False, "tie_word_embeddings": False, "vocab_size": 152064}


def test_a_hugging_face_config_is_a_shape() -> None:
    """`llmfleet plan --shape config.json`: Qwen2.5-7B's config is its preset; a multimodal model's text_config is
    read; what a Llama-style shape cannot hold is refused naming the key."""
    from llmfleet.plan.models import PRESETS, shape_from_hf_config

    assert shape_from_hf_config(QWEN_7B_CONFIG) == PRESETS["qwen2.5-7b"]
    assert shape_from_hf_config({"text_config": QWEN_7B_CONFIG, "vision_config": {}}) == PRESETS["qwen2.5-7b"]
    windowed = shape_from_hf_config(QWEN_7B_CONFIG | {"use_sliding_window": True, "sliding_window": 4096})
    assert windowed.sliding_window == 4096
    for bad, needle in (({"num_local_experts": 8}, "mixture-of-experts"), ({"kv_lora_rank": 512}, "MLA"),
                        ({"head_dim": 256}, "head_dim = 256"), ({"vocab_size": None}, "vocab_size must be"),
                        ({"num_hidden_layers": "28"}, "num_hidden_layers must be")):
        with pytest.raises(ValueError, match=needle):
            shape_from_hf_config(QWEN_7B_CONFIG | bad)


def test_the_trainers_exported_config_reads_back_as_its_shape() -> None:
    from llmfleet.plan.models import shape_from_hf_config
    from llmfleet.workers.train.export import hf_config
    from llmfleet.workers.train.model import ModelArgs

    args = ModelArgs.from_shape(get_model("llama-3.2-1b"))
    assert shape_from_hf_config(hf_config(args)) == args.shape()


def test_plan_cli_takes_a_config_json(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN_7B_CONFIG))
    r = CliRunner().invoke(app, ["plan", "--shape", str(cfg), "--gpu", "H100", "--json", "-"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"]["params"] == total_params(get_model("qwen2.5-7b"))
    cfg.write_text(json.dumps(QWEN_7B_CONFIG | {"num_experts": 64}))
    r = CliRunner().invoke(app, ["plan", "--shape", str(cfg)])
    assert r.exit_code == 2 and "num_experts = 64: a mixture-of-experts model" in r.output
