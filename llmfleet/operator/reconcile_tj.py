"""The TrainingJob reconcile: the Indexed Job of the current attempt, restarts, suspend, status, promotion."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from llmfleet.api import TrainingJob
from llmfleet.api.contracts import API_VERSION
from llmfleet.api.loader import problems_line
from llmfleet.kube.client import ApiError, KubeClient
from llmfleet.operator.builders import build_trainingjob
from llmfleet.operator.builders.storage import StorageSpecError
from llmfleet.operator.builders.trainingjob import job_name, service_name, uses_kueue
from llmfleet.operator.config import OperatorConfig
from llmfleet.operator.reconcile_isvc import ReconcileError, apply_all
from llmfleet.operator.status import (
    ReconcileOutcome,
    condition,
    cr_dict,
    invalid_spec_message,
    invalid_spec_outcome,
    set_conditions,
    status_of,
)
from llmfleet.operator.tj_status import (
    TERMINAL,
    Observed,
    promotion_step,
    promotion_target_conditions,
    promotion_target_found,
    restart_due,
    restart_event,
    trainingjob_phase,
    trainingjob_status,
)
from llmfleet.operator.worker_status import StatusReader, WorkerStatusError
from llmfleet.plan.hardware import training_precision_problems


def status_url(config: OperatorConfig, tj: TrainingJob, attempt: int) -> str:
    return config.status_url_template.format(
        pod=f"{job_name(tj, attempt)}-0",
        service=service_name(tj),
        namespace=tj.metadata.namespace or "default",
        port=tj.spec.metrics.port,
        name=tj.metadata.name,
    )


async def _promote(
    tj: TrainingJob, old: dict[str, Any], client: KubeClient, out: ReconcileOutcome, now: str
) -> dict[str, Any] | None:
    """Start or follow the promotion of the exported model; the new status.promotion (None: not configured)."""
    output = tj.spec.output
    if output is None or output.promote_to is None:
        return None
    prev: dict[str, Any] = dict(old.get("promotion") or {})
    if prev.get("state") in ("Succeeded", "RolledBack"):
        return prev
    ns, svc = tj.metadata.namespace, output.promote_to.inference_service
    isvc = await client.get(API_VERSION, "InferenceService", ns, svc)
    step = promotion_step(tj, prev, isvc, now)
    if step.patch is not None:
        await client.merge_patch(API_VERSION, "InferenceService", ns, svc, step.patch)
    out.events.extend(step.events)
    out.other_events.extend((isvc, ev) for ev in step.target_events if isvc is not None)
    return step.status


async def _check_promotion_target(
    tj: TrainingJob, client: KubeClient, out: ReconcileOutcome, old: dict[str, Any], generation: int | None, now: str
) -> None:
    """Keep the PromotionTarget condition: a missing InferenceService or pool is a condition and a Warning
    Event on the TrainingJob (training goes on; the promotion waits for the target), not an error.

    Looked up on a spec change and, while missing, on every reconcile; not again once found."""
    if tj.spec.output is None or tj.spec.output.promote_to is None:
        return
    target = tj.spec.output.promote_to
    state = (out.status.get("promotion") or {}).get("state")
    prev = condition(out.status.get("conditions") or old.get("conditions"), "PromotionTarget")
    if state in ("RollingOut", "Succeeded", "RolledBack"):  # the promotion found its target
        found = (True, "Found", f"promotes to {target.inference_service}/{target.pool}")
    elif (state is None and prev is not None and prev.get("status") == "True"
          and old.get("observedGeneration") == generation):
        return  # found before, spec unchanged, not promoting yet: no lookup on every timer tick
    else:
        ns = tj.metadata.namespace or "default"
        found = promotion_target_found(tj, await client.get(API_VERSION, "InferenceService", ns,
                                                            target.inference_service))
    out.status["conditions"], events = promotion_target_conditions(
        out.status.get("conditions") or old.get("conditions"), found, generation, now)
    out.events.extend(events)


async def _apply(
    tj: TrainingJob, config: OperatorConfig, client: KubeClient, out: ReconcileOutcome, old: dict[str, Any],
    generation: int | None, now: str, attempt: int, job_created: bool, job_only: bool = False,
) -> list[dict[str, Any]]:
    started = time.thread_time()
    manifests = build_trainingjob(tj, config, attempt, job_created=job_created)
    if job_only:
        manifests = manifests[-1:]
    out.compute_seconds += time.thread_time() - started
    results, errors = await apply_all(client, manifests, generation)
    # A changed pod template cannot be applied to a running Job (immutable): it takes effect on the next attempt.
    deferred = [e for e in errors if e.startswith("Job/") and "HTTP 422" in e]
    errors = [e for e in errors if e not in deferred]
    out.applied += len(manifests) - len(errors) - len(deferred)
    if deferred:
        out.event("Normal", "SpecChangeDeferred", "the running workers keep their spec until the next restart")
    if errors:
        message = "; ".join(errors)
        out.status = {"conditions": set_conditions(old.get("conditions"), {"Degraded": (True, "ApplyFailed", message)},
                                                   generation, now)}
        out.event("Warning", "ApplyFailed", message)
        raise ReconcileError(out, transient=True, message=message)
    return results


async def reconcile_trainingjob(
    body: Mapping[str, Any],
    client: KubeClient,
    config: OperatorConfig,
    now: str,
    read_status: StatusReader | None = None,
) -> ReconcileOutcome:
    """Level-triggered. `read_status` (timer only) reads rank 0's /status while the job runs."""
    out, tj = await _reconcile(body, client, config, now, read_status)
    if tj is not None:
        old: dict[str, Any] = status_of(body)
        await _check_promotion_target(tj, client, out, old, (body.get("metadata") or {}).get("generation"), now)
    return out


