"""Model-preset annotations the planner cannot use (a misspelt preset, a suffix naming no pool) are a spec error
everywhere the spec is read: the operator (InvalidSpec condition and Event), `llmfleet validate` and `llmfleet up`.
Ignored, they would leave the pool on the autoscaler's default seed and a measured prefill rate without a word."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from llmfleet.api import InferenceService
from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION
from llmfleet.cli.main import app
from llmfleet.local.manifest import InvalidManifest, load_service
from llmfleet.operator.builders import ServiceSpecError, build_inferenceservice
from llmfleet.operator.config import OperatorConfig
from llmfleet.operator.reconcile_isvc import reconcile_inferenceservice
from llmfleet.plan.pool_presets import model_preset_problems, pool_preset

runner = CliRunner()
UNKNOWN_PRESET = {MODEL_PRESET_ANNOTATION: "llama-3-8bb"}
UNKNOWN_POOL = {f"{MODEL_PRESET_ANNOTATION}.smal": "llama-3.2-1b"}


def _doc(annotations: dict[str, str], model_path: str = "/models/llama") -> dict[str, Any]:
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "ml", "uid": "u", "generation": 3, "annotations": annotations},
            "spec": {"model": {"path": model_path}, "resources": {"gpus": 1, "gpuType": "H200"},
                     "fallback": {"pools": [{"name": "small", "model": {"path": model_path}}]}}}


def _problems(annotations: dict[str, str]) -> list[tuple[str, str]]:
    return model_preset_problems(InferenceService.model_validate(_doc(annotations)))


def test_known_presets_on_existing_pools_pass() -> None:
    assert _problems({}) == []
    assert _problems({MODEL_PRESET_ANNOTATION: "Llama-3-8B",  # the planner's lookup ignores case
                      f"{MODEL_PRESET_ANNOTATION}.primary": "llama-3-8b",
                      f"{MODEL_PRESET_ANNOTATION}.small": "llama-3.2-1b",
                      "llmfleet.io/priority": "high"}) == []  # other annotations are not this check's business


def test_each_unusable_annotation_is_named_with_its_key() -> None:
    (path, message), = _problems(UNKNOWN_PRESET)
    assert path == f"metadata.annotations[{MODEL_PRESET_ANNOTATION}]"
    assert "unknown model preset 'llama-3-8bb'" in message and "llama-3-8b," in message  # lists the known ones
    (path, message), = _problems(UNKNOWN_POOL)
    assert path == f"metadata.annotations[{MODEL_PRESET_ANNOTATION}.smal]"
    assert "names no pool" in message and "primary, small" in message
    (path, _), = _problems({f"{MODEL_PRESET_ANNOTATION}s": "llama-3-8b"})  # not `.<pool>`: a misspelt key
    assert path == f"metadata.annotations[{MODEL_PRESET_ANNOTATION}s]"
    assert len(_problems(UNKNOWN_PRESET | UNKNOWN_POOL)) == 2


@pytest.mark.parametrize("annotations", [UNKNOWN_PRESET, UNKNOWN_POOL])
async def test_the_operator_reports_an_invalid_spec_and_touches_no_child(annotations: dict[str, str]) -> None:
    isvc = InferenceService.model_validate(_doc(annotations))
    with pytest.raises(ServiceSpecError, match=r"^metadata\.annotations\["):
        build_inferenceservice(isvc, OperatorConfig())
    out = await reconcile_inferenceservice(_doc(annotations), None, OperatorConfig(), "t")  # type: ignore[arg-type]
    ready = out.status["conditions"][0]
    assert out.status["phase"] == "Invalid" and out.status["observedGeneration"] == 3
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    key = next(iter(annotations))
    assert f"metadata.annotations[{key}]" in ready["message"]
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "InvalidSpec")]
    assert key in out.events[0].message
    # the same service with a known preset renders
    assert build_inferenceservice(InferenceService.model_validate(_doc({MODEL_PRESET_ANNOTATION: "llama-3-8b"})),
                                  OperatorConfig())


def test_validate_and_up_refuse_it_naming_the_annotation(tmp_path: Path) -> None:
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(yaml.safe_dump(_doc(UNKNOWN_PRESET, model_path=str(tmp_path))))
    result = runner.invoke(app, ["validate", str(manifest)])
    assert result.exit_code == 1
    assert f"metadata.annotations[{MODEL_PRESET_ANNOTATION}]" in result.output and "llama-3-8bb" in result.output
    with pytest.raises(InvalidManifest, match=r"llama-3-8bb"):
        load_service(manifest)
    manifest.write_text(yaml.safe_dump(_doc({MODEL_PRESET_ANNOTATION: "llama-3-8b"}, model_path=str(tmp_path))))
    assert runner.invoke(app, ["validate", str(manifest)]).exit_code == 0
    assert load_service(manifest).model_preset(load_service(manifest).pools()[0]) == "llama-3-8b"


def test_a_tensor_parallelism_the_presets_heads_refuse_is_an_invalid_spec() -> None:
    """The preset gives the shape, so a size vLLM would refuse at start (after fetching the weights) is named at
    apply time: 32 attention heads over 3 GPUs; 8 KV heads over 16 GPUs is fine (replicated), over 6 it is not."""
    from llmfleet.plan.models import PRESETS, tensor_parallel_problem

    assert tensor_parallel_problem(PRESETS["llama-3-8b"], 3) is not None
    assert tensor_parallel_problem(PRESETS["llama-3-70b"], 16) is None  # 64 heads / 16; 8 KV heads, each twice
    kv = PRESETS["llama-3-70b"].model_copy(update={"heads": 48})  # 48 heads split over 6, its 8 KV heads do not
    assert "8 KV heads" in (tensor_parallel_problem(kv, 6) or "")
    doc = _doc({MODEL_PRESET_ANNOTATION: "llama-3-8b"})
    doc["spec"]["resources"]["gpus"] = 3
    doc["spec"]["vllm"] = {"tensorParallelSize": 3}
    doc["spec"]["fallback"]["pools"][0]["vllm"] = {}  # the student keeps one GPU
    (path, message), = model_preset_problems(InferenceService.model_validate(doc))
    assert path == "spec.vllm.tensorParallelSize" and "32 attention heads" in message and "llama-3-8b" in message
    doc["metadata"]["annotations"] = {}  # no preset, no shape: left to the engine
    assert model_preset_problems(InferenceService.model_validate(doc)) == []


@pytest.mark.parametrize(("preset", "billions"), [
    ("llama-3-8b", 8.03), ("llama-3.1-70b", 70.55), ("llama-3.2-1b", 1.236), ("mistral-7b", 7.25),
    ("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544), ("qwen2.5-7b", 7.616), ("qwen2.5-14b", 14.77),
    ("qwen2.5-32b", 32.76), ("qwen2.5-72b", 72.71),
])
def test_presets_have_their_models_parameter_counts(preset: str, billions: float) -> None:
    """Each preset is its model's config.json: a typo in a width or a count moves the total (the Hugging Face
    parameter counts; Qwen2.5's QKV biases, left out, are ~0.01 %)."""
    from llmfleet.plan.models import PRESETS, total_params

    assert total_params(PRESETS[preset]) / 1e9 == pytest.approx(billions, rel=0.005)


