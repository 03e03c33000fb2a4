"""The generated CRDs: fresh, structural, valid Kubernetes objects, and agreeing with the models."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

from llmfleet.api.crdgen import all_crds, render

ROOT = Path(__file__).resolve().parents[2]
CRDS = all_crds()
KIND_FILE = {"TrainingJob": "llmfleet.io_trainingjobs.yaml", "InferenceService": "llmfleet.io_inferenceservices.yaml"}


def _schema(kind: str) -> dict[str, Any]:
    return CRDS[KIND_FILE[kind]]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("name", sorted(CRDS))
def test_crds_folder_is_fresh(name: str) -> None:
    path = ROOT / "crds" / name
    assert path.exists(), "run `make crds`"
    assert path.read_text() == render(CRDS[name]), "crds/ is stale: run `make crds`"


def test_generation_is_deterministic() -> None:
    assert {n: render(c) for n, c in all_crds().items()} == {n: render(c) for n, c in CRDS.items()}


@pytest.mark.parametrize("name", sorted(CRDS))
def test_crd_is_a_valid_kubernetes_object(name: str) -> None:
    kubernetes_validate.validate(yaml.safe_load((ROOT / "crds" / name).read_text()), "1.30", strict=True)


def _walk(node: dict[str, Any], path: str, problems: list[str]) -> None:
    """The structural-schema rules of apiextensions.k8s.io/v1 that matter for generated schemas."""
    for banned in ("$ref", "anyOf", "oneOf", "allOf", "not", "const", "title", "$defs"):
        if banned in node:
            problems.append(f"{path}: has {banned}")
    # int-or-string fields carry no type (Kubernetes accepts both JSON types there).
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields") \
            and not node.get("x-kubernetes-int-or-string"):
        problems.append(f"{path}: no type")
    if ".properties." in path and not path.endswith((".items", ".additionalProperties", "metadata")) \
            and "description" not in node:
        problems.append(f"{path}: no description")
    if "properties" in node and node.get("type") != "object":
        problems.append(f"{path}: properties on a non-object")
    if "items" in node and node.get("type") != "array":
        problems.append(f"{path}: items on a non-array")
    for flag in ("exclusiveMinimum", "exclusiveMaximum"):
        if flag in node and not isinstance(node[flag], bool):
            problems.append(f"{path}: {flag} must be a boolean in OpenAPI v3")
    for name, sub in node.get("properties", {}).items():
        _walk(sub, f"{path}.properties.{name}", problems)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}.items", problems)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}.additionalProperties", problems)


@pytest.mark.parametrize("kind", sorted(KIND_FILE))
def test_schema_is_structural_and_described(kind: str) -> None:
    problems: list[str] = []
    _walk(_schema(kind), kind, problems)
    assert problems == []


def test_inferenceservice_has_scale_and_status_subresources() -> None:
    version = CRDS[KIND_FILE["InferenceService"]]["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert "status" in version["subresources"]
    assert CRDS[KIND_FILE["TrainingJob"]]["spec"]["names"]["shortNames"] == ["tj"]


def _to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 (boolean exclusive bounds) back to JSON Schema, to validate manifests with jsonschema."""
    if isinstance(node, dict):
        out = {k: _to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if out.get(flag) is True:
                out[flag] = out.pop(bound)
            elif out.get(flag) is False:
                out.pop(flag)
        if out.get("type") == "object" and "properties" in out and not node.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_to_jsonschema(v) for v in node]
    return node


