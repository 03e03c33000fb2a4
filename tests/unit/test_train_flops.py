"""MFU/HFU math against hand-computed cases, the GPU peak table, straggler detection and the LR schedule."""

from __future__ import annotations

import pytest

from llmfleet.plan import training as tr
from llmfleet.plan.models import layer_params
from llmfleet.workers.train import metrics as fl
from llmfleet.workers.train.model import ModelArgs

REF_ARGS = ModelArgs(layers=16, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=32768, seq_len=4096)
REF = REF_ARGS.shape()  # the trainer's FLOPs come from the planner's formulas on the job's ModelShape


def test_param_count_of_reference_config_by_hand() -> None:
    d, q, h, kv, f, v, L = 2048, 128, 16, 8, 5632, 32768, 16
    attn = d * h * q + 2 * d * kv * q + h * q * d  # q, k, v, o
    block = attn + 3 * d * f + 2 * d  # SwiGLU + two norms
    total = L * block + d + 2 * v * d  # final norm, embedding, output projection
    assert REF_ARGS.num_params() == total == 889_260_032
    assert tr.flops_params(REF) == total - v * d  # the input embedding is a lookup
    tied = ModelArgs(**{**REF_ARGS.__dict__, "tie_embeddings": True})
    assert tied.num_params() == total - v * d
    assert tr.flops_params(tied.shape()) == total - v * d  # the shared table is the LM head: a matmul


def test_model_flops_per_token_palm_appendix_b() -> None:
    n = 889_260_032 - 32768 * 2048
    expected = 6 * n + 12 * 16 * 16 * 128 * 4096
    assert tr.model_flops_per_token(REF) == expected == 6_543_519_744


def test_hfu_adds_one_forward_per_checkpointed_block() -> None:
    per_block_fwd = 2 * layer_params(REF) + 4 * 16 * 128 * 4096
    mfu_flops = tr.model_flops_per_token(REF)
    assert tr.hardware_flops_per_token(REF, activation_checkpointing="none") == mfu_flops
    assert tr.hardware_flops_per_token(REF, activation_checkpointing="full") == mfu_flops + 16 * per_block_fwd
    assert tr.hardware_flops_per_token(REF, activation_checkpointing="selective") == mfu_flops + 8 * per_block_fwd
    with pytest.raises(ValueError, match="activation_checkpointing"):
        tr.hardware_flops_per_token(REF, activation_checkpointing="some")


def test_utilization_hand_computed() -> None:
    # 6.5435e9 FLOP/token x 86,264 tokens/s on one GPU over 989 TFLOP/s = 57.1 %.
    u = fl.utilization(6_543_519_744, 86_264.0, 989.0)
    assert u == pytest.approx(6_543_519_744 * 86_264 / 989e12)
    assert u == pytest.approx(0.5707, abs=1e-4)
    assert fl.utilization(1, 1.0, None) is None


def test_sliding_window_caps_attention_flops() -> None:
    windowed = ModelArgs(layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=100, seq_len=1024, sliding_window=128)
    assert tr.attention_flops_per_token(windowed.shape()) == 12 * 2 * 4 * 16 * 128


def test_peak_table_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_PEAK_TFLOPS", raising=False)
    assert fl.peak_tflops("NVIDIA H200") == 989.0
    assert fl.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert fl.peak_tflops("NVIDIA H200", override=500.0) == 500.0
    assert fl.peak_tflops("mystery accelerator") is None
    assert fl.peak_tflops(None) is None
    monkeypatch.setenv("LLMFLEET_PEAK_TFLOPS", "123")
    assert fl.peak_tflops("NVIDIA H200") == 123.0


def test_stragglers_flag_ranks_slower_than_median_by_factor() -> None:
    assert fl.stragglers([1.0, 1.0, 1.05, 1.5], 1.3) == [3]
    assert fl.stragglers([1.0, 1.2, 1.1], 1.3) == []
    assert fl.stragglers([2.0], 1.3) == []


def test_lr_schedule_warmup_then_cosine_to_min() -> None:
    from llmfleet.api.trainingjob import TrainingJobSpec
    from llmfleet.workers.train.trainer import lr_lambda

    spec = TrainingJobSpec.model_validate({
        "model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "seqLen": 8}, "data": {"path": "x"},
        "optimization": {"globalBatchTokens": 8, "steps": 110, "lr": {"peak": 1e-3, "min": 1e-4, "warmupSteps": 10}},
    })
    f = lr_lambda(spec)
    assert f(0) == pytest.approx(0.1)
    assert f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(110) == pytest.approx(0.1)


def test_stragglers_ignore_gaps_below_the_floor() -> None:
    assert fl.stragglers([0.001, 0.001, 0.002], 1.3, min_gap=0.01) == []
    assert fl.stragglers([0.001, 0.001, 0.2], 1.3, min_gap=0.01) == [2]
