"""The exact RBAC rules the operator needs, as data: the Helm chart renders its ClusterRole from these and
tests check the chart against them. No wildcards.

Why each rule exists:
- llmfleet CRs: watch them (kopf), write status, patch an InferenceService's spec/annotations (promotion).
- events: kopf posts Kubernetes Events (core/v1).
- namespaces, CRDs: kopf's dynamic scanning of watched namespaces and served resources.
- kopf peerings: leader election between operator replicas.
- children: server-side apply (`patch`, plus `create` for the first apply), `get`/`list` to read and prune,
  `watch` on Deployments and Jobs (their changes reconcile the owner), `delete` to prune removed pools and
  to restart a failed training gang.
- endpointslices: the operator creates a Role for each router that grants reading EndpointSlices; Kubernetes
  only lets it grant permissions it holds itself (RBAC escalation prevention).
"""

from __future__ import annotations

from typing import Any

from llmfleet.api.contracts import GROUP, INFERENCESERVICE_PLURAL, TRAININGJOB_PLURAL

_CHILD_VERBS = ["get", "list", "create", "patch", "delete"]
_WATCHED_CHILD_VERBS = ["get", "list", "watch", "create", "patch", "delete"]  # kopf watches these kinds

OPERATOR_RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "resources": [INFERENCESERVICE_PLURAL, TRAININGJOB_PLURAL],
     "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": [GROUP], "resources": [f"{INFERENCESERVICE_PLURAL}/status", f"{TRAININGJOB_PLURAL}/status"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings", "kopfpeerings"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps", "services", "serviceaccounts", "persistentvolumeclaims"],
     "verbs": _CHILD_VERBS},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": _WATCHED_CHILD_VERBS},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _WATCHED_CHILD_VERBS},
    {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": _CHILD_VERBS},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _CHILD_VERBS},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _CHILD_VERBS},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": _CHILD_VERBS},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups"], "verbs": _CHILD_VERBS},
    {"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors"], "verbs": _CHILD_VERBS},
]


def cluster_role(name: str = "llmfleet-operator", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A ClusterRole manifest with OPERATOR_RULES."""
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta,
        "rules": [dict(rule) for rule in OPERATOR_RULES],
    }


def allows(group: str, resource: str, verb: str) -> bool:
    """Whether OPERATOR_RULES grant `verb` on `group`/`resource` (resource may be `plural/subresource`)."""
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in OPERATOR_RULES
    )
