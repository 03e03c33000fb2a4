"""`llmfleet validate` over manifests generated from the CRD schemas (hypothesis).

- Valid: a spec drawn from the CRD's openAPIV3Schema (types, enums, patterns, bounds, required fields) is
  accepted exactly when the CRD's CEL rules hold; otherwise it is rejected with a field path. So the API
  server and `llmfleet validate` agree on what is valid.
- Mutated: a valid example with one field made invalid for the schema (wrong type, unknown field, value out of
  bounds or enum, required field removed) is rejected, naming that field, never with a traceback.

Found inputs worth keeping go to tests/hostile/manifests/ (replayed by test_hostile_manifests_corpus).
"""

from __future__ import annotations

import copy
import os
import re
import string
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from llmfleet.cli.main import app

from .test_crds import _schema, _to_jsonschema, failed_cel_rules

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "hostile" / "manifests"
EXAMPLES = {d["kind"]: d for p in sorted((ROOT / "examples").glob("*-small.yaml")) for d in yaml.safe_load_all(p.read_text())}
KINDS = sorted(EXAMPLES)
# CI draws the same examples every run (a fresh machine has no example database, so a random draw could fail a
# change that touched nothing here); a developer's runs draw new ones and keep what fails in .hypothesis/.
FUZZ = settings(max_examples=200, deadline=None, derandomize=bool(os.environ.get("CI")),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
runner = CliRunner()
# Cross-field rules that `llmfleet validate` and the operator (InvalidSpec condition) check but the CRD's CEL
# rules do not express (several defaults at once, uniqueness, LoRA method/spec pairing; LoRA ranks are a schema
# enum, not listed). Any other disagreement between the CRD and the models fails the test.
PYDANTIC_ONLY = [re.compile(p) for p in (
    r"optimization\.globalBatchTokens \(\d+\) must be a multiple of (microBatch x )?seqLen x world size",
    r"fsdp\.replicateGroups \(\d+\) must divide the world size",
    r"resources\.gpus \(\d+\) must be a multiple of vllm\.tensorParallelSize",
    r"head dimension \(hidden/heads\) must be even for RoPE",
    r"spec\.adapters\[\d+\] \('[^']*'\) needs LoRA enabled",
    r"spec\.adapters\[\d+\]\.name '[^']*' duplicates",
    r"spec\.adapters\[\d+\]\.baseModel '[^']*' is not the primary model",
    r"spec\.adapters\[\d+\]\.name '[^']*' is the model name of pool",
    r"fallback\.pools names must be unique",
    # Not a cross-field rule, but kept out of CEL: a rule over every key of a map exceeds the API server's cost budget.
    r"nodeSelector: '[^']*': keys must be Kubernetes label keys",
    r"vllm\.env: '[^']*' (is not an environment variable name|is set by llmfleet itself|names a credential)",
    # (map keys, as above)
    r"uri '[^']*' is neither a path nor a scheme",
    r"maxCpuLoras \(\d+\) must be >= maxLoras",
    r"method lora needs spec\.lora",
    r"spec\.lora is set but spec\.method is full",
    r"spec\.distillation with method lora is not supported",
    r"optimization\.precision fp8 with method lora is not supported",
    r"output\.promoteTo\.adapterName is for method lora",
    r"optimization\.lr\.min must not exceed optimization\.lr\.peak",
    # The GPU table decides (plan.hardware.training_precision_problems): not a rule CEL can state.
    r"optimization\.precision: fp8 needs (GPUs with )?fp8 tensor cores",
)]
WORD = st.text(string.ascii_lowercase + string.digits + "-/._", min_size=1, max_size=12)


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    if "enum" in node:
        return st.sampled_from(node["enum"])
    lo, hi = node.get("minLength", 0), node.get("maxLength", 24)
    if "pattern" in node:
        return st.from_regex(node["pattern"], fullmatch=True).filter(lambda s: lo <= len(s) <= hi)
    return st.text(string.ascii_letters + string.digits + "-/._:", min_size=max(lo, 1), max_size=min(hi, 24))


def _number(node: dict[str, Any], integer: bool) -> st.SearchStrategy[Any]:
    lo, hi = node.get("minimum"), node.get("maximum")
    if integer:
        lo = None if lo is None else int(lo) + (1 if node.get("exclusiveMinimum") else 0)
        hi = None if hi is None else int(hi) - (1 if node.get("exclusiveMaximum") else 0)
        lo = lo if lo is not None else -3
        return st.integers(lo, hi if hi is not None else lo + 5000)
    floats = st.floats(lo if lo is not None else -1e3, hi if hi is not None else 1e4, allow_nan=False,
                       allow_infinity=False, exclude_min=bool(node.get("exclusiveMinimum")),
                       exclude_max=bool(node.get("exclusiveMaximum")))
    return floats | st.integers(int(lo if lo is not None else -10) + 1, int(hi if hi is not None else 10**4))


def from_schema(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of an (OpenAPI v3, structural) CRD schema node."""
    t = node.get("type")
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if node.get("x-kubernetes-int-or-string"):
        return st.integers(-2, 64) | st.sampled_from(["auto", "max", "8"])
    if t == "object" and "properties" in node:
        props = node["properties"]
        required = set(node.get("required", []))
        return st.fixed_dictionaries({k: from_schema(v, depth + 1) for k, v in props.items() if k in required},
                                     optional={k: from_schema(v, depth + 1) for k, v in props.items() if k not in required})
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        return st.dictionaries(WORD, from_schema(node["additionalProperties"], depth + 1),
                               max_size=min(node.get("maxProperties", 3), 3))
    if t == "object":
        return st.dictionaries(WORD, WORD, max_size=2)
    if t == "array":
        return st.lists(from_schema(node["items"], depth + 1), min_size=node.get("minItems", 0),
                        max_size=min(node.get("maxItems", 2), 2))
    if t == "string":
        return _string(node)
    if t == "integer":
        return _number(node, integer=True)
    if t == "number":
        return _number(node, integer=False)
    if t == "boolean":
        return st.booleans()
    raise AssertionError(f"schema node without a known type: {node}")


def _validate(tmp_path: Path, doc: Any) -> tuple[int, str]:
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(doc))
    result = runner.invoke(app, ["validate", str(f)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def _manifest(kind: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": kind, "metadata": {"name": "fuzz", "namespace": "ml"},
            "spec": spec}


@settings(FUZZ, max_examples=60)  # CEL evaluation (celpy) costs ~0.2 s per InferenceService
@given(data=st.data(), kind=st.sampled_from(KINDS))
def test_schema_valid_specs_are_accepted_exactly_when_the_cel_rules_hold(tmp_path: Path, data: Any, kind: str) -> None:
    node = _schema(kind)["properties"]["spec"]
    spec = data.draw(from_schema(node), label="spec")
    jsonschema.validate(spec, _to_jsonschema(node))  # the generator stays inside the schema
    code, out = _validate(tmp_path, _manifest(kind, spec))
    failed = failed_cel_rules(kind, spec)
    if failed:
        assert code == 1 and ": spec" in out, (failed, out)
    elif code != 0:
        problems = [ln for ln in out.splitlines() if ln.startswith("✗")]
        assert code == 1 and problems and all(any(p.search(ln) for p in PYDANTIC_ONLY) for ln in problems), out


# ---- mutations of a valid example -------------------------------------------------------------------------
def _paths(node: dict[str, Any], doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(path, schema node) of every value present in `doc`."""
    out = [(path, node)]
    if isinstance(doc, dict) and "properties" in node:
        for k, v in doc.items():
            if k in node["properties"]:
                out += _paths(node["properties"][k], v, (*path, k))
    elif isinstance(doc, list) and isinstance(node.get("items"), dict):
        for i, v in enumerate(doc):
            out += _paths(node["items"], v, (*path, i))
    return out


def _render(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out.lstrip(".")


def _invalid_values(node: dict[str, Any]) -> list[Any]:
    """Values the schema at `node` refuses."""
    t = "int-or-string" if node.get("x-kubernetes-int-or-string") else node.get("type")
    bad: list[Any] = {"int-or-string": [1.5, ["x"], {"a": 1}],
                      "string": [12, ["x"]], "integer": ["seven", 1.5, {"a": 1}], "number": ["fast", [1]],
                      "boolean": ["maybe", 3], "array": ["x", {"a": 1}], "object": ["x", 3, [1]]}[t]
    if "enum" in node:
        bad.append("not-" + str(node["enum"][0]))
    if "minimum" in node:
        bad.append(node["minimum"] - (0 if node.get("exclusiveMinimum") else 1))
    if "maximum" in node:
        bad.append(node["maximum"] + (0 if node.get("exclusiveMaximum") else 1))
    if "maxLength" in node:
        bad.append("a" * (node["maxLength"] + 1))
    if t == "string" and "pattern" in node:
        bad.append("Not A DNS Label!")
    return bad


@FUZZ
@given(data=st.data(), kind=st.sampled_from(KINDS))
def test_mutated_specs_are_rejected_naming_the_field(tmp_path: Path, data: Any, kind: str) -> None:
    node = _schema(kind)["properties"]["spec"]
    spec = copy.deepcopy(EXAMPLES[kind]["spec"])
    path, sub = data.draw(st.sampled_from(_paths(node, spec)[1:]), label="path")
    parent = spec
    for p in path[:-1]:
        parent = parent[p]
    how = data.draw(st.sampled_from(["value", "unknown-field", "drop-required"]), label="how")
    if how == "unknown-field" and sub.get("type") == "object" and "properties" in sub:
        parent[path[-1]]["bogusField"] = 1
        expect = f"spec.{_render(path)}.bogusField"
    elif how == "drop-required" and sub.get("required"):
        victim = data.draw(st.sampled_from(sub["required"]), label="required")
        del parent[path[-1]][victim]
        expect = f"spec.{_render(path)}.{victim}"
    else:
        parent[path[-1]] = data.draw(st.sampled_from(_invalid_values(sub)), label="value")
        expect = f"spec.{_render(path)}"
    code, out = _validate(tmp_path, _manifest(kind, spec))
    assert code == 1, out
    assert expect in out, (expect, out)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.yaml")), ids=lambda p: p.name)
def test_hostile_manifests_corpus(path: Path) -> None:
    """Each file states the field path `llmfleet validate` must name in its first line: `# expect: PATH`."""
    expect = path.read_text().splitlines()[0].removeprefix("# expect:").strip()
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
    assert expect in result.output, result.output
