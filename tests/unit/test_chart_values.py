"""values.yaml: a `# --` comment on every value, camelCase keys, guarded by values.schema.json, README
generated from it and fresh, and the router/autoscaler defaults valid for the API models."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from helmchart import chart_generator, helm_binary

from llmfleet.api.inferenceservice import AutoscalingSpec, RouterSpec

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "llmfleet"
VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = yaml.safe_load((CHART / "values.schema.json").read_text())


gen = chart_generator()


def test_every_value_has_a_doc_comment() -> None:
    docs = gen.parse_values(VALUES_TEXT)
    assert len(docs) > 40
    assert gen.undocumented(docs) == []


def test_undocumented_value_is_reported() -> None:
    text = VALUES_TEXT + "\nnewSection:\n  # -- documented\n  a: 1\n  b: 2\n"
    assert gen.undocumented(gen.parse_values(text)) == ["newSection.b"]
    assert gen.undocumented(gen.parse_values("# -- whole map\nm:\n  x: 1\n")) == []


def test_keys_are_camel_case() -> None:
    """Chart keys are camelCase; the maps that hold user data (labels, scorer names, k8s passthrough) are exempt."""
    passthrough = {
        "resources",
        "podSecurityContext",
        "securityContext",
        "labels",
        "scorers",
        "nodeSelector",
        "affinity",
        "podAnnotations",
        "podLabels",
        "annotations",
        "commonLabels",
    }
    for d in gen.parse_values(VALUES_TEXT):
        if any(p in passthrough for p in d.path[:-1]):
            continue
        assert re.fullmatch(r"[a-z][a-zA-Z0-9]*", d.path[-1]), d.key


def test_readme_is_generated_and_fresh() -> None:
    readme = (CHART / "README.md").read_text()
    assert readme == gen.render_readme(VALUES_TEXT), (
        "charts/llmfleet/README.md is stale: run `make chart-docs`"
    )
    for d in gen.parse_values(VALUES_TEXT):
        if d.description:
            assert f"| `{d.key}` |" in readme


def test_readme_names_the_operator_workload_the_template_renders() -> None:
    kinds = re.findall(r"^kind:\s*(\w+)", (CHART / "templates" / "operator.yaml").read_text(), re.MULTILINE)
    assert len(kinds) == 1, kinds
    header = (CHART / "hack" / "README.header.md").read_text()
    assert f"operator {kinds[0]}" in " ".join(header.split())
    others = {"Deployment", "StatefulSet", "DaemonSet"} - {kinds[0]}
    assert not any(f"operator {k}" in " ".join(header.split()) for k in others)


def test_values_match_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(VALUES, SCHEMA)
    for f in sorted((CHART / "ci").glob("*.yaml")):
        merged = _merge(VALUES, yaml.safe_load(f.read_text()) or {})
        jsonschema.validate(merged, SCHEMA)


def test_schema_covers_every_key() -> None:
    """Each key of values.yaml is declared in the schema (unknown keys are rejected)."""

    def walk(values: dict, schema: dict, prefix: str) -> None:
        props = schema.get("properties", {})
        for key, value in values.items():
            assert key in props, f"{prefix}{key} is not in values.schema.json"
            sub = props[key]
            if isinstance(value, dict) and sub.get("additionalProperties") is False:
                walk(value, sub, f"{prefix}{key}.")

    walk(VALUES, SCHEMA, "")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


@pytest.mark.parametrize(
    "bad",
    [
        "operator.replicaCount=two",
        "operator.unknownKey=1",
        "image.pullPolicy=Sometimes",
        "defaults.autoscaling.policy=fastest",
        "leaderElection.peeringName=Not_A_Name",
    ],
)
@pytest.mark.helm
def test_helm_rejects_bad_values(bad: str) -> None:
    proc = subprocess.run(
        [helm_binary(), "template", "rel", str(CHART), "--set", bad], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0, f"--set {bad} was accepted"
    assert "schema" in proc.stderr.lower() or "values don't meet" in proc.stderr.lower(), proc.stderr


def test_defaults_are_valid_api_fields() -> None:
    """defaults.router/autoscaling use the CRD's field names: the API models accept them (typos fail)."""
    RouterSpec.model_validate(VALUES["defaults"]["router"])
    AutoscalingSpec.model_validate(VALUES["defaults"]["autoscaling"])
    with pytest.raises(ValueError):
        RouterSpec.model_validate({**VALUES["defaults"]["router"], "requestTimeout": 3})


def test_operator_ports_default_to_the_contracts() -> None:
    """The chart's default operator ports are the ones `llmfleet operator` uses without flags."""
    from llmfleet.api.contracts import OPERATOR_LIVENESS_PORT, OPERATOR_METRICS_PORT

    assert VALUES["operator"]["metricsPort"] == OPERATOR_METRICS_PORT
    assert VALUES["operator"]["livenessPort"] == OPERATOR_LIVENESS_PORT
