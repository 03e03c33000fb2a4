"""Helm chart checks that run without a cluster: helm lint, helm template with the defaults and every
charts/llmfleet/ci/*.yaml, each rendered manifest validated against the Kubernetes schemas
(kubernetes-validate) or the CRDs, PodSecurity defaults, labels, RBAC minimality and the CRD copies.

helm comes from `make tools` (.tools/bin/helm); `make test` fetches it first.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helmchart import CHART, NAMESPACE, ROOT, helm, render

pytestmark = pytest.mark.helm

CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
K8S_VERSION = "1.34.0"  # the kind node image in e2e/kind.yaml


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Rendered manifests per ci values file (rendered once per module: helm takes ~0.2 s a call)."""
    return {f.name: render("-f", str(f)) for f in CI_VALUES}


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of every CRD the chart ships."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for f in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(f.read_text()):
            if not crd:
                continue
            spec = crd["spec"]
            for v in spec["versions"]:
                out[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


def validate_against_crd(doc: dict[str, Any], schema: dict[str, Any]) -> None:
    """Structural check against a CRD's openAPIV3Schema (OpenAPI 3.0 is JSON Schema draft 4 plus
    x-kubernetes-* extensions, which the validator ignores; CEL rules are the API server's job)."""
    jsonschema.Draft4Validator(schema).validate(doc)


# Kinds from CRDs that are neither in the chart nor in Kubernetes (prometheus-operator): checked by shape.
FOREIGN_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def validate_manifest(doc: dict[str, Any], schemas: dict[tuple[str, str], dict[str, Any]]) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in schemas:
        validate_against_crd(doc, schemas[key])
    elif key in FOREIGN_KINDS:
        assert doc["spec"]["endpoints"] and doc["spec"]["selector"]["matchLabels"]
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_ci_values_exist() -> None:
    names = {f.name for f in CI_VALUES}
    assert {"default-values.yaml", "namespaced-values.yaml", "ha-values.yaml", "kind-values.yaml"} <= names


def test_helm_lint_strict() -> None:
    proc = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout
    for f in CI_VALUES:
        helm("lint", "--strict", str(CHART), "-f", str(f))


def test_every_rendered_manifest_is_valid(rendered: dict[str, list[dict[str, Any]]]) -> None:
    schemas = crd_schemas()
    for name, docs in rendered.items():
        kinds = Counter(d["kind"] for d in docs)
        assert kinds["StatefulSet"] == 1 and kinds["CustomResourceDefinition"] == 4, (name, kinds)
        for doc in docs:
            try:
                validate_manifest(doc, schemas)
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as err:
                raise AssertionError(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {err}") from err


def test_validation_catches_a_broken_manifest() -> None:
    """The validator itself rejects a bad field (so the test above can fail)."""
    deployment = _deployment(render())
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_chart_objects_carry_the_helper_labels(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():
        for doc in docs:
            if doc["kind"] == "CustomResourceDefinition":
                continue
            labels = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/part-of"] == "llmfleet", doc["metadata"]["name"]
            assert labels["app.kubernetes.io/instance"] == "rel"
            assert labels["helm.sh/chart"].startswith("llmfleet-")


def _deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's workload (a StatefulSet: its pod ordinal is the kopf peering priority)."""
    return next(d for d in docs if d["kind"] == "StatefulSet")


def test_pod_security_restricted_defaults(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = _deployment(rendered["default-values.yaml"])["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "limits" in container["resources"] and "requests" in container["resources"]
    assert {p["containerPort"] for p in container["ports"]} == {8080, 8081}


def test_workloads_run_as_user_reaches_the_operator() -> None:
    def pod_user(*args: str) -> str:
        env = _deployment(render(*args))["spec"]["template"]["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "LLMFLEET_POD_USER")

    def pull_secrets(*args: str) -> str:
        env = _deployment(render(*args))["spec"]["template"]["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "LLMFLEET_IMAGE_PULL_SECRETS")

    assert pull_secrets() == ""
    assert pull_secrets("--set", "workloads.imagePullSecrets[0].name=regcred",
                        "--set", "workloads.imagePullSecrets[1].name=mirror") == "regcred,mirror"
    assert helm("template", "rel", str(CHART), "--set", "workloads.imagePullSecrets[0].name=Bad_Name",
                check=False).returncode != 0
    assert pod_user("--set", "workloads.runAsUser=1000740000") == "1000740000"
    assert pod_user("--set", "workloads.runAsUser=null") == "image"
    assert helm("template", "rel", str(CHART), "--set", "workloads.runAsUser=0", check=False).returncode != 0


def test_operator_args_env_and_images(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default = _deployment(rendered["default-values.yaml"])["spec"]["template"]["spec"]["containers"][0]
    assert default["args"][:2] == ["operator", "--all-namespaces"]
    assert "--metrics-port=8080" in default["args"] and "--liveness-port=8081" in default["args"]
    assert "--peering=llmfleet" in default["args"] and "--priority=$(POD_INDEX)" in default["args"]
    index_env = next(e for e in default["env"] if e["name"] == "POD_INDEX")
    assert (
        index_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    env = {e["name"]: e.get("value") for e in default["env"]}
    # kopf's identity, the tie-break between peers of equal priority: unique in the cluster (two releases
    # sharing a peering name both have a pod 0), from variables defined before it.
    assert env["POD_ID"] == "$(POD_NAME).$(POD_NAMESPACE)"
    assert env["LLMFLEET_POD_USER"] == "10001"  # workloads.runAsUser: the user of the pods the operator creates
    names = [e["name"] for e in default["env"]]
    assert names.index("POD_NAME") < names.index("POD_ID") and names.index("POD_NAMESPACE") < names.index("POD_ID")
    assert env["LLMFLEET_ROUTER_IMAGE"] == "ghcr.io/llmfleet/llmfleet:0.1.0"
    assert env["LLMFLEET_SERVE_IMAGE"] == "ghcr.io/llmfleet/llmfleet-serve:0.1.0"
    assert env["LLMFLEET_TRAIN_IMAGE"] == "ghcr.io/llmfleet/llmfleet-train:0.1.0"
    assert default["image"] == "ghcr.io/llmfleet/llmfleet-operator:0.1.0"

    ns = _deployment(rendered["namespaced-values.yaml"])["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=team-a" in ns["args"] and "--namespace=team-b" in ns["args"]
    assert "--all-namespaces" not in ns["args"]

    ha = _deployment(rendered["ha-values.yaml"])["spec"]["template"]["spec"]["containers"][0]
    assert ha["image"].endswith("@sha256:" + "0" * 64)

    kind = _deployment(rendered["kind-values.yaml"])["spec"]["template"]["spec"]["containers"][0]
    kind_env = {e["name"]: e.get("value") for e in kind["env"]}
    assert kind_env["LLMFLEET_SERVE_IMAGE"] == "ghcr.io/llmfleet/llmfleet-serve-cpu:e2e"


def test_leader_election_peering_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    cluster = [d for d in rendered["ha-values.yaml"] if d["kind"] == "ClusterKopfPeering"]
    assert [d["metadata"]["name"] for d in cluster] == ["llmfleet"]
    assert any(d["kind"] == "PodDisruptionBudget" for d in rendered["ha-values.yaml"])
    namespaced = [d for d in rendered["namespaced-values.yaml"] if d["kind"] == "KopfPeering"]
    assert sorted(d["metadata"]["namespace"] for d in namespaced) == ["team-a", "team-b"]
    minimal = rendered["minimal-values.yaml"]
    assert not [
        d for d in minimal if d["kind"] in ("ClusterKopfPeering", "KopfPeering", "PodDisruptionBudget")
    ]
    args = _deployment(minimal)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" in args and not any(a.startswith(("--peering", "--priority")) for a in args)


def test_two_replicas_without_peering_is_refused() -> None:
    proc = helm(
        "template",
        "rel",
        str(CHART),
        "--set",
        "operator.replicaCount=2",
        "--set",
        "leaderElection.enabled=false",
        check=False,
    )
    assert proc.returncode != 0 and "leaderElection.enabled" in proc.stderr


def test_optional_objects_off_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {d["kind"] for d in rendered["default-values.yaml"]}
    assert "ServiceMonitor" not in kinds and "PodDisruptionBudget" not in kinds
    assert not [d for d in rendered["default-values.yaml"] if d["metadata"]["name"].endswith("-dashboard")]
    on = rendered["namespaced-values.yaml"]
    dash = next(d for d in on if d["metadata"]["name"].endswith("-dashboard"))
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["metadata"]["namespace"] == "monitoring"
    assert any(d["kind"] == "ServiceMonitor" for d in on)


def test_chart_crds_are_identical_copies_of_the_generated_ones() -> None:
    generated = {f.name: f.read_bytes() for f in (ROOT / "crds").glob("*.yaml")}
    assert generated, "crds/ is empty: run `make crds`"
    shipped = {f.name: f.read_bytes() for f in (CHART / "crds").glob("*.yaml")}
    for name, content in generated.items():
        assert shipped.get(name) == content, (
            f"charts/llmfleet/crds/{name} differs from crds/{name}: run `make crds`"
        )
    # The only extra file is kopf's peering CRDs (leader election).
    assert set(shipped) - set(generated) == {"kopf.dev_peerings.yaml"}


def test_cr_examples_validate_against_the_shipped_crds() -> None:
    schemas = crd_schemas()
    examples = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
        (ROOT / "examples" / "local").glob("*.yaml")
    )
    examples += sorted((ROOT / "e2e" / "manifests").glob("*.yaml"))
    checked = 0
    for f in examples:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("apiVersion", "").startswith("llmfleet.io/"):
                validate_against_crd(doc, schemas[(doc["apiVersion"], doc["kind"])])
                checked += 1
    assert checked >= 4


def test_notes_give_next_steps() -> None:
    out = helm(
        "install",
        "rel",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "-f",
        str(CHART / "ci" / "namespaced-values.yaml"),
    ).stdout
    notes = out[out.index("NOTES:") :]
    assert "rollout status statefulset/rel-llmfleet" in notes
    assert "namespaces: team-a, team-b" in notes
    assert "kubectl apply -f examples/inferenceservice-small.yaml" in notes
    assert "grafana_dashboard" in notes


def test_replica_network_policy_admits_the_charts_operator_and_scrapers(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The operator's LLMFLEET_REPLICA_INGRESS_FROM (from the chart) yields NetworkPolicies that admit the
    operator's own pods (drain checks, direct scrapes) and the configured scrapers; they validate strictly."""
    import copy

    import kubernetes_validate

    from llmfleet.api import InferenceService
    from llmfleet.operator.builders.inferenceservice import build_replica_network_policy
    from llmfleet.operator.config import OperatorConfig, load_peers

    pod = _deployment(rendered["default-values.yaml"])["spec"]["template"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    peers = load_peers(env["LLMFLEET_REPLICA_INGRESS_FROM"])
    assert peers[0]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert peers[0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    assert {"app.kubernetes.io/name": "prometheus"} in [p.get("podSelector", {}).get("matchLabels") for p in peers]
    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u"}, "spec": {"model": {"path": "/m"}}})
    policy = build_replica_network_policy(isvc, OperatorConfig(replica_ingress_from=peers))
    kubernetes_validate.validate(copy.deepcopy(policy), "1.30", strict=True)
    assert policy["spec"]["ingress"][0]["from"][2:] == list(peers)  # after the router and the generation Job
