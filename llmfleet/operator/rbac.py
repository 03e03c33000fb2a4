"""The exact RBAC rules the operator process needs, as data: the Helm chart renders its (Cluster)Roles from
OPERATOR_RULES (charts/llmfleet/hack/generate.py), tests/unit/test_chart_rbac.py checks the chart against them,
and the operator and autoscaler integration tests run against an API emulator that answers 403 to every
request these rules do not grant (tests/rbac_enforcer.py). No wildcards.

Why each rule exists (the operator process runs kopf, the reconcilers and the autoscaler's kopf timers):
- llmfleet CRs: kopf lists and watches them and patches them (finalizers, annotations, status); the
  reconcilers and the autoscaler `get` an InferenceService and patch its spec (promotion, replicas); GPU
  arbitration lists and patches TrainingJobs; a child's change reads its owner (`get`). Nothing `update`s
  (PUT): every write is a patch.
- `/status`: kopf and the child-event handler patch status through the status subresource.
- events: kopf and the autoscaler post Events (create only).
- namespaces: kopf lists and watches them to resolve namespace globs (`--namespace 'team-*'`).
- CRDs: the operator reads a CRD to tell whether an optional API is served (PodGroup, PodMonitor, kopf's
  peering); kopf lists and watches them to learn served resources.
- kopf peerings: leader election between operator replicas (kopf watches and patches; the start-up check
  reads the object).
- children: server-side apply is a `patch`, plus `create` for the first apply of an object. `list` and
  `delete` only where the operator prunes (reconcile_isvc.PRUNED_KINDS) or restarts a failed training gang
  (Jobs); `watch` where kopf watches the kind (Deployments, Jobs; their changes reconcile the owner); `get`
  on Jobs (with Kueue the operator reads the Job before applying).
- pods: the autoscaler lists a pool's pods (replica URLs, pending GPUs) and labels/annotates the pod it
  drains (merge patch); it never deletes one (the Deployment does).
- endpointslices: the operator creates a Role per router granting the router's discovery rules
  (llmfleet.router.config.DISCOVERY_RULES); Kubernetes only lets it grant permissions it holds itself (RBAC
  escalation prevention), so it holds exactly those.
"""

from __future__ import annotations

from typing import Any

from llmfleet.api.contracts import GROUP, INFERENCESERVICE_PLURAL, TRAININGJOB_PLURAL
from llmfleet.router.config import DISCOVERY_RULES

_APPLY = ["create", "patch"]  # server-side apply: patch, and create when the object is new
_APPLY_PRUNE = ["list", "create", "patch", "delete"]  # applied, and pruned when the spec drops them

OPERATOR_RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "resources": [INFERENCESERVICE_PLURAL, TRAININGJOB_PLURAL],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{INFERENCESERVICE_PLURAL}/status", f"{TRAININGJOB_PLURAL}/status"],
     "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings", "kopfpeerings"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps", "serviceaccounts", "persistentvolumeclaims"], "verbs": _APPLY},
    {"apiGroups": [""], "resources": ["services"], "verbs": _APPLY_PRUNE},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": _APPLY},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _APPLY_PRUNE},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _APPLY_PRUNE},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": _APPLY},
    *({k: list(v) for k, v in rule.items()} for rule in DISCOVERY_RULES),
    {"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups"], "verbs": _APPLY},
    {"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors"], "verbs": _APPLY},
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