async def _reconcile(body: Mapping[str, Any], client: KubeClient, config: OperatorConfig, now: str,
                     read_status: StatusReader | None) -> tuple[ReconcileOutcome, TrainingJob | None]:
    """The reconcile proper; also returns the validated TrainingJob (None when the spec is invalid)."""
    started = time.thread_time()
    old: dict[str, Any] = status_of(body)
    generation = (body.get("metadata") or {}).get("generation")
    try:
        tj = TrainingJob.model_validate(cr_dict(body))
    except ValidationError as err:
        invalid = invalid_spec_outcome(old, invalid_spec_message(err), generation, now, "TrainingJob")
        invalid.compute_seconds = time.thread_time() - started
        return invalid, None
    if problems := training_precision_problems(tj.spec):  # e.g. fp8 on a GPU type without fp8 tensor cores
        message = problems_line(problems)
        invalid = invalid_spec_outcome(old, message, generation, now, "TrainingJob")
        invalid.compute_seconds = time.thread_time() - started
        return invalid, None

    out = ReconcileOutcome()
    out.compute_seconds = time.thread_time() - started
    ns = tj.metadata.namespace
    attempt = int(old.get("restarts") or 0)

    if old.get("phase") in TERMINAL:
        out.status, _ = trainingjob_status(tj, Observed(job={}, attempt=attempt), old, generation, now)
        if old["phase"] == "Succeeded" and (promotion := await _promote(tj, old, client, out, now)) is not None:
            out.status["promotion"] = promotion
        return out, tj

    # Only with Kueue must the operator know before applying whether the Job exists (Kueue then owns
    # `suspend`); otherwise the apply's answer carries the Job's status: one round trip, not two.
    job = await client.get("batch/v1", "Job", ns, job_name(tj, attempt)) if uses_kueue(tj) else None
    try:
        results = await _apply(tj, config, client, out, old, generation, now, attempt, job is not None)
    except StorageSpecError as err:  # a location the cluster cannot reach (tiny://): invalid, not retried
        invalid = invalid_spec_outcome(old, str(err), generation, now, "TrainingJob")
        invalid.compute_seconds = out.compute_seconds
        return invalid, None
    seen = Observed(job=results[-1] or job or {}, attempt=attempt)
    if restart_due(tj, seen.job, attempt):
        await client.delete("batch/v1", "Job", ns, job_name(tj, attempt))
        attempt += 1
        out.events.append(restart_event(tj, attempt, old))
        results = await _apply(tj, config, client, out, old, generation, now, attempt, False, job_only=True)
        seen = Observed(job=results[-1] or {}, attempt=attempt, restarted=True)

    started = time.thread_time()
    if read_status is not None and trainingjob_phase(tj, seen)[0] == "Running":
        url = status_url(config, tj, attempt)
        out.compute_seconds += time.thread_time() - started
        try:
            seen = replace(seen, worker=await read_status(url))
        except WorkerStatusError as err:
            seen = replace(seen, worker_error=str(err))
        started = time.thread_time()
    status, events = trainingjob_status(tj, seen, old, generation, now)
    out.events.extend(events)
    out.compute_seconds += time.thread_time() - started
    if status["phase"] == "Succeeded":
        if (promotion := await _promote(tj, {**old, **status}, client, out, now)) is not None:
            status["promotion"] = promotion
    out.status = status
    return out, tj


__all__ = ["ApiError", "reconcile_trainingjob"]
