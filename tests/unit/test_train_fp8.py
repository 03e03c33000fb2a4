"""precision fp8, microBatch auto and the lean optimizer step: the parts that run without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from llmfleet.api.crdgen import all_crds
from llmfleet.api.trainingjob import TrainingJob, TrainingJobSpec
from llmfleet.cli.main import app
from llmfleet.operator.worker_status import status_fields
from llmfleet.plan.hardware import training_precision_problems
from llmfleet.workers.train import float8, microbatch
from llmfleet.workers.train.model import ModelArgs, Transformer

SHAPE = {"layers": 2, "hidden": 64, "heads": 4, "kvHeads": 2, "ffn": 128, "vocab": 512, "seqLen": 32}


def _job(precision: str = "fp8", gpus: int = 1, gpu_type: str | None = "H200", **opt: object) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"},
        "spec": {"model": SHAPE, "data": {"path": "/d"},
                 "optimization": {"precision": precision, "globalBatchTokens": 256, "microBatch": 2, **opt},
                 "workers": {"gpusPerWorker": gpus, "gpuType": gpu_type}},
    }


# ------------------------------------------------------------------ API and validation
def test_micro_batch_auto_keeps_the_global_batch_check() -> None:
    spec = TrainingJob.model_validate(_job(microBatch="auto", globalBatchTokens=32 * 8)).spec
    assert spec.optimization.micro_batch == "auto" and spec.sequences_per_rank == 8
    with pytest.raises(ValueError, match="auto"):
        _ = spec.grad_accum_steps
    with pytest.raises(ValidationError, match="multiple of seqLen x world size"):
        TrainingJob.model_validate(_job(microBatch="auto", globalBatchTokens=48))
    for bad in (0, "max"):
        with pytest.raises(ValidationError):
            TrainingJob.model_validate(_job(microBatch=bad))


def test_micro_batch_is_int_or_string_in_the_crd() -> None:
    crd = all_crds()["llmfleet.io_trainingjobs.yaml"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = spec["properties"]["optimization"]["properties"]["microBatch"]
    assert field["x-kubernetes-int-or-string"] is True and "type" not in field
    assert field["x-kubernetes-validations"][0]["rule"] == "type(self) == int ? self >= 1 : (self == 'auto')"


@pytest.mark.parametrize(
    ("precision", "gpus", "gpu_type", "refused"),
    [("fp8", 1, "A100", True), ("fp8", 0, None, True), ("fp8", 1, "H200", False), ("fp8", 1, "L40S", False),
     ("fp8", 1, "MysteryGPU", False), ("fp8", 1, None, False), ("bf16", 1, "A100", False)],
)
def test_fp8_needs_fp8_tensor_cores(precision: str, gpus: int, gpu_type: str | None, refused: bool) -> None:
    spec = TrainingJob.model_validate(_job(precision, gpus, gpu_type)).spec
    problems = training_precision_problems(spec)
    assert bool(problems) == refused
    if refused:
        assert problems[0][0] == "spec.optimization.precision"


def test_validate_refuses_fp8_on_a100_with_the_field_path(tmp_path: Path) -> None:
    runner = CliRunner()
    bad, good = tmp_path / "a100.yaml", tmp_path / "h200.yaml"
    bad.write_text(yaml.safe_dump(_job("fp8", 1, "A100")))
    good.write_text(yaml.safe_dump(_job("fp8", 1, "H200")))
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "spec.optimization.precision" in result.output and "A100" in result.output
    assert runner.invoke(app, ["validate", str(good)]).exit_code == 0


async def test_operator_marks_fp8_on_a100_invalid() -> None:
    from llmfleet.operator.config import OperatorConfig
    from llmfleet.operator.reconcile_tj import reconcile_trainingjob

    body = _job("fp8", 1, "A100")
    body["metadata"].update({"uid": "u", "generation": 2})
    out = await reconcile_trainingjob(body, None, OperatorConfig(), "t")  # type: ignore[arg-type]
    ready = out.status["conditions"][0]
    assert out.status["phase"] == "Invalid" and ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.optimization.precision")


def test_worker_status_carries_the_micro_batch() -> None:
    assert status_fields({"microBatch": 8, "step": 3})["microBatch"] == 8
    assert "microBatch" not in status_fields({"microBatch": "8"})


# ------------------------------------------------------------------ microBatch auto
def test_choose_takes_the_largest_divisor_under_the_margin() -> None:
    gib = 2**30
    # 20 GiB static + 6 GiB per sequence on 140 GiB with a 10% margin: limit 126 GiB -> 17 fit, 16 is a divisor.
    assert microbatch.choose(32, 20 * gib, 6 * gib, 140 * gib) == 16
    assert microbatch.choose(12, 20 * gib, 6 * gib, 140 * gib) == 12
    assert microbatch.choose(7, 20 * gib, 6 * gib, 140 * gib) == 7
    assert microbatch.choose(9, 20 * gib, 20 * gib, 140 * gib) == 3  # 9 and 5.. do not fit; 3 does
    assert microbatch.choose(8, 200 * gib, 1 * gib, 140 * gib) == 1  # nothing fits: 1 (the run may still OOM)
    assert microbatch.divisors_desc(12) == [12, 6, 4, 3, 2, 1]


def test_probe_on_cpu_uses_one() -> None:
    calls: list[int] = []
    res = microbatch.probe(calls.append, 8, torch.device("cpu"), 0.0)
    assert res.micro_batch == 1 and calls == [] and "cpu" in res.reason


# ------------------------------------------------------------------ float8
def test_fp8_is_refused_on_cpu() -> None:
    with pytest.raises(float8.Float8Unavailable, match="CPU"):
        float8.check_device(torch.device("cpu"))


def test_float8_converts_only_the_blocks_linears() -> None:
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    args = ModelArgs.from_shape(TrainingJobSpec.model_validate(_job()["spec"]).model)
    model = Transformer(args)
    keys = set(model.state_dict())
    n = float8.convert(model, "tensorwise", fsdp_all_gather=False, emulate=True)
    assert n == 7 * args.layers  # q, k, v, o, gate, up, down per block
    assert type(model.lm_head) is torch.nn.Linear and not isinstance(model.lm_head, Float8Linear)
    assert all(isinstance(m, Float8Linear) for name, m in model.named_modules()
               if name.startswith("layers.") and isinstance(m, torch.nn.Linear))
    assert set(model.state_dict()) == keys  # checkpoints and HF export see the same names


def test_float8_emulated_step_tracks_bf16() -> None:
    """Same weights, same batch: the fp8 (emulated) loss and gradients stay close to bf16's."""
    pytest.importorskip("torchao.float8")
    args = ModelArgs(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=32)
    ref, f8 = Transformer(args), Transformer(args)
    ref.init_weights(0)
    f8.init_weights(0)
    float8.convert(f8, "tensorwise", fsdp_all_gather=False, emulate=True)
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    losses, grads = [], []
    for model in (ref, f8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(float(loss))
        grads.append(model.layers[0].mlp.up_proj.weight.grad.clone())
    assert abs(losses[1] - losses[0]) / losses[0] < 0.01
    rel = (grads[1] - grads[0]).norm() / grads[0].norm()
    assert rel < 0.15, rel  # e4m3/e5m2 rounding, far from a wrong gradient (which would be ~1)


def test_rowwise_config_has_no_float8_all_gather() -> None:
    pytest.importorskip("torchao.float8")
    assert float8.config("rowwise", fsdp_all_gather=True).enable_fsdp_float8_all_gather is False
    assert float8.config("tensorwise", fsdp_all_gather=True).enable_fsdp_float8_all_gather is True


# ------------------------------------------------------------------ lean step
def test_clip_folded_into_fused_adamw_matches_clip_then_step() -> None:
    """The trainer hands fused AdamW 1/clip-coefficient as grad_scale instead of rescaling every gradient."""
    torch.manual_seed(0)
    params = [torch.randn(64, 32), torch.randn(32)]
    grads = [torch.randn(64, 32) * 10, torch.randn(32) * 10]
    max_norm = 1.0
    a = [p.clone().requires_grad_() for p in params]
    b = [p.clone().requires_grad_() for p in params]
    for x, y, g in zip(a, b, grads, strict=True):
        x.grad, y.grad = g.clone(), g.clone()
    opt_a = torch.optim.AdamW(a, lr=1e-2, fused=True)
    norm = torch.nn.utils.get_total_norm([p.grad for p in a])
    torch.nn.utils.clip_grads_with_norm_(a, max_norm, norm)
    opt_a.step()
    opt_b = torch.optim.AdamW(b, lr=1e-2, fused=True)
    opt_b.grad_scale = torch.clamp(torch.nn.utils.get_total_norm([p.grad for p in b]) / max_norm, min=1.0)  # type: ignore[attr-defined]
    opt_b.step()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_fp8_with_lora_is_refused() -> None:
    job = _job()
    job["spec"].update(method="lora", lora={"baseModel": "/models/base"})
    with pytest.raises(ValidationError, match="fp8 with method lora"):
        TrainingJob.model_validate(job)
