"""LoRA adapters in the InferenceService spec: validation with field paths, and the engine flags they render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from llmfleet.api import InferenceService
from llmfleet.workers.serve.vllm_args import (
    InvalidServeSpec,
    render_vllm_args,
    validate_adapter_files,
)
from llmfleet.workers.serve.worker import engine_env


def make(**spec: Any) -> InferenceService:
    body: dict[str, Any] = {"model": {"path": "/models/tiny"}, "vllm": {"blockSize": 32}, **spec}
    return InferenceService.model_validate(
        {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"}, "spec": body}
    )


def adapters(*names: str, uri: str = "/adapters/x") -> list[dict[str, str]]:
    return [{"name": n, "uri": uri} for n in names]


def test_lora_flags_rendered_for_the_primary_only_and_adapters_not_in_argv() -> None:
    isvc = make(lora={"maxLoras": 2, "maxLoraRank": 8, "maxCpuLoras": 6}, adapters=adapters("sql", "chat-fr"),
                fallback={"pools": [{"name": "small", "model": {"path": "/models/s"}}]})
    primary, student = isvc.pools()
    argv = render_vllm_args(isvc, primary)
    i = argv.index("--enable-lora")
    assert argv[i:i + 7] == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--max-cpu-loras", "6"]
    assert "sql" not in argv and "--lora-modules" not in argv  # loaded at run time: the argv never changes
    assert "--enable-lora" not in render_vllm_args(isvc, student)
    # adding an adapter leaves the argv (and so the Deployment) unchanged
    more = make(lora={"maxLoras": 2, "maxLoraRank": 8, "maxCpuLoras": 6}, adapters=adapters("sql", "chat-fr", "x"),
                fallback={"pools": [{"name": "small", "model": {"path": "/models/s"}}]})
    assert render_vllm_args(more, more.pools()[0]) == argv


def test_max_cpu_loras_defaults_to_max_loras() -> None:
    isvc = make(lora={"maxLoras": 3})
    argv = render_vllm_args(isvc, isvc.pools()[0])
    assert argv[argv.index("--max-cpu-loras") + 1] == "3"
    assert argv[argv.index("--max-lora-rank") + 1] == "16"


def test_runtime_updating_env_only_with_lora() -> None:
    on = make(lora={})
    env = engine_env(render_vllm_args(on, on.pools()[0]))
    assert env is not None and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    off = make()
    assert engine_env(render_vllm_args(off, off.pools()[0])) is None


@pytest.mark.parametrize(("spec", "message"), [
    ({"adapters": adapters("sql")}, "spec.adapters[0] ('sql') needs LoRA enabled: set spec.lora"),
    ({"lora": {}, "adapters": adapters("sql", "fr", "sql")}, "spec.adapters[2].name 'sql' duplicates spec.adapters[0].name"),
    ({"lora": {}, "adapters": adapters("chat")}, "spec.adapters[0].name 'chat' is the model name of pool primary"),
    ({"lora": {"maxLoraRank": 24}}, "maxLoraRank 24 is not one of 1, 8, 16"),
    ({"lora": {"maxLoras": 4, "maxCpuLoras": 2}}, "maxCpuLoras (2) must be >= maxLoras (4)"),
    ({"lora": {}, "adapters": [{"name": "a", "uri": "/x", "baseModel": "/models/other"}]},
     "spec.adapters[0].baseModel '/models/other' is not the primary model"),
    ({"lora": {}, "adapters": [{"name": "a", "uri": "has space"}]}, "neither a path nor a scheme://... URI"),
    ({"lora": {}, "adapters": [{"name": "bad name", "uri": "/x"}]}, "adapters.0.name"),
])
def test_invalid_adapter_specs_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as e:
        make(**spec)
    assert message in str(e.value)


def test_adapter_may_not_shadow_a_student_name() -> None:
    with pytest.raises(ValidationError, match="model name of pool small"):
        make(lora={}, adapters=adapters("chat-small"), fallback={"pools": [{"name": "small", "model": {"path": "/s"}}]})


def test_uri_forms_accepted() -> None:
    isvc = make(lora={}, adapters=[{"name": "a", "uri": "file:///a"}, {"name": "b", "uri": "s3://bucket/b"},
                                   {"name": "c", "uri": "./rel/c", "baseModel": "/models/tiny"}])
    assert [a.engine_path for a in isvc.spec.adapters] == ["/a", "s3://bucket/b", "./rel/c"]


def test_ray_serve_with_lora_is_refused() -> None:
    isvc = make(lora={}, engine="ray-serve")
    with pytest.raises(InvalidServeSpec, match="ray-serve is not supported"):
        render_vllm_args(isvc, isvc.pools()[0])


def test_extra_args_may_not_repeat_lora_flags() -> None:
    isvc = make(lora={}, vllm={"blockSize": 32, "extraArgs": ["--max-loras=3"]})
    with pytest.raises(InvalidServeSpec, match="spec.vllm.extraArgs sets --max-loras"):
        render_vllm_args(isvc, isvc.pools()[0])
    plain = make(vllm={"blockSize": 32, "extraArgs": ["--enable-lora"]})  # without spec.lora: passed through
    assert "--enable-lora" in render_vllm_args(plain, plain.pools()[0])


def test_adapter_files_rank_checked_against_max_lora_rank(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps({"r": 32, "peft_type": "LORA"}))
    ok = make(lora={"maxLoraRank": 32}, adapters=[{"name": "a", "uri": str(tmp_path / "a")}])
    validate_adapter_files(ok)
    small = make(lora={"maxLoraRank": 16}, adapters=[{"name": "a", "uri": f"file://{tmp_path / 'a'}"}])
    with pytest.raises(InvalidServeSpec, match=r"spec.adapters\[0\] \('a'\) has rank 32, above spec.lora.maxLoraRank"):
        validate_adapter_files(small)
    missing = make(lora={}, adapters=[{"name": "m", "uri": str(tmp_path / "nope")}])
    with pytest.raises(InvalidServeSpec, match=r"spec.adapters\[0\].uri .*no readable adapter_config.json"):
        validate_adapter_files(missing)
    remote = make(lora={}, adapters=[{"name": "r", "uri": "s3://b/r"}])
    validate_adapter_files(remote)  # not readable here: the engine checks it


def test_operator_pool_deployment_unchanged_by_adapter_edits() -> None:
    """Adding an adapter changes the router's ConfigMap, not the replicas' Deployment (no replica restart)."""
    from llmfleet.operator.builders import build_inferenceservice
    from llmfleet.operator.config import OperatorConfig

    def manifests(names: tuple[str, ...]) -> dict[tuple[str, str], Any]:
        isvc = make(lora={"maxLoras": 2}, adapters=adapters(*names))
        isvc.metadata.namespace, isvc.metadata.uid = "ml", "u-1"
        return {(m["kind"], m["metadata"]["name"]): m for m in build_inferenceservice(isvc, OperatorConfig())}

    two, three = manifests(("a", "b")), manifests(("a", "b", "c"))
    assert two[("Deployment", "chat-primary")] == three[("Deployment", "chat-primary")]
    assert two[("ConfigMap", "chat-router")] != three[("ConfigMap", "chat-router")]
    argv = two[("Deployment", "chat-primary")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--enable-lora" in argv
