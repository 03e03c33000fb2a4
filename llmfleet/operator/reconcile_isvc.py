"""The InferenceService reconcile: validate, render, apply, prune, promotion; then the status from what the API
returned (isvc_status.py, pure)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from llmfleet.api import InferenceService
from llmfleet.api.contracts import API_VERSION, COMPONENT_LABEL
from llmfleet.kube.client import ApiError, KubeClient
from llmfleet.operator.builders import ServiceSpecError, build_inferenceservice
from llmfleet.operator.builders.inferenceservice import isvc_labels
from llmfleet.operator.config import OperatorConfig, with_spec_defaults
from llmfleet.operator.isvc_status import inferenceservice_status, new_generation, promotion_update
from llmfleet.operator.status import (
    ReconcileOutcome,
    cr_dict,
    invalid_spec_message,
    invalid_spec_outcome,
    set_conditions,
    status_of,
)

# Kinds whose stale instances (e.g. of a removed student pool) are deleted after a spec change.
PRUNED_KINDS = (("apps/v1", "Deployment"), ("v1", "Service"), ("policy/v1", "PodDisruptionBudget"),
                ("networking.k8s.io/v1", "NetworkPolicy"))


class ReconcileError(Exception):
    """Applying failed; the outcome still carries a status patch and Events to record first."""

    def __init__(self, outcome: ReconcileOutcome, transient: bool, message: str) -> None:
        self.outcome = outcome
        self.transient = transient
        super().__init__(message)


async def apply_all(
    client: KubeClient, manifests: list[dict[str, Any]], generation: int | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Apply concurrently; (results by position (empty dict on failure), error messages). An apply identical to
    the last one of the owner's `generation` may be skipped by the client (llmfleet/kube/applied.py)."""
    results = await asyncio.gather(*(client.apply(m, generation) for m in manifests), return_exceptions=True)
    out: list[dict[str, Any]] = []
    errors: list[str] = []
    for manifest, res in zip(manifests, results, strict=True):
        if isinstance(res, ApiError):
            errors.append(f"{manifest['kind']}/{manifest['metadata']['name']}: {res}")
            out.append({})
        elif isinstance(res, BaseException):
            raise res
        else:
            out.append(res if isinstance(res, dict) else {})
    return out, errors


async def prune(client: KubeClient, isvc: InferenceService, desired: set[tuple[str, str]]) -> list[str]:
    """Delete pool children that the spec no longer asks for; names of what was deleted."""
    deleted = []
    ns = isvc.metadata.namespace
    labels = {**isvc_labels(isvc), COMPONENT_LABEL: "replica"}
    for api_version, kind in PRUNED_KINDS:
        for obj in await client.list(api_version, kind, ns, labels):
            name = obj["metadata"]["name"]
            if (kind, name) not in desired and await client.delete(api_version, kind, ns, name):
                deleted.append(f"{kind}/{name}")
    return deleted


async def reconcile_inferenceservice(
    body: Mapping[str, Any], client: KubeClient, config: OperatorConfig, now: str
) -> ReconcileOutcome:
    """Level-triggered: the same body always converges to the same children and status."""
    started = time.thread_time()
    old_status: dict[str, Any] = status_of(body)
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    try:
        doc = cr_dict(body)
        doc["spec"] = with_spec_defaults(doc["spec"], config.spec_defaults)
        isvc = InferenceService.model_validate(doc)
        manifests = build_inferenceservice(isvc, config)
    except (ValidationError, ServiceSpecError) as err:
        invalid = invalid_spec_outcome(old_status, invalid_spec_message(err), generation, now, "InferenceService")
        invalid.compute_seconds = time.thread_time() - started
        return invalid

    out = ReconcileOutcome()
    out.compute_seconds = time.thread_time() - started
    results, errors = await apply_all(client, manifests, generation)
    out.applied = len(manifests) - len(errors)
    if errors:
        message = "; ".join(errors)
        out.status = {
            "conditions": set_conditions(
                old_status.get("conditions"), {"Degraded": (True, "ApplyFailed", message)}, generation, now
            )
        }
        out.event("Warning", "ApplyFailed", message)
        raise ReconcileError(out, transient=True, message=message)

    if new_generation(old_status, generation):
        desired = {(m["kind"], m["metadata"]["name"]) for m in manifests}
        if deleted := await prune(client, isvc, desired):
            out.event("Normal", "Pruned", f"deleted {', '.join(deleted)}")

    started = time.thread_time()
    by_name = {(m["kind"], m["metadata"]["name"]): r for m, r in zip(manifests, results, strict=True)}

    # Promotion of a trained model into one pool, if one is rolling out.
    patch, events = promotion_update(isvc, body, old_status, by_name)
    out.events.extend(events)
    if patch is not None:
        out.compute_seconds += time.thread_time() - started
        await client.merge_patch(API_VERSION, "InferenceService", meta.get("namespace"), meta["name"], patch)
        started = time.thread_time()

    out.status, events = inferenceservice_status(isvc, by_name, old_status, generation, now, out.applied)
    out.events.extend(events)
    out.compute_seconds += time.thread_time() - started
    return out
