"""The autoscaler's Kubernetes side of GPU arbitration: list TrainingJobs, patch them, post Events.

Works with any client offering the operator's `KubeClient` calls (`list`, `merge_patch`, `request`),
so the operator passes its own and tests pass one pointed at the emulator.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from llmfleet.api.contracts import API_VERSION, now_iso
from llmfleet.autoscaler.arbitration import ArbitrationAction, ServingNeed, arbitrate, job_infos, job_patch

log = logging.getLogger("llmfleet.autoscaler")


class KubeLike(Protocol):
    async def list(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]: ...

    async def merge_patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]: ...

    async def request(
        self, method: str, path: str, *, body: Any = None, content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any: ...


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


async def post_event(client: KubeLike, obj: dict[str, Any], reason: str, message: str) -> None:
    ns = (obj.get("metadata") or {}).get("namespace") or "default"
    await client.request("POST", f"/api/v1/namespaces/{ns}/events", body=event_body(obj, reason, message))


async def apply_arbitration(client: KubeLike, isvc: dict[str, Any], need: ServingNeed) -> list[ArbitrationAction]:
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
