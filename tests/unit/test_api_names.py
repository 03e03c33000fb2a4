"""Names that must resolve: scorer names against the router's plugin registry, student pool names against
the operator's child names. Checked by `llmfleet validate`, the CRD's CEL rules and the operator."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from llmfleet.api import InferenceService, ManifestError, parse_resource
from llmfleet.api.inferenceservice import PRIMARY_POOL, RESERVED_POOL_NAMES, SCORER_NAMES
from llmfleet.cli.main import app
from llmfleet.operator.builders import build_inferenceservice
from llmfleet.operator.builders.inferenceservice import pool_name
from llmfleet.operator.config import Capabilities, OperatorConfig
from llmfleet.router.config import KNOWN_SCORERS
from llmfleet.router.plugins import PrefixIndex, build_scorer
from llmfleet.router.plugins.builtin import SCORERS

from .test_crds import failed_cel_rules

FULL = OperatorConfig(capabilities=Capabilities(pod_group=True, pod_monitor=True))


def _isvc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": {"path": "/models/llama"}, **spec}
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "ml", "uid": "u-1"}, "spec": base}


def _student(name: str) -> dict[str, Any]:
    return {"pools": [{"name": name, "model": {"path": "/models/small"}}]}


def test_plugin_registry_and_api_agree_on_scorer_names() -> None:
    assert sorted(SCORERS) == sorted(SCORER_NAMES) == sorted(KNOWN_SCORERS)
    for name in SCORER_NAMES:
        assert build_scorer(name, PrefixIndex()) is not None


def test_unknown_scorer_is_rejected_with_its_field_path() -> None:
    with pytest.raises(ManifestError) as info:
        parse_resource(_isvc(router={"scorers": {"prefix-cache": 1.0, "prefix-cahce": 0.5}}))
    (path, msg), = info.value.problems
    assert path == "spec.router.scorers" and "'prefix-cahce'" in msg and "prefix-cache" in msg
    assert failed_cel_rules("InferenceService", _isvc(router={"scorers": {"prefix-cahce": 1.0}})["spec"])
    assert not failed_cel_rules("InferenceService", _isvc(router={"scorers": dict.fromkeys(SCORER_NAMES, 1.0)})["spec"])


@pytest.mark.parametrize("name", RESERVED_POOL_NAMES)
def test_reserved_pool_names_are_rejected(name: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_resource(_isvc(fallback=_student(name)))
    (path, msg), = info.value.problems
    assert path == "spec.fallback.pools[0].name" and "reserved" in msg
    assert failed_cel_rules("InferenceService", _isvc(fallback=_student(name))["spec"])


def test_validate_cli_reports_reserved_pool_and_unknown_scorer(tmp_path: Any) -> None:
    import yaml

    f = tmp_path / "isvc.yaml"
    f.write_text(yaml.safe_dump(_isvc(fallback=_student("router"), router={"scorers": {"typo": 1.0}})))
    result = CliRunner().invoke(app, ["validate", str(f)])
    assert result.exit_code == 1
    assert "spec.fallback.pools[0].name" in result.output and "spec.router.scorers" in result.output


def test_reserved_names_cover_every_child_a_pool_name_could_collide_with() -> None:
    """Derived from the builders: every non-pool child whose kind a pool also renders is named
    `<service>-<reserved name>`, so no allowed pool name can produce the same (kind, name)."""
    isvc = parse_resource(_isvc(fallback=_student("student"), router={"apiKeysSecret": "keys"},
                                featureStore={"generationSchedule": "0 3 * * *"}))
    assert isinstance(isvc, InferenceService)
    children = build_inferenceservice(isvc, FULL)
    pool_children = {(m["kind"], m["metadata"]["name"]) for m in children
                     if m["metadata"]["name"] in {pool_name(isvc, p.name) for p in isvc.pools()}}
    pool_kinds = {kind for kind, _ in pool_children}
    others = {(m["kind"], m["metadata"]["name"]) for m in children} - pool_children
    prefix = f"{isvc.metadata.name}-"
    for kind, name in sorted(others):
        if kind in pool_kinds:
            assert name.startswith(prefix) and name.removeprefix(prefix) in RESERVED_POOL_NAMES, (kind, name)
    assert PRIMARY_POOL in RESERVED_POOL_NAMES
