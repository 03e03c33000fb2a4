"""The chart's RBAC is exactly what the operator declares it needs (llmfleet/operator/rbac.py OPERATOR_RULES):
no more (least privilege, no wildcards), no less; namespaced Roles when watchNamespaces is set."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmchart import helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "llmfleet"
RBAC_KINDS = ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")

pytestmark = pytest.mark.helm

Triple = tuple[str, str, str, str]  # (apiGroup, resource, verb, resourceName or "")


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "llmfleet_chart_generate_rbac", CHART / "hack" / "generate.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _generator()


def operator_rules() -> list[dict[str, list[str]]]:
    from llmfleet.operator.rbac import OPERATOR_RULES

    return [gen._normalize_rule(r) for r in OPERATOR_RULES]


def triples(rules: list[dict[str, list[str]]]) -> set[Triple]:
    out: set[Triple] = set()
    for r in rules:
        for g in r.get("apiGroups", [""]):
            for res in r.get("resources", []):
                for v in r.get("verbs", []):
                    for name in r.get("resourceNames") or [""]:
                        out.add((g, res, v, name))
    return out


def render(*sets: str) -> list[dict[str, Any]]:
    args = [helm_binary(), "template", "rel", str(CHART), "--namespace", "llmfleet-system"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] in RBAC_KINDS]


def test_rbac_file_is_fresh() -> None:
    text = (CHART / "files" / "operator-rbac.yaml").read_text()
    assert text == gen.render_rbac(), (
        "charts/llmfleet/files/operator-rbac.yaml is stale: run `make chart-docs`"
    )


def test_operator_rules_have_no_wildcards() -> None:
    for rule in operator_rules():
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"wildcard {key} in {rule}"


def test_cluster_wide_rbac_equals_operator_rules() -> None:
    docs = render()
    roles = [d for d in docs if d["kind"] == "ClusterRole"]
    assert len(roles) == 1 and not [d for d in docs if d["kind"] == "Role"]
    assert triples(roles[0]["rules"]) == triples(operator_rules())
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-llmfleet", "namespace": "llmfleet-system"}
    ]


def test_watch_namespaces_gives_namespaced_roles() -> None:
    docs = render("operator.watchNamespaces={team-a,team-b}")
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    split = gen.split_rules(operator_rules())
    for role in roles.values():
        assert triples(role["rules"]) == triples(split["namespaced"])
    # Only cluster-scoped resources stay in a ClusterRole: no cluster-wide access to workloads.
    cluster = [d for d in docs if d["kind"] == "ClusterRole"]
    cluster_triples = set().union(*(triples(c["rules"]) for c in cluster)) if cluster else set()
    assert cluster_triples == triples(split["cluster"])
    assert all((g, r.split("/")[0]) in gen.CLUSTER_SCOPED for g, r, _, _ in cluster_triples)
    assert cluster_triples | triples(split["namespaced"]) == triples(operator_rules())
    for b in bindings.values():
        assert b["subjects"][0]["namespace"] == "llmfleet-system"


def test_split_sends_cluster_scoped_resources_to_the_cluster_role() -> None:
    split = gen.split_rules(
        [
            {
                "apiGroups": ["apiextensions.k8s.io"],
                "resources": ["customresourcedefinitions"],
                "verbs": ["get"],
            },
            {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list"]},
        ]
    )
    assert triples(split["cluster"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "get", ""),
        ("", "namespaces", "list", ""),
    }
    assert triples(split["namespaced"]) == {("", "pods", "list", "")}


def test_peering_permissions_match_the_mode() -> None:
    """kopf peering needs its peering objects: cluster-wide ClusterKopfPeering, or KopfPeering per namespace."""
    wanted = triples(operator_rules())
    cluster_peering = {t for t in wanted if t[1] == "clusterkopfpeerings"}
    ns_peering = {t for t in wanted if t[1] == "kopfpeerings"}
    assert {v for _, _, v, _ in cluster_peering} >= {"get", "list", "watch", "patch"}, (
        "OPERATOR_RULES lacks clusterkopfpeerings"
    )
    assert {v for _, _, v, _ in ns_peering} >= {"get", "list", "watch", "patch"}, (
        "OPERATOR_RULES lacks kopfpeerings"
    )


def test_rbac_can_be_turned_off() -> None:
    assert render("rbac.create=false") == []


def test_chart_grants_the_autoscaler_its_pod_access() -> None:
    """The autoscaler runs in the operator process: it lists a pool's pods and labels the one it drains
    (tests/integration/autoscaler runs it against an emulator that enforces these very rules)."""
    granted = triples(next(d for d in render() if d["kind"] == "ClusterRole")["rules"])
    assert {("", "pods", "list", ""), ("", "pods", "patch", "")} <= granted
    assert not {t for t in granted if t[1] == "pods" and t[2] not in ("list", "patch")}


@pytest.mark.parametrize("sets", [(), ("operator.watchNamespaces={ml}",)])
def test_chart_lets_the_operator_grant_each_router_its_role(sets: tuple[str, ...]) -> None:
    """Kubernetes refuses a Role that grants more than its creator holds (escalation prevention): the router
    Role the operator applies must be covered by what the chart gives the operator, in either mode."""
    from llmfleet.api import InferenceService
    from llmfleet.operator.builders import build_inferenceservice
    from llmfleet.operator.config import OperatorConfig

    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "a", "namespace": "ml", "uid": "u"},
        "spec": {"model": {"path": "/m"}, "resources": {"gpus": 1}},
    })
    (role,) = [m for m in build_inferenceservice(isvc, OperatorConfig()) if m["kind"] == "Role"]
    docs = render(*sets)
    held = set().union(*(triples(d["rules"]) for d in docs
                         if d["kind"] == "ClusterRole" or (d["kind"] == "Role" and d["metadata"]["namespace"] == "ml")))
    assert triples(role["rules"]) <= held
