"""GPU arbitration between serving and training: pure decisions, plus applying them to Kubernetes.

When a serving pool burns its SLO error budget and cannot get GPUs (the service's `gpuBudget` is
exhausted, or its pods are Pending for lack of GPUs), TrainingJobs of lower `scheduling.priority`
in the namespace are suspended (`spec.suspend: true`; the training operator checkpoints before
stopping the workers), lowest priority first, until the missing GPUs are covered. Once the service
is back under its budget (not burning) and its desired replicas fit without those GPUs, the jobs
it suspended are resumed. Jobs are marked with the annotation `llmfleet.io/suspended-by:
<service>` so only the autoscaler's own suspensions are undone. Every action is an Event on both
objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmfleet.api.contracts import SUSPENDED_BY_ANNOTATION


@dataclass(frozen=True)
class TrainingJobInfo:
    """What arbitration needs to know about one TrainingJob."""

    name: str
    priority: int
    gpus: int  # GPUs it holds while running (workers x GPUs per worker)
    suspended: bool
    suspended_by: str | None = None  # service that suspended it (annotation)
    finished: bool = False


@dataclass(frozen=True)
class ServingNeed:
    """The serving side of the decision for one InferenceService."""

    service: str
    priority: int  # serving priority; jobs strictly below it may be suspended
    burning: bool  # SLO error budget burning (TTFT/TPOT p95 over the SLO, or burn rate > threshold)
    gpus_missing: int  # GPUs the desired replicas need beyond what it can get now (budget or Pending pods)
    gpus_surplus: int  # GPUs it could give back and still fit its desired replicas (for resuming)


@dataclass(frozen=True)
class ArbitrationAction:
    job: str
    action: Literal["suspend", "resume"]
    reason: str


def arbitrate(need: ServingNeed, jobs: Sequence[TrainingJobInfo]) -> list[ArbitrationAction]:
    """Which TrainingJobs to suspend or resume. Pure and deterministic."""
    actions: list[ArbitrationAction] = []
    if need.burning and need.gpus_missing > 0:
        freed = 0
        candidates = sorted(
            (j for j in jobs if not j.suspended and not j.finished and j.priority < need.priority and j.gpus > 0),
            key=lambda j: (j.priority, -j.gpus, j.name),
        )
        for job in candidates:
            if freed >= need.gpus_missing:
                break
            freed += job.gpus
            actions.append(ArbitrationAction(
                job.name, "suspend",
                f"InferenceService {need.service} burns its SLO budget and lacks {need.gpus_missing} GPU(s); "
                f"TrainingJob {job.name} (priority {job.priority} < {need.priority}) frees {job.gpus}",
            ))
        return actions
    if not need.burning:
        room = need.gpus_surplus
        mine = sorted(
            (j for j in jobs if j.suspended and j.suspended_by == need.service and not j.finished),
            key=lambda j: (-j.priority, j.gpus, j.name),
        )
        for job in mine:
            if job.gpus > room:
                continue
            room -= job.gpus
            actions.append(ArbitrationAction(
                job.name, "resume",
                f"InferenceService {need.service} is back within its SLO and no longer needs the GPUs",
            ))
    return actions


def job_info(obj: dict[str, Any]) -> TrainingJobInfo:
    """TrainingJobInfo from a TrainingJob object (dict as read from the API)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    workers = spec.get("workers") or {}
    replicas = int(workers.get("count", 1) or 1)
    per = int(workers.get("gpusPerWorker", 0) or 0)
    return TrainingJobInfo(
        name=str(meta.get("name")),
        priority=int((spec.get("scheduling") or {}).get("priority", 0) or 0),
        gpus=replicas * per,
        suspended=bool(spec.get("suspend", False)),
        suspended_by=(meta.get("annotations") or {}).get(SUSPENDED_BY_ANNOTATION),
        finished=status.get("phase") in ("Succeeded", "Failed"),
    )


def job_patch(action: ArbitrationAction, service: str) -> dict[str, Any]:
    """Merge patch that applies `action` to a TrainingJob."""
    if action.action == "suspend":
        return {"metadata": {"annotations": {SUSPENDED_BY_ANNOTATION: service}}, "spec": {"suspend": True}}
    return {"metadata": {"annotations": {SUSPENDED_BY_ANNOTATION: None}}, "spec": {"suspend": False}}


UNBOUNDED = 1 << 30


def serving_need(
    service: str,
    priority: int,
    *,
    gpu_budget: int | None,
    desired_gpus: int,
    pending_gpus: int,
    burning: bool,
) -> ServingNeed:
    """What the service lacks or could give back, in GPUs. Pure.

    Missing: what the desired replicas need beyond the budget (the service may use up to `gpu_budget` GPUs
    on its own; more must come from lower-priority training), plus GPUs of its pods Pending for lack of
    GPUs. Surplus (for resuming): once the desired replicas fit the budget (or, without a budget, nothing is
    Pending), the service needs none of the GPUs it borrowed: unbounded; otherwise 0.
    """
    over_budget = max(desired_gpus - gpu_budget, 0) if gpu_budget is not None else 0
    missing = over_budget + max(pending_gpus, 0)
    surplus = UNBOUNDED if missing == 0 else 0
    return ServingNeed(service, priority, burning=burning, gpus_missing=missing, gpus_surplus=surplus)
