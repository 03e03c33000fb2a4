"""The API models: defaults, aliases, cross-field validation and error paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmfleet.api import (
    InferenceService,
    ManifestError,
    TrainingJob,
    load_file,
    load_manifests,
    parse_resource,
)
from llmfleet.api.trainingjob import ModelShape

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "examples" / "invalid").glob("*.yaml"))


def _isvc(**spec: object) -> dict:
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "x"},
            "spec": {"model": {"path": "/m"}, **spec}}


def test_examples_exist_for_each_kind_and_size() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"trainingjob-small.yaml", "trainingjob-large.yaml", "inferenceservice-small.yaml",
            "inferenceservice-large.yaml"} <= names
    assert len(INVALID) >= 6


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(path: Path) -> None:
    for resource in load_file(path):
        # Round trip: what we serialize parses back to the same model.
        again = parse_resource(resource.to_wire())
        assert again == resource


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_every_invalid_example_fails_naming_a_field(path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        load_file(path)
    assert info.value.problems
    # The header comment of each invalid example names the offending field; the error must too.
    header = path.read_text().splitlines()[0]
    for fpath, msg in info.value.problems:
        leaf = fpath.rsplit(".", 1)[-1]
        named = {leaf, *(w.strip("(),.:") for w in msg.split())}
        assert any(w and w in header for w in named), (fpath, msg, header)


def test_wire_format_is_camel_case() -> None:
    isvc = InferenceService.model_validate(_isvc(slo={"ttftP95Ms": 200, "e2eP99Ms": 5000}))
    wire = isvc.to_wire()
    assert wire["spec"]["slo"] == {"ttftP95Ms": 200.0, "tpotP95Ms": 100.0, "e2eP99Ms": 5000.0}
    assert "minReplicas" in wire["spec"] and "min_replicas" not in wire["spec"]


def test_pools_resolve_student_defaults() -> None:
    isvc = InferenceService.model_validate(
        _isvc(vllm={"blockSize": 32}, fallback={"pools": [{"name": "student", "model": {"path": "/s"}}]})
    )
    primary, student = isvc.pools()
    assert (primary.name, primary.role, primary.served_name) == ("primary", "primary", "x")
    assert (student.name, student.role, student.served_name) == ("student", "student", "x-student")
    assert student.vllm.block_size == 32  # inherited from the primary
    assert isvc.pool("student") == student
    with pytest.raises(KeyError):
        isvc.pool("nope")


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"hidden": 100, "heads": 8}, "divisible by heads"),
        ({"hidden": 128, "heads": 8, "kvHeads": 3}, "divisible by kvHeads"),
        ({"hidden": 24, "heads": 8}, "even"),
        # no field takes the shape from a config.json (the trainer would train the default shape instead)
        ({"hfConfig": "/models/llama/config.json"}, r"hfConfig\n  Extra inputs are not permitted"),
    ],
)
def test_model_shape_rules(shape: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelShape.model_validate(shape)


def test_gqa_mqa_defaults() -> None:
    assert ModelShape(hidden=4096, heads=32).n_kv_heads == 32
    assert ModelShape(hidden=4096, heads=32, kv_heads=1).n_kv_heads == 1
    assert ModelShape(hidden=4096, heads=32).ffn_dim == 11008  # the Llama-2-7B rule
    assert ModelShape(hidden=4096, heads=32).head_dim == 128


def test_grad_accumulation_from_batch_tokens() -> None:
    job = parse_resource(yaml.safe_load((ROOT / "examples/trainingjob-large.yaml").read_text()))
    assert isinstance(job, TrainingJob)
    assert job.spec.workers.world_size == 8
    assert job.spec.grad_accum_steps == 16


def test_hsdp_groups_must_divide_world() -> None:
    doc = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"},
           "spec": {"model": {}, "data": {"path": "/d"}, "workers": {"count": 3},
                    "optimization": {"globalBatchTokens": 768}, "fsdp": {"replicateGroups": 2}}}
    with pytest.raises(ManifestError, match="replicateGroups"):
        parse_resource(doc)


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"apiVersion": "v1", "kind": "InferenceService"}, "apiVersion"),
        ({"apiVersion": "llmfleet.io/v1alpha1", "kind": "Pod"}, "kind"),
        ("just a string", "<root>"),
    ],
)
def test_wrong_kind_or_version(doc: object, path: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_resource(doc)
    assert info.value.problems[0][0] == path


def test_list_index_in_error_path() -> None:
    doc = _isvc(fallback={"pools": [{"name": "ok", "model": {"path": "/s"}}, {"name": "b", "model": {}}]})
    with pytest.raises(ManifestError) as info:
        parse_resource(doc)
    assert info.value.problems[0][0] == "spec.fallback.pools[1].model.path"


def test_yaml_syntax_error_is_a_manifest_error_naming_the_line() -> None:
    with pytest.raises(ManifestError, match=r"^<manifest>:[23]: invalid YAML") as info:
        load_manifests("a: 1\nb: [unclosed")
    assert info.value.problems[0][0] == "<yaml>"


def test_negative_scorer_weight_rejected() -> None:
    with pytest.raises(ManifestError, match="scorers.queue-depth"):
        parse_resource(_isvc(router={"scorers": {"queue-depth": -1}}))


@pytest.mark.parametrize(("outliers", "path"), [
    ({"consecutiveFailures": 0}, "spec.router.outliers.consecutiveFailures"),
    ({"slowFactor": 1.0}, "spec.router.outliers.slowFactor"),
    ({"maxEjectionPercent": 101}, "spec.router.outliers.maxEjectionPercent"),
    ({"baseEjectionSeconds": 0}, "spec.router.outliers.baseEjectionSeconds"),
    ({"ejectAfter": 3}, "spec.router.outliers.ejectAfter"),
])
def test_outlier_ejection_bad_values_name_the_field(outliers: dict, path: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_resource(_isvc(router={"outliers": outliers}))
    assert [p for p, _ in info.value.problems] == [path]


def test_outlier_ejection_defaults_are_the_routers() -> None:
    from llmfleet.router.config import OutlierConfig

    isvc = parse_resource(_isvc())
    assert isinstance(isvc, InferenceService)
    assert isvc.spec.router.outliers == OutlierConfig()
