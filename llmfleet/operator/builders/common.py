"""Pieces every builder uses: labels, owner references, child names."""

from __future__ import annotations

import hashlib
from typing import Any

from llmfleet.api import InferenceService, TrainingJob

Manifest = dict[str, Any]

MANAGED_LABELS = {"app.kubernetes.io/managed-by": "llmfleet", "app.kubernetes.io/part-of": "llmfleet"}


def child_name(owner: str, suffix: str = "", limit: int = 63) -> str:
    """`<owner>-<suffix>`, shortened with a stable hash when longer than `limit` (DNS-1123 label)."""
    name = f"{owner}-{suffix}" if suffix else owner
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = limit - len(digest) - 1
    return f"{name[:keep].rstrip('-')}-{digest}"


def owner_reference(cr: InferenceService | TrainingJob) -> dict[str, Any]:
    """Owner reference to the CR: Kubernetes garbage-collects the child when the CR goes."""
    if not cr.metadata.uid:
        raise ValueError(f"{cr.kind} {cr.metadata.name} has no metadata.uid (not read from the API server)")
    return {
        "apiVersion": cr.api_version,
        "kind": cr.kind,
        "name": cr.metadata.name,
        "uid": cr.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
    cr: InferenceService | TrainingJob, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": cr.metadata.namespace or "default",
        "labels": {**MANAGED_LABELS, **labels},
        "ownerReferences": [owner_reference(cr)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def resource_requests(cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    limits: dict[str, Any] = {"memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
    return {"requests": requests, "limits": limits}


def gpu_node_selector(gpu_type: str | None) -> dict[str, str]:
    # The NVIDIA GPU feature discovery label; values look like "NVIDIA-H200".
    return {"nvidia.com/gpu.product": f"NVIDIA-{gpu_type}"} if gpu_type else {}


def gpu_tolerations(gpus: int) -> list[dict[str, Any]]:
    return [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}] if gpus else []
