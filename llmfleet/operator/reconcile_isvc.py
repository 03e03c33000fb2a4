"""The InferenceService reconcile: validate, render, apply, prune, then status from what the API returned."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from llmfleet.api import InferenceService
from llmfleet.api.contracts import API_VERSION, COMPONENT_LABEL, PROMOTION_ANNOTATION, ROUTER_PORT
from llmfleet.kube.client import ApiError, KubeClient
from llmfleet.operator.builders import ServiceSpecError, build_inferenceservice
from llmfleet.operator.builders.inferenceservice import (
    isvc_labels,
    pool_name,
    pool_selector,
    router_name,
)
from llmfleet.operator.config import OperatorConfig, with_spec_defaults
from llmfleet.operator.promotion import evaluate, from_annotations, pool_model_patch
from llmfleet.operator.status import (
    Outcome,
    condition,
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

    def __init__(self, outcome: Outcome, transient: bool, message: str) -> None:
        self.outcome = outcome
        self.transient = transient
        super().__init__(message)


async def apply_all(client: KubeClient, manifests: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Apply concurrently; (results by position (empty dict on failure), error messages)."""
    results = await asyncio.gather(*(client.apply(m) for m in manifests), return_exceptions=True)
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


def _pool_status(deployment: Mapping[str, Any], pool: str, desired: int, model: str) -> dict[str, Any]:
    st = deployment.get("status") or {}
    return {
        "name": pool,
        "replicas": int(st.get("replicas") or 0),
        "readyReplicas": int(st.get("readyReplicas") or 0),
        "desiredReplicas": desired,
        "model": model,
    }


def _deployment_failing(dep: Mapping[str, Any]) -> bool:
    for cond in (dep.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return True
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return True
    return False


async def reconcile_inferenceservice(
    body: Mapping[str, Any], client: KubeClient, config: OperatorConfig, now: str
) -> Outcome:
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

    out = Outcome()
    out.compute_seconds = time.thread_time() - started
    results, errors = await apply_all(client, manifests)
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

    spec_changed = old_status.get("observedGeneration") != generation
    # Nothing to prune before the first successful reconcile (no observedGeneration yet).
    if spec_changed and old_status.get("observedGeneration") is not None:
        desired = {(m["kind"], m["metadata"]["name"]) for m in manifests}
        if deleted := await prune(client, isvc, desired):
            out.event("Normal", "Pruned", f"deleted {', '.join(deleted)}")

    started = time.thread_time()
    by_name = {(m["kind"], m["metadata"]["name"]): r for m, r in zip(manifests, results, strict=True)}
    pools = []
    all_ready = True
    for view in isvc.pools():
        dep = by_name.get(("Deployment", pool_name(isvc, view.name)), {})
        ps = _pool_status(dep, view.name, view.replicas, view.model.path)
        pools.append(ps)
        all_ready &= ps["readyReplicas"] >= view.replicas
    router = by_name.get(("Deployment", router_name(isvc)), {})
    router_ready = int((router.get("status") or {}).get("readyReplicas") or 0)
    all_ready &= router_ready >= isvc.spec.router.replicas

    # Promotion of a trained model into one pool, if one is rolling out.
    promo = from_annotations(meta.get("annotations"))
    if promo is not None and promo.state == "RollingOut":
        pool_dep = by_name.get(("Deployment", pool_name(isvc, promo.pool)))
        state, message = evaluate(promo, isvc.spec.slo.ttft_p95_ms, old_status.get("metrics"), pool_dep,
                                  slo_tpot_ms=isvc.spec.slo.tpot_p95_ms)
        if state != "RollingOut" or message != promo.message:
            promo.state, promo.message = state, message
            patch: dict[str, Any] = {"metadata": {"annotations": {PROMOTION_ANNOTATION: promo.to_annotation()}}}
            if state == "RolledBack":
                model_patch = pool_model_patch(dict(body), promo.pool, promo.previous) or {}
                patch = {**model_patch, "metadata": {**model_patch.get("metadata", {}), **patch["metadata"]}}
                out.event("Warning", "PromotionRolledBack", f"pool {promo.pool} back to {promo.previous}: {message}")
            elif state == "Succeeded":
                out.event("Normal", "PromotionSucceeded", message)
            ns, name = meta.get("namespace"), meta["name"]
            out.compute_seconds += time.thread_time() - started
            await client.merge_patch(API_VERSION, "InferenceService", ns, name, patch)
            started = time.thread_time()

    failing = [
        str(d.get("metadata", {}).get("name"))
        for d in results
        if d.get("kind") == "Deployment" and _deployment_failing(d)
    ]
    degraded = bool(failing)
    phase = "Degraded" if degraded else "Ready" if all_ready else "Progressing"
    ready_msg = "all pools and the router are ready" if all_ready else "waiting for replicas: " + ", ".join(
        f"{p['name']} {p['readyReplicas']}/{p['desiredReplicas']}" for p in pools
    )
    namespace = isvc.metadata.namespace or "default"
    out.status = {
        "phase": phase,
        "observedGeneration": generation,
        "url": f"http://{router_name(isvc)}.{namespace}.svc:{ROUTER_PORT}/v1",
        "replicas": pools[0]["replicas"],
        "selector": pool_selector(isvc, "primary"),
        "pools": pools,
        "conditions": set_conditions(
            old_status.get("conditions"),
            {
                "Ready": (all_ready, "AllReplicasReady" if all_ready else "ReplicasNotReady", ready_msg),
                "Progressing": (not all_ready, "RollingOut" if not all_ready else "Stable", ready_msg),
                "Degraded": (
                    degraded,
                    "DeploymentFailing" if degraded else "AsExpected",
                    f"failing: {', '.join(failing)}" if degraded else "",
                ),
            },
            generation,
            now,
        ),
    }
    if old_status.get("phase") != phase:
        out.event("Normal", phase, ready_msg)
    if spec_changed and old_status.get("observedGeneration") is not None:
        out.event("Normal", "Applied", f"applied {out.applied} objects for generation {generation}")
    old_ready = condition(old_status.get("conditions"), "Ready")
    if old_ready and old_ready.get("reason") == "InvalidSpec":
        out.event("Normal", "SpecValid", "the spec is valid again")
    out.compute_seconds += time.thread_time() - started
    return out
