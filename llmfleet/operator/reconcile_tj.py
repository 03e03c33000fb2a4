"""The TrainingJob reconcile: the Indexed Job of the current attempt, restarts, suspend, status, promotion."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from llmfleet.api import TrainingJob
from llmfleet.api.contracts import API_VERSION, PROMOTION_ANNOTATION
from llmfleet.kube.client import ApiError, KubeClient
from llmfleet.operator.builders import build_trainingjob
from llmfleet.operator.builders.storage import StorageSpecError
from llmfleet.operator.builders.trainingjob import job_name, service_name, uses_kueue
from llmfleet.operator.config import OperatorConfig
from llmfleet.operator.promotion import (
    adapter_patch,
    from_annotations,
    pool_model,
    pool_model_patch,
    pool_names,
    start_promotion,
)
from llmfleet.operator.reconcile_isvc import ReconcileError, apply_all
from llmfleet.operator.status import (
    Event,
    Outcome,
    condition,
    cr_dict,
    invalid_spec_message,
    invalid_spec_outcome,
    set_conditions,
    status_of,
)
from llmfleet.operator.worker_status import StatusReader, WorkerStatusError, status_fields
from llmfleet.plan.hardware import training_precision_problems

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


def status_url(config: OperatorConfig, tj: TrainingJob, attempt: int) -> str:
    return config.status_url_template.format(
        pod=f"{job_name(tj, attempt)}-0",
        service=service_name(tj),
        namespace=tj.metadata.namespace or "default",
        port=tj.spec.metrics.port,
        name=tj.metadata.name,
    )


def _conditions(old: dict[str, Any], generation: int | None, now: str, phase: str, message: str,
                degraded: tuple[bool, str, str] | None = None) -> list[dict[str, Any]]:
    ready = phase in ("Running", "Succeeded")
    progressing = phase in ("Pending", "Running", "Restarting")
    updates = {
        "Ready": (ready, phase, message),
        "Progressing": (progressing, phase, message),
        "Degraded": degraded or (phase == "Failed", phase if phase == "Failed" else "AsExpected",
                                 message if phase == "Failed" else ""),
    }
    return set_conditions(old.get("conditions"), updates, generation, now)


async def _promote(
    tj: TrainingJob, old: dict[str, Any], client: KubeClient, out: Outcome, now: str
) -> dict[str, Any] | None:
    """Start or follow the promotion of the exported model; the new status.promotion (None: not configured)."""
    output = tj.spec.output
    if output is None or output.promote_to is None:
        return None
    target = output.promote_to
    ns = tj.metadata.namespace
    prev: dict[str, Any] = dict(old.get("promotion") or {})
    state = prev.get("state", "Pending")
    if state in ("Succeeded", "RolledBack"):
        return prev
    base = {"inferenceService": target.inference_service, "pool": target.pool}
    isvc = await client.get(API_VERSION, "InferenceService", ns, target.inference_service)
    if isvc is None:
        return {**base, "state": "Pending", "message": f"InferenceService {target.inference_service} not found"}
    if tj.spec.method == "lora":
        return await _promote_adapter(tj, isvc, client, out, base, output.path, target.adapter_name)
    ann = from_annotations((isvc.get("metadata") or {}).get("annotations"))
    if ann is not None and ann.training_job == tj.metadata.name:
        if ann.state != state:
            out.event(
                "Warning" if ann.state == "RolledBack" else "Normal", f"Promotion{ann.state}", ann.message or ann.state
            )
        return {**base, "state": ann.state, "message": ann.message}
    previous = pool_model(isvc, target.pool)
    if previous is None:
        return {**base, "state": "Pending", "message": f"InferenceService has no pool {target.pool!r}"}
    # The baseline is the target pool's own metrics (a student pool's, not the primary's): start_promotion.
    metrics = (isvc.get("status") or {}).get("metrics") or {}
    promo = start_promotion(tj.metadata.name, target.pool, output.path, previous, metrics, now)
    patch = pool_model_patch(isvc, target.pool, output.path) or {}
    patch.setdefault("metadata", {})["annotations"] = {PROMOTION_ANNOTATION: promo.to_annotation()}
    await client.merge_patch(API_VERSION, "InferenceService", ns, target.inference_service, patch)
    message = f"promoting {output.path} to {target.inference_service}/{target.pool} (was {previous})"
    out.event("Normal", "PromotionStarted", message)
    out.other_events.append(
        (isvc, Event("Normal", "PromotionStarted", f"{message}, from TrainingJob {tj.metadata.name}"))
    )
    return {**base, "state": "RollingOut", "message": promo.message}


async def _promotion_target(tj: TrainingJob, client: KubeClient) -> tuple[bool, str, str]:
    """(found, reason, message) for output.promoteTo: the InferenceService and its pool must exist."""
    target = tj.spec.output.promote_to if tj.spec.output else None
    if target is None:
        raise ValueError("no promotion configured")
    ns = tj.metadata.namespace or "default"
    isvc = await client.get(API_VERSION, "InferenceService", ns, target.inference_service)
    if isvc is None:
        return False, "InferenceServiceNotFound", f"InferenceService {ns}/{target.inference_service} does not exist"
    if pool_model(isvc, target.pool) is None:
        pools = pool_names(isvc)
        return False, "PoolNotFound", (f"InferenceService {ns}/{target.inference_service} has no pool "
                                       f"{target.pool!r} (pools: {', '.join(pools)})")
    return True, "Found", f"promotes to {target.inference_service}/{target.pool}"


async def _check_promotion_target(
    tj: TrainingJob, client: KubeClient, out: Outcome, old: dict[str, Any], generation: int | None, now: str
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
        found = await _promotion_target(tj, client)
    flipped = prev is None or prev.get("status") != ("True" if found[0] else "False")
    if not found[0] and (flipped or prev is None or prev.get("message") != found[2]):
        out.event("Warning", "PromotionTargetMissing", f"{found[2]}; the model is promoted once it exists")
    elif found[0] and flipped and prev is not None:
        out.event("Normal", "PromotionTargetFound", found[2])
    base = out.status.get("conditions") or old.get("conditions")
    out.status["conditions"] = set_conditions(base, {"PromotionTarget": found}, generation, now)


async def _promote_adapter(tj: TrainingJob, isvc: dict[str, Any], client: KubeClient, out: Outcome,
                           base: dict[str, str], uri: str, adapter_name: str | None) -> dict[str, Any]:
    """A trained LoRA adapter joins the InferenceService's spec.adapters: servable at once, loaded on demand by
    the router (no rollout, no replica restart)."""
    ns, svc = tj.metadata.namespace, base["inferenceService"]
    name = adapter_name or tj.metadata.name
    patch = adapter_patch(isvc, name, uri)
    if patch is None:
        return {**base, "state": "Pending",
                "message": f"InferenceService {svc} has no spec.lora: set it to serve adapter {name}"}
    await client.merge_patch(API_VERSION, "InferenceService", ns, svc, patch)
    message = f"adapter {name} ({uri}) added to InferenceService {svc}"
    out.event("Normal", "PromotionSucceeded", message)
    out.other_events.append((isvc, Event("Normal", "AdapterAdded", f"{message} by TrainingJob {tj.metadata.name}")))
    return {**base, "state": "Succeeded", "message": message}


async def _apply(
    tj: TrainingJob, config: OperatorConfig, client: KubeClient, out: Outcome, old: dict[str, Any],
    generation: int | None, now: str, attempt: int, job_created: bool, job_only: bool = False,
) -> list[dict[str, Any]]:
    started = time.thread_time()
    manifests = build_trainingjob(tj, config, attempt, job_created=job_created)
    if job_only:
        manifests = manifests[-1:]
    out.compute_seconds += time.thread_time() - started
    results, errors = await apply_all(client, manifests)
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
) -> Outcome:
    """Level-triggered. `read_status` (timer only) reads rank 0's /status while the job runs."""
    out, tj = await _reconcile(body, client, config, now, read_status)
    if tj is not None:
        old: dict[str, Any] = status_of(body)
        await _check_promotion_target(tj, client, out, old, (body.get("metadata") or {}).get("generation"), now)
    return out


