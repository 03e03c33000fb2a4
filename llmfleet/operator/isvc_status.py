"""InferenceService status from what the API returned for its children: pure, like the builders.

The reconcile (reconcile_isvc.py) applies the children and hands the objects the API answered with to
`inferenceservice_status`; the same inputs always give the same status and Events (no API calls, no clock:
`now` is an argument).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmfleet.api import InferenceService
from llmfleet.api.contracts import PROMOTION_ANNOTATION, ROUTER_PORT
from llmfleet.operator.builders.inferenceservice import pool_name, pool_selector, router_name
from llmfleet.operator.promotion import evaluate, from_annotations, pool_model_patch
from llmfleet.operator.status import Event, condition, set_conditions

ChildKey = tuple[str, str]  # (kind, name)


def pool_status(deployment: Mapping[str, Any], pool: str, desired: int, model: str) -> dict[str, Any]:
    """One entry of status.pools from the pool's Deployment ({} while the API has not answered)."""
    st = deployment.get("status") or {}
    return {
        "name": pool,
        "replicas": int(st.get("replicas") or 0),
        "readyReplicas": int(st.get("readyReplicas") or 0),
        "desiredReplicas": desired,
        "model": model,
    }


def deployment_failing(dep: Mapping[str, Any]) -> bool:
    """A Deployment that will not get there by waiting: ReplicaFailure, or its progress deadline passed."""
    for cond in (dep.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return True
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return True
    return False


def inferenceservice_status(
    isvc: InferenceService,
    children: Mapping[ChildKey, Mapping[str, Any]],
    old_status: Mapping[str, Any],
    generation: int | None,
    now: str,
    applied: int,
) -> tuple[dict[str, Any], list[Event]]:
    """(status, Events) after a successful apply. `children`: (kind, name) -> the object the API returned for
    it; `applied`: how many objects this reconcile applied (for the Applied Event of a new generation)."""
    pools = []
    all_ready = True
    for view in isvc.pools():
        ps = pool_status(children.get(("Deployment", pool_name(isvc, view.name)), {}), view.name, view.replicas,
                         view.model.path)
        pools.append(ps)
        all_ready &= ps["readyReplicas"] >= view.replicas
    router = children.get(("Deployment", router_name(isvc)), {})
    all_ready &= int((router.get("status") or {}).get("readyReplicas") or 0) >= isvc.spec.router.replicas

    failing = [name for (kind, name), obj in children.items() if kind == "Deployment" and deployment_failing(obj)]
    degraded = bool(failing)
    phase = "Degraded" if degraded else "Ready" if all_ready else "Progressing"
    ready_msg = "all pools and the router are ready" if all_ready else "waiting for replicas: " + ", ".join(
        f"{p['name']} {p['readyReplicas']}/{p['desiredReplicas']}" for p in pools
    )
    namespace = isvc.metadata.namespace or "default"
    status = {
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
    events = []
    if old_status.get("phase") != phase:
        events.append(Event("Normal", phase, ready_msg))
    if new_generation(old_status, generation):
        events.append(Event("Normal", "Applied", f"applied {applied} objects for generation {generation}"))
    old_ready = condition(old_status.get("conditions"), "Ready")
    if old_ready and old_ready.get("reason") == "InvalidSpec":
        events.append(Event("Normal", "SpecValid", "the spec is valid again"))
    return status, events


def new_generation(old_status: Mapping[str, Any], generation: int | None) -> bool:
    """The spec changed since a successful reconcile (none yet: the first apply, nothing to prune or report)."""
    observed = old_status.get("observedGeneration")
    return observed is not None and observed != generation


def promotion_update(
    isvc: InferenceService,
    body: Mapping[str, Any],
    old_status: Mapping[str, Any],
    children: Mapping[ChildKey, Mapping[str, Any]],
) -> tuple[dict[str, Any] | None, list[Event]]:
    """The next step of a promotion rolling out into one pool (promotion.evaluate on the pool's Deployment
    and metrics): the merge patch of the InferenceService that records it (on rollback also the previous model
    back in the pool's spec) and its Events; (None, []) while nothing changed or nothing is rolling out."""
    promo = from_annotations((body.get("metadata") or {}).get("annotations"))
    if promo is None or promo.state != "RollingOut":
        return None, []
    pool_dep = children.get(("Deployment", pool_name(isvc, promo.pool)))
    state, message = evaluate(promo, isvc.spec.slo.ttft_p95_ms, old_status.get("metrics"),
                              dict(pool_dep) if pool_dep is not None else None,
                              slo_tpot_ms=isvc.spec.slo.tpot_p95_ms)
    if state == "RollingOut" and message == promo.message:
        return None, []
    promo.state, promo.message = state, message
    patch: dict[str, Any] = {"metadata": {"annotations": {PROMOTION_ANNOTATION: promo.to_annotation()}}}
    events = []
    if state == "RolledBack":
        model_patch = pool_model_patch(dict(body), promo.pool, promo.previous) or {}
        patch = {**model_patch, "metadata": {**model_patch.get("metadata", {}), **patch["metadata"]}}
        events.append(Event("Warning", "PromotionRolledBack", f"pool {promo.pool} back to {promo.previous}: {message}"))
    elif state == "Succeeded":
        events.append(Event("Normal", "PromotionSucceeded", message))
    return patch, events
