"""Training -> serving promotion: the state recorded on the InferenceService and the rollback rule.

The TrainingJob reconcile starts a promotion: it writes the exported model into the target pool's spec and
an annotation with the previous model and a metrics baseline. The InferenceService reconcile renders the new
model (the Deployment rolls one replica at a time: maxSurge 1, maxUnavailable 0) and calls `evaluate` each
pass; on degradation it writes the previous model back (rollback). Both sides emit Events.

The local runtime (`llmfleet train` + `llmfleet up`, llmfleet.local.promote) runs the same functions:
`start_promotion`, `pool_model_patch` and `rollout_state`, with its own replicas as the RolloutProgress.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from llmfleet.api.contracts import MODEL_ANNOTATION, PROMOTION_ANNOTATION

PromotionState = Literal["Pending", "RollingOut", "Succeeded", "RolledBack"]
# A rollout is rolled back when errors rise this much over the baseline (absolute fraction of requests).
ERROR_RATE_MARGIN = 0.05


@dataclass
class Promotion:
    training_job: str
    pool: str
    model: str
    previous: str
    state: PromotionState = "RollingOut"
    started_at: str = ""
    baseline_ttft_ms: float | None = None
    baseline_error_rate: float | None = None
    message: str = ""

    def to_annotation(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)


def from_annotations(annotations: dict[str, Any] | None) -> Promotion | None:
    raw = (annotations or {}).get(PROMOTION_ANNOTATION)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return Promotion(**data)
    except (ValueError, TypeError):
        return None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RolloutProgress:
    """Where a pool's rollout stands, whatever runs the replicas (a Deployment, or the local supervisor)."""

    desired: int  # replicas the pool should have
    updated: int  # replicas running the new model
    ready: int  # ready replicas (any model)
    total: int  # replicas (any model)
    observed: bool = True  # the runtime has seen the new model (Deployment: template rendered and observed)
    failed: str | None = None  # why the rollout cannot finish, when it cannot


def start_promotion(training_job: str, pool: str, model: str, previous: str, metrics: dict[str, Any] | None,
                    now: str) -> Promotion:
    """A new rollout of `model` into `pool`, with the live metrics (status.metrics) as the rollback baseline."""
    fresh = bool(metrics) and not (metrics or {}).get("stale", True)
    return Promotion(
        training_job=training_job,
        pool=pool,
        model=model,
        previous=previous,
        started_at=now,
        baseline_ttft_ms=_num((metrics or {}).get("ttftP95Ms")) if fresh else None,
        baseline_error_rate=_num((metrics or {}).get("errorRate")) if fresh else None,
        message=f"rolling {model} out to pool {pool} one replica at a time",
    )


def rollout_state(
    promo: Promotion, slo_ttft_ms: float, metrics: dict[str, Any] | None, progress: RolloutProgress | None
) -> tuple[PromotionState, str]:
    """Next state of a rollout: roll back on an SLO or error regression, succeed once every replica is updated."""
    if promo.state != "RollingOut":
        return promo.state, promo.message
    if metrics and not metrics.get("stale", True):
        ttft = _num(metrics.get("ttftP95Ms"))
        errors = _num(metrics.get("errorRate"))
        base_ttft = promo.baseline_ttft_ms
        if ttft is not None and ttft > slo_ttft_ms and (base_ttft is None or base_ttft <= slo_ttft_ms):
            return "RolledBack", f"TTFT p95 {ttft:.0f} ms exceeds the SLO {slo_ttft_ms:.0f} ms during the rollout"
        if errors is not None and errors > (promo.baseline_error_rate or 0.0) + ERROR_RATE_MARGIN:
            return "RolledBack", f"error rate {errors:.1%} rose above the baseline {promo.baseline_error_rate or 0:.1%}"
    if progress is None:
        return "RollingOut", "waiting for the pool's replicas"
    if progress.failed:
        return "RolledBack", progress.failed
    p = progress
    if p.observed and p.updated >= p.desired and p.ready >= p.desired and p.total == p.updated:
        return "Succeeded", f"{promo.model} serves on all {p.desired} replicas of pool {promo.pool}"
    return "RollingOut", f"{p.updated}/{p.desired} replicas updated, {p.ready} ready"


def deployment_progress(promo: Promotion, deployment: dict[str, Any] | None) -> RolloutProgress | None:
    """RolloutProgress of a pool Deployment (None while it does not exist)."""
    if deployment is None:
        return None
    status = deployment.get("status") or {}
    failed = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            failed = "the new model's replicas did not become ready in time"
    rolled = (deployment.get("metadata") or {}).get("annotations", {}).get(MODEL_ANNOTATION) == promo.model
    generation_seen = int(status.get("observedGeneration") or 0) >= int(deployment["metadata"].get("generation") or 0)
    return RolloutProgress(
        desired=int((deployment.get("spec") or {}).get("replicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        total=int(status.get("replicas") or 0),
        observed=rolled and generation_seen,
        failed=failed,
    )


def evaluate(
    promo: Promotion, slo_ttft_ms: float, metrics: dict[str, Any] | None, deployment: dict[str, Any] | None
) -> tuple[PromotionState, str]:
    """Next state of a rollout from live metrics (status.metrics) and the pool Deployment's status."""
    return rollout_state(promo, slo_ttft_ms, metrics, deployment_progress(promo, deployment))


def pool_model_patch(body: dict[str, Any], pool: str, model_path: str) -> dict[str, Any] | None:
    """Merge patch setting `pool`'s model path (None when the pool does not exist)."""
    spec = body.get("spec") or {}
    if pool == "primary":
        return {"spec": {"model": {"path": model_path}}}
    pools = [dict(p) for p in (spec.get("fallback") or {}).get("pools") or []]
    for p in pools:
        if p.get("name") == pool:
            p["model"] = {**(p.get("model") or {}), "path": model_path}
            # resourceVersion makes the list replacement fail on a concurrent change instead of losing it.
            return {
                "metadata": {"resourceVersion": body["metadata"].get("resourceVersion")},
                "spec": {"fallback": {"pools": pools}},
            }
    return None


def adapter_patch(body: dict[str, Any], name: str, uri: str) -> dict[str, Any] | None:
    """Merge patch adding adapter `name` at `uri` to spec.adapters (replacing one of that name); None when the
    InferenceService has no spec.lora (its replicas cannot serve adapters)."""
    spec = body.get("spec") or {}
    if not spec.get("lora"):
        return None
    adapters = [dict(a) for a in spec.get("adapters") or [] if a.get("name") != name]
    adapters.append({"name": name, "uri": uri})
    # resourceVersion makes the list replacement fail on a concurrent change instead of losing it.
    return {"metadata": {"resourceVersion": body["metadata"].get("resourceVersion")}, "spec": {"adapters": adapters}}


def pool_model(body: dict[str, Any], pool: str) -> str | None:
    spec = body.get("spec") or {}
    if pool == "primary":
        path = (spec.get("model") or {}).get("path")
        return str(path) if path else None
    for p in (spec.get("fallback") or {}).get("pools") or []:
        if p.get("name") == pool:
            path = (p.get("model") or {}).get("path")
            return str(path) if path else None
    return None


def apply_merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch (what the API server does with `pool_model_patch`), for runtimes without one."""
    if not isinstance(patch, dict):
        return patch
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out
