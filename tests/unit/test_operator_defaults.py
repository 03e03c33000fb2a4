"""Cluster-wide spec defaults (the chart's `defaults:` values) fill what a CR leaves out, never more."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.api import InferenceService
from llmfleet.operator.builders.inferenceservice import build_inferenceservice
from llmfleet.operator.config import OperatorConfig, load_spec_defaults, with_spec_defaults

DEFAULTS = {"router": {"replicas": 3, "requestTimeoutSeconds": 30}, "autoscaling": {"policy": "queue"}}


def test_missing_sections_and_keys_come_from_defaults() -> None:
    spec = with_spec_defaults({"model": {"path": "/m"}, "router": {"replicas": 2}}, DEFAULTS)
    assert spec["router"] == {"replicas": 2, "requestTimeoutSeconds": 30}  # the CR wins
    assert spec["autoscaling"] == {"policy": "queue"}
    assert spec["model"] == {"path": "/m"}


def test_no_defaults_is_identity() -> None:
    spec = {"model": {"path": "/m"}}
    assert with_spec_defaults(spec, {}) == spec


def test_defaults_reach_the_router_deployment() -> None:
    doc = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "s", "uid": "u-1"},
           "spec": with_spec_defaults({"model": {"path": "/m"}, "resources": {"gpus": 1}}, DEFAULTS)}
    manifests = build_inferenceservice(InferenceService.model_validate(doc), OperatorConfig(spec_defaults=DEFAULTS))
    router = next(m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "s-router")
    assert router["spec"]["replicas"] == 3


def test_defaults_file_is_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "defaults.yaml"
    good.write_text("router:\n  replicas: 2\nautoscaling:\n  policy: static\n")
    assert load_spec_defaults(str(good)) == {"router": {"replicas": 2}, "autoscaling": {"policy": "static"}}
    assert load_spec_defaults(None) == {}
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: /x\n")
    with pytest.raises(ValueError, match="unknown sections"):
        load_spec_defaults(str(bad))
    with pytest.raises(ValueError, match="LLMFLEET_DEFAULTS_FILE"):
        load_spec_defaults(str(tmp_path / "missing.yaml"))