async def _reconcile(body: Mapping[str, Any], client: KubeClient, config: OperatorConfig, now: str,
                     read_status: StatusReader | None) -> tuple[Outcome, TrainingJob | None]:
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
        message = "; ".join(f"{path}: {msg}" for path, msg in problems)
        invalid = invalid_spec_outcome(old, message, generation, now, "TrainingJob")
        invalid.compute_seconds = time.thread_time() - started
        return invalid, None

    out = Outcome()
    out.compute_seconds = time.thread_time() - started
    ns = tj.metadata.namespace
    attempt = int(old.get("restarts") or 0)
    status: dict[str, Any] = {"observedGeneration": generation, "restarts": attempt}

    if old.get("phase") in TERMINAL:
        phase = str(old["phase"])
        if phase == "Succeeded" and (promotion := await _promote(tj, old, client, out, now)) is not None:
            status["promotion"] = promotion
        out.status = {**status, "phase": phase}
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
    job_now = results[-1] or job or {}
    if job_failed(job_now):
        if attempt >= tj.spec.max_restarts:
            message = f"workers failed and maxRestarts ({tj.spec.max_restarts}) is used up"
            out.event("Warning", "Failed", message)
            out.status = {**status, "phase": "Failed", "completionTime": now,
                          "conditions": _conditions(old, generation, now, "Failed", message)}
            return out, tj
        await client.delete("batch/v1", "Job", ns, job_name(tj, attempt))
        attempt += 1
        status["restarts"] = attempt
        resume = old.get("lastCheckpoint")
        out.event(
            "Warning", "Restarting",
            f"worker failure; restart {attempt}/{tj.spec.max_restarts}, resuming from {resume or 'the start'}",
        )
        results = await _apply(tj, config, client, out, old, generation, now, attempt, False, job_only=True)
        job_now = results[-1] or {}
    if job_succeeded(job_now):
        message = "all workers completed"
        out.event("Normal", "Succeeded", message)
        status.update({"phase": "Succeeded", "completionTime": now,
                       "conditions": _conditions(old, generation, now, "Succeeded", message)})
        if (promotion := await _promote(tj, {**old, **status}, client, out, now)) is not None:
            status["promotion"] = promotion
        out.status = status
        return out, tj

    started = time.thread_time()
    jst = job_now.get("status") or {}
    active = int(jst.get("active") or 0)
    degraded: tuple[bool, str, str] | None = None
    if tj.spec.suspend:
        phase, message = "Suspended", "suspended; resumes from the last checkpoint"
    elif status["restarts"] != int(old.get("restarts") or 0):
        phase, message = "Restarting", f"attempt {attempt} created"
    elif (job_now.get("spec") or {}).get("suspend"):
        phase, message = "Pending", "waiting for admission (Kueue)"
    elif active > 0:
        phase, message = "Running", f"{active}/{tj.spec.workers.count} workers active"
        if old.get("startTime") is None:
            status["startTime"] = now
        if read_status is not None:
            url = status_url(config, tj, attempt)
            out.compute_seconds += time.thread_time() - started
            try:
                status.update(status_fields(await read_status(url)))
                degraded = (False, "AsExpected", "")
            except WorkerStatusError as err:
                degraded = (True, "WorkerStatusStale", f"rank 0 status unreachable, last values kept: {err}")
            started = time.thread_time()
    else:
        phase, message = "Pending", "waiting for worker pods"
    status["phase"] = phase
    status["conditions"] = _conditions(old, generation, now, phase, message, degraded)
    if old.get("phase") != phase:
        out.event("Normal", phase, message)
    out.status = status
    out.compute_seconds += time.thread_time() - started
    return out, tj


__all__ = ["ApiError", "reconcile_trainingjob"]
