"""TrainingJob phase and status from what the reconcile observed: pure, like the builders.

The reconcile (reconcile_tj.py) applies the Indexed Job of the current attempt, replaces a failed one while
restarts are left (`restart_due`, `restart_event`), reads rank 0's /status while the workers run, and hands
what it saw to `trainingjob_status`; the same observation always gives the same status and Events (`now` is
an argument). The PromotionTarget condition and the promotion's next step likewise come from the target
InferenceService as read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmfleet.api import TrainingJob
from llmfleet.api.contracts import PROMOTION_ANNOTATION
from llmfleet.operator.promotion import (
    adapter_patch,
    from_annotations,
    pool_model,
    pool_model_patch,
    pool_names,
    start_promotion,
)
from llmfleet.operator.status import Event, condition, set_conditions, status_of
from llmfleet.operator.worker_status import status_fields

TERMINAL = ("Succeeded", "Failed")


def job_failed(job: Mapping[str, Any]) -> bool:
    st = job.get("status") or {}
    if any(c.get("type") == "Failed" and c.get("status") == "True" for c in st.get("conditions") or []):
        return True
    return int(st.get("failed") or 0) > 0


def job_succeeded(job: Mapping[str, Any]) -> bool:
    st = job.get("status") or {}
    if any(c.get("type") == "Complete" and c.get("status") == "True" for c in st.get("conditions") or []):
        return True
    completions = int((job.get("spec") or {}).get("completions") or 1)
    return int(st.get("succeeded") or 0) >= completions


def restart_due(tj: TrainingJob, job: Mapping[str, Any], attempt: int) -> bool:
    """The attempt's workers failed and restarts are left: the reconcile replaces the Job with attempt + 1."""
    return job_failed(job) and attempt < tj.spec.max_restarts


def restart_event(tj: TrainingJob, attempt: int, old: Mapping[str, Any]) -> Event:
    """The Warning for starting attempt `attempt` (recorded before the new Job is applied, so it is kept when
    that apply fails)."""
    resume = old.get("lastCheckpoint")
    return Event("Warning", "Restarting",
                 f"worker failure; restart {attempt}/{tj.spec.max_restarts}, resuming from {resume or 'the start'}")


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw of a TrainingJob's workers."""

    job: Mapping[str, Any]  # the current attempt's Job as the API returned it ({} when not known)
    attempt: int  # status.restarts: the attempt `job` belongs to
    restarted: bool = False  # this reconcile replaced a failed Job: `attempt` is the new one
    worker: Mapping[str, Any] | None = None  # rank 0's /status document, when read
    worker_error: str = ""  # why rank 0's /status could not be read ("" when it was, or was not asked)


def conditions(old: Mapping[str, Any], generation: int | None, now: str, phase: str, message: str,
               degraded: tuple[bool, str, str] | None = None) -> list[dict[str, Any]]:
    """Ready / Progressing / Degraded for a phase (Degraded: Failed, or `degraded` when given)."""
    ready = phase in ("Running", "Succeeded")
    progressing = phase in ("Pending", "Running", "Restarting")
    updates = {
        "Ready": (ready, phase, message),
        "Progressing": (progressing, phase, message),
        "Degraded": degraded or (phase == "Failed", phase if phase == "Failed" else "AsExpected",
                                 message if phase == "Failed" else ""),
    }
    return set_conditions(old.get("conditions"), updates, generation, now)


def trainingjob_phase(tj: TrainingJob, seen: Observed) -> tuple[str, str]:
    """(phase, message) of a TrainingJob that is not finished before this reconcile."""
    job = seen.job
    if job_failed(job) and not seen.restarted:
        return "Failed", f"workers failed and maxRestarts ({tj.spec.max_restarts}) is used up"
    if job_succeeded(job):
        return "Succeeded", "all workers completed"
    active = int((job.get("status") or {}).get("active") or 0)
    if tj.spec.suspend:
        return "Suspended", "suspended; resumes from the last checkpoint"
    if seen.restarted:
        return "Restarting", f"attempt {seen.attempt} created"
    if (job.get("spec") or {}).get("suspend"):
        return "Pending", "waiting for admission (Kueue)"
    if active > 0:
        return "Running", f"{active}/{tj.spec.workers.count} workers active"
    return "Pending", "waiting for worker pods"


def trainingjob_status(
    tj: TrainingJob, seen: Observed, old: Mapping[str, Any], generation: int | None, now: str
) -> tuple[dict[str, Any], list[Event]]:
    """(status, Events); `old`: the status before this reconcile. A job already Succeeded or Failed keeps its
    phase (the reconcile adds the promotion)."""
    status: dict[str, Any] = {"observedGeneration": generation, "restarts": seen.attempt}
    if old.get("phase") in TERMINAL:
        return {**status, "phase": str(old["phase"])}, []
    phase, message = trainingjob_phase(tj, seen)
    if phase in TERMINAL:
        event = Event("Warning" if phase == "Failed" else "Normal", phase, message)
        return {**status, "phase": phase, "completionTime": now,
                "conditions": conditions(old, generation, now, phase, message)}, [event]
    events = []
    degraded: tuple[bool, str, str] | None = None
    if phase == "Running":
        if old.get("startTime") is None:
            status["startTime"] = now
        if seen.worker is not None:
            status.update(status_fields(dict(seen.worker)))
            degraded = (False, "AsExpected", "")
        elif seen.worker_error:
            degraded = (True, "WorkerStatusStale", f"rank 0 status unreachable, last values kept: {seen.worker_error}")
    status["phase"] = phase
    status["conditions"] = conditions(old, generation, now, phase, message, degraded)
    if old.get("phase") != phase:
        events.append(Event("Normal", phase, message))
    return status, events


