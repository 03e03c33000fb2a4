"""Pieces every builder uses: metadata with the managed labels, owner references, resources."""

from __future__ import annotations

from typing import Any

from llmfleet.api import InferenceService, TrainingJob
from llmfleet.api.common import Toleration
from llmfleet.api.contracts import GPU_PRODUCT_LABEL, GPU_RESOURCE, MANAGED_LABELS, MIG_RESOURCE_PREFIX
from llmfleet.plan.hardware import gpu_products

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


def node_placement(gpu_type: str | None, node_selector: dict[str, str] | None) -> dict[str, Any]:
    """The pod spec's node selection: the spec's nodeSelector when it has one; else a required node affinity for
    every product label GPU feature discovery gives a GPU of `gpu_type` (a nodeSelector matches one value exactly,
    and one type has several product names: "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", ...); a type outside the
    table is taken as the label "NVIDIA-<gpuType>"; nothing without a type."""
    if node_selector:
        return {"nodeSelector": dict(node_selector)}
    if not gpu_type:
        return {}
    values = [p.replace(" ", "-") for p in gpu_products(gpu_type) or (f"NVIDIA {gpu_type}",)]
    term = {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": values}]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}}


def tolerations(gpus: int, extra: list[Toleration] | None) -> list[dict[str, Any]]:
    """The pod's tolerations: the nvidia.com/gpu taint's (the device plugin's convention) for GPU pods, and the
    spec's own."""
    gpu = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] if gpus else []
    return gpu + [t.to_wire() for t in extra or []]
