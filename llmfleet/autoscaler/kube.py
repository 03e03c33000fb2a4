"""The autoscaler's Kubernetes side, on llmfleet's one client (`llmfleet.kube.KubeClient`): the actuator that
scales an InferenceService, the pending-GPU count, and GPU arbitration (list TrainingJobs, patch them, post
Events).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from llmfleet.api.contracts import (
    API_VERSION,
    AUTOSCALER_STATE_ANNOTATION,
    DELETION_COST_ANNOTATION,
    DRAINING_LABEL,
    INFERENCESERVICE_LABEL,
    POOL_LABEL,
    REPLICA_PORT,
    SERVING_LABEL,
    now_iso,
    pool_selector,
)
from llmfleet.api.inferenceservice import PRIMARY_POOL, InferenceService
from llmfleet.autoscaler.actuation import (
    DrainResult,
    InFlightProbe,
    ObservedReplica,
    replicas_patch,
    scrape_in_flight,
    wait_drained,
)
from llmfleet.autoscaler.arbitration import ArbitrationAction, ServingNeed, arbitrate, job_infos, job_patch
from llmfleet.kube.client import ApiError, KubeClient

log = logging.getLogger("llmfleet.autoscaler")


class KubernetesActuator:
    """Scales one InferenceService through the Kubernetes API (llmfleet's one client, `llmfleet.kube`)."""

    def __init__(self, name: str, namespace: str, client: KubeClient, *, probe: InFlightProbe | None = None) -> None:
        self.name, self.namespace = name, namespace
        self.client = client
        self._probe = probe or scrape_in_flight

    async def _get(self) -> dict[str, Any]:
        obj = await self.client.get(API_VERSION, "InferenceService", self.namespace, self.name)
        if obj is None:
            raise ApiError(404, "NotFound", f"InferenceService {self.namespace}/{self.name} is gone")
        return obj

    async def list_replicas(self, pool: str) -> list[ObservedReplica]:
        pods = await self.client.list("v1", "Pod", self.namespace, selector=pool_selector(self.name, pool))
        out = []
        for pod in pods:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if meta.get("deletionTimestamp") or not meta.get("name"):
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            ip = status.get("podIP")
            out.append(ObservedReplica(pool=pool, name=meta["name"], url=f"http://{ip}:{REPLICA_PORT}" if ip else None, ready=ready))
        return sorted(out, key=lambda r: r.name)

    async def set_replicas(self, desired: Mapping[str, int], *, reason: str, state_json: str | None = None) -> None:
        obj = await self._get()
        ops = replicas_patch(obj.get("spec") or {}, desired)
        if state_json is not None:
            annotations = (obj.get("metadata") or {}).get("annotations")
            if annotations is None:
                ops.append({"op": "add", "path": "/metadata/annotations", "value": {AUTOSCALER_STATE_ANNOTATION: state_json}})
            else:
                ops.append({"op": "add", "path": "/metadata/annotations/" + AUTOSCALER_STATE_ANNOTATION.replace("/", "~1"),
                            "value": state_json})
        if not ops:
            return
        await self.client.json_patch(API_VERSION, "InferenceService", self.namespace, self.name, ops)

    async def _patch_pod(self, pod: str, body: dict[str, Any]) -> None:
        await self.client.merge_patch("v1", "Pod", self.namespace, pod, body)

    async def drain_and_remove(self, replica: ObservedReplica, *, timeout_s: float) -> DrainResult:
        await self._patch_pod(replica.name, {"metadata": {"labels": {DRAINING_LABEL: "true", SERVING_LABEL: "false"}}})
        drained, waited, last = await wait_drained(replica, self._probe, timeout_s=timeout_s)
        await self._patch_pod(replica.name, {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "-2147483647"}}})
        obj = await self._get()
        spec = obj.get("spec") or {}
        if replica.pool == PRIMARY_POOL:
            current = int(spec.get("replicas", 1))
        else:
            pools = (spec.get("fallback") or {}).get("pools") or []
            current = int(next((p.get("replicas", 1) for p in pools if p.get("name") == replica.pool), 0))
        if current > 0:
            await self.set_replicas({replica.pool: current - 1}, reason=f"scale-in of {replica.name}")
        return DrainResult(replica=replica, drained=drained, removed=current > 0, waited_s=waited, in_flight_at_removal=last)


async def pending_gpus(client: KubeClient, isvc: InferenceService) -> int:
    """Whole GPUs of this service's pods that are Pending because the scheduler found no room."""
    ns = isvc.metadata.namespace or "default"
    pods = await client.list("v1", "Pod", ns, {INFERENCESERVICE_LABEL: isvc.metadata.name})
    gpus_by_pool = {p.name: p.resources.whole_gpus for p in isvc.pools()}  # MIG pods: none training could free
    total = 0
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        conditions = status.get("conditions") or []
        if any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions):
            total += gpus_by_pool.get(((pod.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL, ""), 0)
    return total


def event_body(obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> dict[str, Any]:
    """A core/v1 Event about `obj`."""
    meta = obj.get("metadata") or {}
    now = now_iso()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{uuid.uuid4().hex[:12]}", "namespace": meta.get("namespace")},
        "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta.get("name"),
                           "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        "reason": reason, "message": message[:1000], "type": type_,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": "llmfleet-autoscaler"},
    }


async def post_event(client: KubeClient, obj: dict[str, Any], reason: str, message: str) -> None:
    body = event_body(obj, reason, message)
    body["metadata"]["namespace"] = body["metadata"]["namespace"] or "default"
    await client.create(body)


async def apply_arbitration(client: KubeClient, isvc: dict[str, Any], need: ServingNeed) -> list[ArbitrationAction]:
    """Decide and apply suspensions/resumptions of the namespace's TrainingJobs; Events on both objects."""
    ns = (isvc.get("metadata") or {}).get("namespace") or "default"
    jobs = {j["metadata"]["name"]: j for j in await client.list(API_VERSION, "TrainingJob", ns, {})}
    infos, skipped = job_infos(list(jobs.values()))
    for name, problem in skipped.items():
        # The operator's reconcile of that job reports it (InvalidSpec condition and Event); here it is only
        # left out, so the other jobs and services are still arbitrated.
        log.info("GPU arbitration for %s/%s leaves TrainingJob %s alone: %s", ns, need.service, name, problem)
    actions = arbitrate(need, infos)
    for action in actions:
        job = jobs[action.job]
        await client.merge_patch(API_VERSION, "TrainingJob", ns, action.job, job_patch(action, need.service))
        reason = "SuspendedForServing" if action.action == "suspend" else "ResumedAfterServing"
        await post_event(client, job, reason, action.reason)
        await post_event(client, isvc, reason, f"TrainingJob {action.job}: {action.reason}")
    return actions