def _cel_rules(node: dict[str, Any], doc: Any, path: str, out: list[tuple[str, str, Any]]) -> None:
    for rule in node.get("x-kubernetes-validations", []):
        out.append((path, rule["rule"], doc))
    if isinstance(doc, dict):
        for name, sub in node.get("properties", {}).items():
            if name in doc:
                _cel_rules(sub, doc[name], f"{path}.{name}", out)
    if isinstance(doc, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(doc):
            _cel_rules(node["items"], item, f"{path}[{i}]", out)


def _apply_defaults(node: dict[str, Any], doc: Any) -> Any:
    """What the API server's defaulting does before CEL rules run."""
    if isinstance(doc, dict):
        doc = copy.deepcopy(doc)
        for name, sub in node.get("properties", {}).items():
            if name not in doc and "default" in sub:
                doc[name] = sub["default"]
            if name in doc:
                doc[name] = _apply_defaults(sub, doc[name])
    elif isinstance(doc, list) and isinstance(node.get("items"), dict):
        doc = [_apply_defaults(node["items"], d) for d in doc]
    return doc


@functools.cache
def _cel_program(rule: str) -> Any:
    """Compiled once per rule (compiling is ~0.1 s; the fuzz tests evaluate rules thousands of times)."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def failed_cel_rules(kind: str, spec: dict[str, Any]) -> list[str]:
    schema = _schema(kind)["properties"]["spec"]
    spec = _apply_defaults(schema, spec)
    found: list[tuple[str, str, Any]] = []
    _cel_rules(schema, spec, "spec", found)
    failed = []
    for path, rule, doc in found:
        result = _cel_program(rule).evaluate({"self": celpy.json_to_cel(doc)})
        if not bool(result):
            failed.append(f"{path}: {rule}")
    return failed


def _docs(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, d) for p in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize(("name", "doc"), _docs(ROOT / "examples"), ids=lambda v: v if isinstance(v, str) else "")
def test_examples_pass_the_crd_schema_and_cel_rules(name: str, doc: dict[str, Any]) -> None:
    jsonschema.validate(doc["spec"], _to_jsonschema(_schema(doc["kind"])["properties"]["spec"]))
    assert failed_cel_rules(doc["kind"], doc["spec"]) == []


def test_cel_rules_catch_what_pydantic_catches() -> None:
    """Cross-field rules hold at the API server too, not only in the operator."""
    assert failed_cel_rules("InferenceService", {"model": {"path": "/m"}, "minReplicas": 5, "maxReplicas": 2})
    assert failed_cel_rules("TrainingJob", {"model": {"hidden": 4096, "heads": 32, "kvHeads": 6}, "data": {"path": "/d"}})
    assert failed_cel_rules("InferenceService", {
        "model": {"path": "/m"},
        "fallback": {"pools": [{"name": "s", "model": {"path": "/s"}, "minReplicas": 3, "maxReplicas": 1}]},
    })


def test_schema_rejects_unknown_fields_and_bad_enums() -> None:
    schema = _to_jsonschema(_schema("InferenceService")["properties"]["spec"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": {"path": "/m"}, "vllm": {"kvCacheDtype": "int3"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": {"path": "/m"}, "replicaz": 2}, schema)


def test_schema_rejects_bad_outlier_ejection_values() -> None:
    schema = _to_jsonschema(_schema("InferenceService")["properties"]["spec"])
    jsonschema.validate({"model": {"path": "/m"}, "router": {"outliers": {"consecutiveFailures": 5}}}, schema)
    for bad in ({"consecutiveFailures": 0}, {"slowFactor": 1}, {"maxEjectionPercent": 101}, {"ejectAfter": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"model": {"path": "/m"}, "router": {"outliers": bad}}, schema)


def test_schema_rejects_lora_ranks_vllm_does_not_serve() -> None:
    """The API server refuses a LoRA rank outside vLLM's list (negative, zero, 5) at admission, not only the operator."""
    isvc = _to_jsonschema(_schema("InferenceService")["properties"]["spec"])
    tj = _to_jsonschema(_schema("TrainingJob")["properties"]["spec"])
    jsonschema.validate({"model": {"path": "/m"}, "lora": {"maxLoraRank": 64}}, isvc)
    jsonschema.validate({"baseModel": "org/m", "rank": 16}, tj["properties"]["lora"])
    for bad in (-1, 0, 5):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"model": {"path": "/m"}, "lora": {"maxLoraRank": bad}}, isvc)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"baseModel": "org/m", "rank": bad}, tj["properties"]["lora"])