def promotion_target_found(tj: TrainingJob, isvc: Mapping[str, Any] | None) -> tuple[bool, str, str]:
    """(found, reason, message) of output.promoteTo given the target InferenceService as read (None: absent):
    the InferenceService and its pool must exist."""
    target = tj.spec.output.promote_to if tj.spec.output else None
    if target is None:
        raise ValueError("no promotion configured")
    ns = tj.metadata.namespace or "default"
    if isvc is None:
        return False, "InferenceServiceNotFound", f"InferenceService {ns}/{target.inference_service} does not exist"
    if pool_model(dict(isvc), target.pool) is None:
        pools = pool_names(dict(isvc))
        return False, "PoolNotFound", (f"InferenceService {ns}/{target.inference_service} has no pool "
                                       f"{target.pool!r} (pools: {', '.join(pools)})")
    return True, "Found", f"promotes to {target.inference_service}/{target.pool}"


def promotion_target_conditions(
    old_conditions: list[dict[str, Any]] | None, found: tuple[bool, str, str], generation: int | None, now: str
) -> tuple[list[dict[str, Any]], list[Event]]:
    """The conditions with PromotionTarget set to `found`, and its Events: a Warning while the target is
    missing (again when the message changes), a Normal one when it appears."""
    prev = condition(old_conditions, "PromotionTarget")
    flipped = prev is None or prev.get("status") != ("True" if found[0] else "False")
    events = []
    if not found[0] and (prev is None or flipped or prev.get("message") != found[2]):
        events.append(Event("Warning", "PromotionTargetMissing", f"{found[2]}; the model is promoted once it exists"))
    elif found[0] and flipped and prev is not None:
        events.append(Event("Normal", "PromotionTargetFound", found[2]))
    return set_conditions(old_conditions, {"PromotionTarget": found}, generation, now), events


@dataclass
class PromotionStep:
    """What the TrainingJob's promotion does this reconcile: status.promotion, the merge patch of the target
    InferenceService (None: nothing to write) and the Events on both objects."""

    status: dict[str, Any]
    patch: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    target_events: list[Event] = field(default_factory=list)  # on the InferenceService


def promotion_step(
    tj: TrainingJob, previous_status: Mapping[str, Any], isvc: Mapping[str, Any] | None, now: str
) -> PromotionStep:
    """The next step of promoting the exported model into output.promoteTo, for a promotion that has not
    finished (state not Succeeded or RolledBack), given the target InferenceService as read (None: absent).

    A full model starts a rollout (the pool's model and the promotion annotation, with the pool's metrics as
    the baseline), then follows the annotation the InferenceService's reconcile keeps; a LoRA adapter joins
    spec.adapters at once."""
    output = tj.spec.output
    if output is None or output.promote_to is None:
        raise ValueError("no promotion configured")
    target = output.promote_to
    svc = target.inference_service
    base = {"inferenceService": svc, "pool": target.pool}
    if isvc is None:
        return PromotionStep({**base, "state": "Pending", "message": f"InferenceService {svc} not found"})
    body = dict(isvc)
    if tj.spec.method == "lora":
        name = target.adapter_name or tj.metadata.name
        patch = adapter_patch(body, name, output.path)
        if patch is None:
            return PromotionStep({**base, "state": "Pending",
                                  "message": f"InferenceService {svc} has no spec.lora: set it to serve adapter {name}"})
        message = f"adapter {name} ({output.path}) added to InferenceService {svc}"
        return PromotionStep({**base, "state": "Succeeded", "message": message}, patch,
                             [Event("Normal", "PromotionSucceeded", message)],
                             [Event("Normal", "AdapterAdded", f"{message} by TrainingJob {tj.metadata.name}")])
    ann = from_annotations((body.get("metadata") or {}).get("annotations"))
    if ann is not None and ann.training_job == tj.metadata.name:
        events = []
        if ann.state != previous_status.get("state", "Pending"):
            events.append(Event("Warning" if ann.state == "RolledBack" else "Normal", f"Promotion{ann.state}",
                                ann.message or ann.state))
        return PromotionStep({**base, "state": ann.state, "message": ann.message}, events=events)
    previous = pool_model(body, target.pool)
    if previous is None:
        return PromotionStep({**base, "state": "Pending", "message": f"InferenceService has no pool {target.pool!r}"})
    # The baseline is the target pool's own metrics (a student pool's, not the primary's): start_promotion.
    metrics = status_of(body).get("metrics") or {}
    promo = start_promotion(tj.metadata.name, target.pool, output.path, previous, metrics, now)
    patch = pool_model_patch(body, target.pool, output.path) or {}
    patch.setdefault("metadata", {})["annotations"] = {PROMOTION_ANNOTATION: promo.to_annotation()}
    message = f"promoting {output.path} to {svc}/{target.pool} (was {previous})"
    return PromotionStep({**base, "state": "RollingOut", "message": promo.message}, patch,
                         [Event("Normal", "PromotionStarted", message)],
                         [Event("Normal", "PromotionStarted", f"{message}, from TrainingJob {tj.metadata.name}")])
