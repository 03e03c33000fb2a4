"""Pieces every builder uses: metadata with the managed labels, owner references, resources."""

from __future__ import annotations

from typing import Any

from llmfleet.api import InferenceService, TrainingJob
from llmfleet.api.contracts import GPU_PRODUCT_LABEL, GPU_RESOURCE, MANAGED_LABELS, MIG_RESOURCE_PREFIX

Manifest = dict[str, Any]

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


def resource_requests(cpu: str, memory: str, gpus: int, mig_profile: str | None = None) -> dict[str, Any]:
    """Requests and limits; `gpus` whole GPUs, or as many MIG instances of `mig_profile`."""
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    limits: dict[str, Any] = {"memory": memory}
    if gpus:
        key = f"{MIG_RESOURCE_PREFIX}{mig_profile}" if mig_profile else GPU_RESOURCE
        requests[key] = limits[key] = str(gpus)
    return {"requests": requests, "limits": limits}


def gpu_node_selector(gpu_type: str | None) -> dict[str, str]:
    return {GPU_PRODUCT_LABEL: f"NVIDIA-{gpu_type}"} if gpu_type else {}


def gpu_tolerations(gpus: int) -> list[dict[str, Any]]:
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] if gpus else []
