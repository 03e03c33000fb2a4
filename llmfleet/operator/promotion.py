"""Training -> serving promotion: the state recorded on the InferenceService and the rollback rule.

The TrainingJob reconcile starts a promotion: it writes the exported model into the target pool's spec and
an annotation with the previous model and a metrics baseline. The InferenceService reconcile renders the new
model (the Deployment rolls one replica at a time: maxSurge 1, maxUnavailable 0) and calls `evaluate` each
pass; on degradation it writes the previous model back (rollback). Both sides emit Events.

The local runtime (`llmfleet train` + `llmfleet up`, llmfleet.local.promote) runs the same functions:
`start_promotion`, `pool_model_patch` and `rollout_state`, with its own replicas as the RolloutProgress.

Degradation is judged on the promoted pool's own metrics (status.metrics.pools[<pool>], written by the
autoscaler from the router's per-pool series): its TTFT or TPOT p95 over the service's SLO when it met the SLO
before, or its error rate (the router's failed tries on that pool's replicas) above the baseline plus
ERROR_RATE_MARGIN.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from llmfleet.api.contracts import MODEL_ANNOTATION, PROMOTION_ANNOTATION
from llmfleet.api.inferenceservice import PRIMARY_POOL

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
    baseline_tpot_ms: float | None = None
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


def pool_metrics(metrics: dict[str, Any] | None, pool: str) -> dict[str, Any] | None:
    """The pool's entry of status.metrics.pools; for the primary, the top-level fields when no entry exists
    (status written before per-pool metrics). None when nothing was measured for the pool."""
    if not metrics:
        return None
    for entry in metrics.get("pools") or []:
        if isinstance(entry, dict) and entry.get("name") == pool:
            return entry
    return metrics if pool == "primary" and "pools" not in metrics else None


def _over_slo(value: float | None, slo: float, baseline: float | None) -> bool:
    """Over the objective now while it met it before (or nothing was known): the new model is to blame."""
    return value is not None and value > slo and (baseline is None or baseline <= slo)


def start_promotion(training_job: str, pool: str, model: str, previous: str, metrics: dict[str, Any] | None,
                    now: str) -> Promotion:
    """A new rollout of `model` into `pool`; the rollback baseline is the target pool's own live metrics
    (a student pool's, not the primary's) from status.metrics."""
    pm = pool_metrics(metrics, pool) or {}
    fresh = bool(pm) and not pm.get("stale", True)
    return Promotion(
        training_job=training_job,
        pool=pool,
        model=model,
        previous=previous,
        started_at=now,
        baseline_ttft_ms=_num(pm.get("ttftP95Ms")) if fresh else None,
        baseline_tpot_ms=_num(pm.get("tpotP95Ms")) if fresh else None,
        baseline_error_rate=_num(pm.get("errorRate")) if fresh else None,
        message=f"rolling {model} out to pool {pool} one replica at a time",
    )


def rollout_state(
    promo: Promotion, slo_ttft_ms: float, metrics: dict[str, Any] | None, progress: RolloutProgress | None,
    slo_tpot_ms: float | None = None,
) -> tuple[PromotionState, str]:
    """Next state of a rollout: roll back on an SLO or error regression of the promoted pool, succeed once every
    replica is updated."""
    if promo.state != "RollingOut":
        return promo.state, promo.message
    pm = pool_metrics(metrics, promo.pool)
    if pm and not pm.get("stale", True):
        ttft, tpot, errors = _num(pm.get("ttftP95Ms")), _num(pm.get("tpotP95Ms")), _num(pm.get("errorRate"))
        where = f"pool {promo.pool}"
        if _over_slo(ttft, slo_ttft_ms, promo.baseline_ttft_ms):
            return "RolledBack", f"{where}: TTFT p95 {ttft:.0f} ms exceeds the SLO {slo_ttft_ms:.0f} ms during the rollout"
        if slo_tpot_ms is not None and _over_slo(tpot, slo_tpot_ms, promo.baseline_tpot_ms):
            return "RolledBack", f"{where}: TPOT p95 {tpot:.0f} ms exceeds the SLO {slo_tpot_ms:.0f} ms during the rollout"
        if errors is not None and errors > (promo.baseline_error_rate or 0.0) + ERROR_RATE_MARGIN:
            return "RolledBack", (f"{where}: error rate {errors:.1%} rose above the baseline "
                                  f"{promo.baseline_error_rate or 0:.1%}")
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
    promo: Promotion, slo_ttft_ms: float, metrics: dict[str, Any] | None, deployment: dict[str, Any] | None,
    slo_tpot_ms: float | None = None,
) -> tuple[PromotionState, str]:
    """Next state of a rollout from live metrics (status.metrics) and the pool Deployment's status."""
    return rollout_state(promo, slo_ttft_ms, metrics, deployment_progress(promo, deployment), slo_tpot_ms)


def _spec(body: dict[str, Any]) -> dict[str, Any]:
    """The InferenceService's spec as read from the API; a malformed one (not a mapping, e.g. written before a
    CRD upgrade) has no pools, so a promotion into it waits with a condition instead of failing."""
    spec = body.get("spec")
    return spec if isinstance(spec, dict) else {}


def _pools(spec: dict[str, Any]) -> list[dict[str, Any]]:
    fallback = spec.get("fallback")
    pools = fallback.get("pools") if isinstance(fallback, dict) else None
    return [p for p in pools if isinstance(p, dict)] if isinstance(pools, list) else []


def pool_model_patch(body: dict[str, Any], pool: str, model_path: str) -> dict[str, Any] | None:
    """Merge patch setting `pool`'s model path (None when the pool does not exist)."""
    spec = _spec(body)
    if pool == "primary":
        return {"spec": {"model": {"path": model_path}}}
    pools = [dict(p) for p in _pools(spec)]
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
    spec = _spec(body)
    if not spec.get("lora"):
        return None
    adapters = [dict(a) for a in spec.get("adapters") or [] if isinstance(a, dict) and a.get("name") != name]
    adapters.append({"name": name, "uri": uri})
    # resourceVersion makes the list replacement fail on a concurrent change instead of losing it.
    return {"metadata": {"resourceVersion": body["metadata"].get("resourceVersion")}, "spec": {"adapters": adapters}}


def pool_names(body: dict[str, Any]) -> list[str]:
    """Names of the InferenceService's pools as read from the API: primary first."""
    return [PRIMARY_POOL] + [str(p.get("name")) for p in _pools(_spec(body))]


def pool_model(body: dict[str, Any], pool: str) -> str | None:
    spec = _spec(body)
    if pool == "primary":
        model = spec.get("model")
        path = model.get("path") if isinstance(model, dict) else None
        return str(path) if path else None
    for p in _pools(spec):
        if p.get("name") == pool:
            model = p.get("model")
            path = model.get("path") if isinstance(model, dict) else None
            return str(path) if path else None
    return None


def apply_merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch (what the API server does with `pool_model_patch`), for runtimes without one.

    Returns a new value that shares untouched subtrees with `doc`; neither input is modified."""
    if not isinstance(patch, dict):
        return patch
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out