def test_the_real_model_examples_hub_models_are_presets_the_planner_prices() -> None:
    from llmfleet.api import load_manifest
    from llmfleet.autoscaler.seeds import DEFAULT_SEED, seeds_for_service
    from llmfleet.router.config import router_config_from_service

    isvc = load_manifest(Path(__file__).parents[2] / "examples/inferenceservice-hf-gpu.yaml")
    assert isinstance(isvc, InferenceService) and model_preset_problems(isvc) == []
    assert [isvc.model_preset(p) for p in isvc.pools()] == [None, None]  # no annotation: the Hub repositories
    assert [pool_preset(isvc, p) for p in isvc.pools()] == ["qwen2.5-7b", "qwen2.5-0.5b"]
    assert all(p.prefill_tokens_per_s for p in router_config_from_service(isvc, endpoints={}).pools)
    assert all(seed != DEFAULT_SEED for seed in seeds_for_service(isvc).values())


def test_a_hub_repository_the_planner_knows_is_its_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hf://ORG/NAME of a preset's model (any case, revision, base or Instruct) gives the preset where no annotation
    does; an annotation wins; other locations and unknown repositories give none. The tensor-parallel check uses
    it, and `llmfleet up` keeps it as an annotation when it swaps the repository for the fetched folder."""
    from llmfleet import storage
    from llmfleet.local import manifest
    from llmfleet.sim.production import pool_specs

    def service(path: str, annotations: dict[str, str] | None = None, tp: int = 1) -> InferenceService:
        doc = _doc(annotations or {}, model_path=path)
        doc["spec"]["resources"]["gpus"] = tp
        doc["spec"]["vllm"] = {"tensorParallelSize": tp}
        doc["spec"]["fallback"]["pools"][0]["vllm"] = {}
        return InferenceService.model_validate(doc)

    def primary(isvc: InferenceService) -> str | None:
        return pool_preset(isvc, isvc.pools()[0])

    assert primary(service("hf://Qwen/Qwen2.5-7B-Instruct@main")) == "qwen2.5-7b"
    assert primary(service("hf://meta-llama/Meta-Llama-3-8B")) == "llama-3-8b"
    assert primary(service("hf://meta-llama/Llama-3.3-70B-Instruct")) == "llama-3.1-70b"
    assert primary(service("hf://Qwen/Qwen2.5-7B-Instruct", {MODEL_PRESET_ANNOTATION: "llama-3-8b"})) == "llama-3-8b"
    assert primary(service("hf://Qwen/Qwen2.5-Coder-7B-Instruct")) is None  # not a repository it knows
    assert primary(service("/models/Qwen2.5-7B-Instruct")) is None and primary(service("s3://models/qwen2.5-7b")) is None
    assert pool_specs(service("hf://Qwen/Qwen2.5-7B-Instruct"))[0].model == "qwen2.5-7b"  # the simulator's too
    (path, message), = model_preset_problems(service("hf://Qwen/Qwen2.5-7B-Instruct", tp=8))
    assert path == "spec.vllm.tensorParallelSize" and "28 attention heads" in message and "qwen2.5-7b" in message

    monkeypatch.setattr(storage, "local_copy", lambda uri: tmp_path)  # the fetch: the repository's local folder
    resolved = manifest.resolve_model_paths(service("hf://Qwen/Qwen2.5-7B-Instruct"))
    assert resolved.spec.model.path == str(tmp_path) and primary(resolved) == "qwen2.5-7b"
    assert resolved.metadata.annotations == {f"{MODEL_PRESET_ANNOTATION}.{p}": "qwen2.5-7b" for p in ("primary", "small")}


def test_weights_that_do_not_fit_are_an_invalid_spec_and_the_default_seed() -> None:
    """Qwen2.5-72B in bf16 on one H100 is refused naming the tensor parallelism (vLLM would fail at start, after
    the fetch); the autoscaler's seed falls back to the default instead of raising. Two H200s fit; fp8 weights
    halve the bytes; AWQ's are not sized, so the planner says nothing."""
    from llmfleet.autoscaler.seeds import DEFAULT_SEED, seeds_for_service

    def service(gpus: int, gpu: str, quantization: str | None = None) -> InferenceService:
        model = {"path": "hf://Qwen/Qwen2.5-72B-Instruct", **({"quantization": quantization} if quantization else {})}
        return InferenceService.model_validate({"metadata": {"name": "big"}, "spec": {
            "model": model, "resources": {"gpus": gpus, "gpuType": gpu}, "vllm": {"tensorParallelSize": gpus}}})

    (path, message), = model_preset_problems(service(1, "H100"))
    assert path == "spec.vllm.tensorParallelSize"
    assert message.startswith("model preset qwen2.5-72b: weights (135.") and "do not fit" in message
    assert seeds_for_service(service(1, "H100"))["primary"] == DEFAULT_SEED
    assert model_preset_problems(service(2, "H200")) == []
    assert seeds_for_service(service(2, "H200"))["primary"] != DEFAULT_SEED
    assert model_preset_problems(service(1, "H200", "fp8")) == []  # 68 GiB of fp8 weights in 126 GiB
    assert model_preset_problems(service(1, "H100", "awq")) == []
