"""TrainingJob method: lora (spec rules), the LoRA layer, PEFT names, and promotion into spec.adapters."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pydantic import ValidationError

from llmfleet.api.trainingjob import TrainingJobSpec
from llmfleet.operator.promotion import adapter_patch
from llmfleet.workers.train.lora import PEFT_PREFIX, LoRALinear, apply_lora, peft_tensors
from llmfleet.workers.train.model import ModelArgs, Transformer


def spec(**over: Any) -> TrainingJobSpec:
    body: dict[str, Any] = {"model": {"seqLen": 64}, "data": {"path": "/d"},
                            "optimization": {"globalBatchTokens": 64}, **over}
    return TrainingJobSpec.model_validate(body)


def test_lora_spec_rules() -> None:
    s = spec(method="lora", lora={"baseModel": "/base"})
    assert s.lora is not None and (s.lora.rank, s.lora.alpha, s.lora.targets) == (8, 16.0, ["q_proj", "v_proj"])
    for over, message in [
        ({"method": "lora"}, "method lora needs spec.lora"),
        ({"lora": {"baseModel": "/b"}}, "spec.lora is set but spec.method is full"),
        ({"method": "lora", "lora": {"baseModel": "/b", "rank": 12}}, "rank 12 is not one of"),
        ({"method": "lora", "lora": {"baseModel": "/b", "targets": ["lm_head"]}}, "targets.0"),
        ({"method": "lora", "lora": {"baseModel": "/b"}, "distillation": {"teacher": "/t"}}, "not supported"),
        ({"output": {"path": "/o", "promoteTo": {"inferenceService": "c", "adapterName": "x"}}}, "adapterName is for"),
    ]:
        with pytest.raises(ValidationError, match=message):
            spec(**over)


def test_lora_layer_starts_at_the_base_and_names_are_peft() -> None:
    torch.manual_seed(0)
    model = Transformer(ModelArgs(layers=2, hidden=32, heads=2, kv_heads=1, ffn=64, vocab=64, seq_len=16))
    model.init_weights(seed=1)
    tokens = torch.arange(1, 9).unsqueeze(0)
    with torch.no_grad():
        before = model(tokens)
    wrapped = apply_lora(model, rank=4, alpha=8, targets=["q_proj", "down_proj"])
    assert wrapped == ["layers.0.self_attn.q_proj", "layers.0.mlp.down_proj", "layers.1.self_attn.q_proj",
                       "layers.1.mlp.down_proj"]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        f"{w}.{ab}" for w in wrapped for ab in ("lora_A", "lora_B")]
    with torch.no_grad():
        assert torch.equal(model(tokens), before)  # B = 0: the adapter starts as the identity update
    q = model.get_submodule("layers.0.self_attn.q_proj")
    assert isinstance(q, LoRALinear) and q.scale == 2.0
    names = set(peft_tensors(model.state_dict()))
    assert f"{PEFT_PREFIX}layers.1.mlp.down_proj.lora_B.weight" in names and len(names) == 8
    with pytest.raises(ValueError, match="not Llama projections"):
        apply_lora(model, 4, 8, ["lm_head"])


def test_adapter_promotion_patch() -> None:
    body = {"metadata": {"resourceVersion": "7"},
            "spec": {"lora": {"maxLoras": 2}, "adapters": [{"name": "a", "uri": "/old"}, {"name": "b", "uri": "/b"}]}}
    patch = adapter_patch(body, "a", "/new")
    assert patch == {"metadata": {"resourceVersion": "7"},
                     "spec": {"adapters": [{"name": "b", "uri": "/b"}, {"name": "a", "uri": "/new"}]}}
    assert adapter_patch({"metadata": {}, "spec": {}}, "a", "/x") is None  # no spec.lora: cannot serve adapters
