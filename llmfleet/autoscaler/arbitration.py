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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmfleet.api.contracts import SERVING_PRIORITY_ANNOTATION, SUSPENDED_BY_ANNOTATION


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


class MalformedTrainingJob(ValueError):
    """A TrainingJob whose fields arbitration reads do not have their schema's types (written by hand or before a
    CRD upgrade); the message starts with the field path. Arbitration leaves such a job alone: the operator's
    own reconcile reports it on the job (Ready=False/InvalidSpec and a Warning Event)."""


def _int(value: Any, path: str, default: int) -> int:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise MalformedTrainingJob(f"{path}: expected an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise MalformedTrainingJob(f"{path}: expected an integer, got {value!r}") from None


def _mapping(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedTrainingJob(f"{path}: expected an object, got {type(value).__name__}")
    return value


def job_info(obj: dict[str, Any]) -> TrainingJobInfo:
    """TrainingJobInfo from a TrainingJob object (dict as read from the API); MalformedTrainingJob when a field
    it reads has the wrong type."""
    meta, spec = _mapping(obj.get("metadata"), "metadata"), _mapping(obj.get("spec"), "spec")
    raw_status = obj.get("status")
    status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    workers = _mapping(spec.get("workers"), "spec.workers")
    replicas = _int(workers.get("count"), "spec.workers.count", 1) or 1
    per = _int(workers.get("gpusPerWorker"), "spec.workers.gpusPerWorker", 0)
    scheduling = _mapping(spec.get("scheduling"), "spec.scheduling")
    raw_annotations = meta.get("annotations")
    annotations: dict[str, Any] = raw_annotations if isinstance(raw_annotations, dict) else {}
    return TrainingJobInfo(
        name=str(meta.get("name")),
        priority=_int(scheduling.get("priority"), "spec.scheduling.priority", 0),
        gpus=replicas * per,
        suspended=bool(spec.get("suspend", False)),
        suspended_by=annotations.get(SUSPENDED_BY_ANNOTATION),
        finished=status.get("phase") in ("Succeeded", "Failed"),
    )


def job_infos(objs: Sequence[dict[str, Any]]) -> tuple[list[TrainingJobInfo], dict[str, str]]:
    """(the jobs arbitration may act on, {name: problem} of the malformed ones it leaves alone). One bad object
    never stops the decision for the others."""
    infos: list[TrainingJobInfo] = []
    skipped: dict[str, str] = {}
    for obj in objs:
        try:
            infos.append(job_info(obj))
        except MalformedTrainingJob as err:
            skipped[str((obj.get("metadata") or {}).get("name"))] = str(err)
    return infos, skipped


def job_patch(action: ArbitrationAction, service: str) -> dict[str, Any]:
    """Merge patch that applies `action` to a TrainingJob."""
    if action.action == "suspend":
        return {"metadata": {"annotations": {SUSPENDED_BY_ANNOTATION: service}}, "spec": {"suspend": True}}
    return {"metadata": {"annotations": {SUSPENDED_BY_ANNOTATION: None}}, "spec": {"suspend": False}}


UNBOUNDED = 1 << 30


def serving_priority(annotations: Mapping[str, str]) -> int:
    """An InferenceService's serving priority: its annotation llmfleet.io/priority, 0 when absent or empty;
    ValueError naming the annotation when it is not an integer (the operator warns on the service, `llmfleet up`
    says it in an event; neither arbitrates for it)."""
    raw = annotations.get(SERVING_PRIORITY_ANNOTATION, "0") or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"metadata.annotations[{SERVING_PRIORITY_ANNOTATION}]: expected an integer, got "
                         f"{raw[:100]!r}") from None


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
