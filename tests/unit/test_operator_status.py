"""Status and phase of both kinds from observed children: pure functions, tested like the builders (inputs:
the CR, the objects the API returned, the old status; output: the status dict and the Events)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmfleet.api import InferenceService, TrainingJob, load_file
from llmfleet.api.contracts import PROMOTION_ANNOTATION, ROUTER_PORT
from llmfleet.operator.builders.inferenceservice import pool_selector
from llmfleet.operator.isvc_status import inferenceservice_status, promotion_update
from llmfleet.operator.promotion import Promotion, from_annotations
from llmfleet.operator.status import Event
from llmfleet.operator.tj_status import (
    Observed,
    promotion_step,
    promotion_target_conditions,
    promotion_target_found,
    restart_due,
    restart_event,
    trainingjob_phase,
    trainingjob_status,
)

NOW = "2026-01-01T00:00:00Z"
ROOT = Path(__file__).resolve().parents[2]


def _isvc(annotations: dict[str, str] | None = None) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "ml", "annotations": annotations or {}},
        "spec": {"model": {"path": "/models/llama"}, "replicas": 2, "router": {"replicas": 1},
                 "slo": {"ttftP95Ms": 500},
                 "fallback": {"pools": [{"name": "student", "model": {"path": "/models/small"}, "replicas": 1}]}},
    })


def _dep(ready: int, replicas: int | None = None, **status: Any) -> dict[str, Any]:
    return {"kind": "Deployment", "metadata": {"generation": 1}, "status": {"replicas": ready if replicas is None else replicas,
                                             "readyReplicas": ready, **status}}


def _children(primary: int, student: int, router: int, primary_dep: dict[str, Any] | None = None,
              ) -> dict[tuple[str, str], Any]:
    return {("Deployment", "chat-primary"): primary_dep or _dep(primary),
            ("Deployment", "chat-student"): _dep(student),
            ("Deployment", "chat-router"): _dep(router),
            ("Service", "chat-router"): {"kind": "Service"}}


def _cond(status: dict[str, Any], ctype: str) -> tuple[str, str, str]:
    c = next(c for c in status["conditions"] if c["type"] == ctype)
    return c["status"], c["reason"], c["message"]


def test_isvc_before_the_replicas_answer_is_progressing() -> None:
    status, events = inferenceservice_status(_isvc(), {}, {}, 1, NOW, applied=9)
    assert status["phase"] == "Progressing" and status["observedGeneration"] == 1
    assert status["pools"] == [
        {"name": "primary", "replicas": 0, "readyReplicas": 0, "desiredReplicas": 2, "model": "/models/llama"},
        {"name": "student", "replicas": 0, "readyReplicas": 0, "desiredReplicas": 1, "model": "/models/small"},
    ]
    message = "waiting for replicas: primary 0/2, student 0/1"
    assert _cond(status, "Ready") == ("False", "ReplicasNotReady", message)
    assert _cond(status, "Progressing") == ("True", "RollingOut", message)
    assert _cond(status, "Degraded") == ("False", "AsExpected", "")
    assert events == [Event("Normal", "Progressing", message)]  # first reconcile: no Applied Event


def test_isvc_ready_when_every_pool_and_the_router_are() -> None:
    old = {"phase": "Progressing", "observedGeneration": 1}
    status, events = inferenceservice_status(_isvc(), _children(2, 1, 1), old, 1, NOW, applied=9)
    assert status["phase"] == "Ready" and status["replicas"] == 2
    assert status["url"] == f"http://chat-router.ml.svc:{ROUTER_PORT}/v1"
    assert status["selector"] == pool_selector(_isvc(), "primary")
    assert _cond(status, "Ready") == ("True", "AllReplicasReady", "all pools and the router are ready")
    assert events == [Event("Normal", "Ready", "all pools and the router are ready")]
    # The same observation again: the same status, no Event (level-triggered, idempotent).
    again, events = inferenceservice_status(_isvc(), _children(2, 1, 1), status, 1, NOW, applied=9)
    assert again == status and events == []


def test_isvc_waits_for_the_router_too() -> None:
    status, _ = inferenceservice_status(_isvc(), _children(2, 1, 0), {}, 1, NOW, applied=9)
    assert status["phase"] == "Progressing"


def test_isvc_failing_deployment_is_degraded() -> None:
    stuck = _dep(1, 2, conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}])
    status, events = inferenceservice_status(_isvc(), _children(1, 1, 1, primary_dep=stuck), {}, 1, NOW, applied=9)
    assert status["phase"] == "Degraded"
    assert _cond(status, "Degraded") == ("True", "DeploymentFailing", "failing: chat-primary")
    quota = _dep(0, 0, conditions=[{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}])
    status, _ = inferenceservice_status(_isvc(), _children(0, 1, 1, primary_dep=quota), {}, 1, NOW, applied=9)
    assert status["phase"] == "Degraded"


def test_isvc_new_generation_and_valid_again_events() -> None:
    old = {"phase": "Invalid", "observedGeneration": 2,
           "conditions": [{"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "x"}]}
    _, events = inferenceservice_status(_isvc(), _children(2, 1, 1), old, 3, NOW, applied=7)
    assert [e.reason for e in events] == ["Ready", "Applied", "SpecValid"]
    assert events[1].message == "applied 7 objects for generation 3"


def _rolling(**kw: Any) -> dict[str, str]:
    promo = Promotion(training_job="t", pool="student", model="/new", previous="/models/small",
                      baseline_ttft_ms=300.0, message="rolling", **kw)
    return {PROMOTION_ANNOTATION: promo.to_annotation()}


def _body(isvc: InferenceService) -> dict[str, Any]:
    return isvc.model_dump(by_alias=True, exclude_none=True)


def test_promotion_update_nothing_rolling_out() -> None:
    isvc = _isvc()
    assert promotion_update(isvc, _body(isvc), {}, _children(2, 1, 1)) == (None, [])
    done = _isvc(_rolling(state="Succeeded"))
    assert promotion_update(done, _body(done), {}, _children(2, 1, 1)) == (None, [])


def test_promotion_update_succeeds_when_the_pool_rolled() -> None:
    isvc = _isvc(_rolling())
    rolled = {"metadata": {"generation": 2, "annotations": {"llmfleet.io/model": "/new"}}, "spec": {"replicas": 1},
              "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}}
    children = {**_children(2, 1, 1), ("Deployment", "chat-student"): rolled}
    patch, events = promotion_update(isvc, _body(isvc), {}, children)
    assert patch is not None and set(patch) == {"metadata"}  # only the annotation: the model stays
    recorded = from_annotations(patch["metadata"]["annotations"])
    assert recorded is not None and recorded.state == "Succeeded"
    assert [(e.type, e.reason) for e in events] == [("Normal", "PromotionSucceeded")]


def test_promotion_update_rolls_back_on_the_pools_latency() -> None:
    isvc = _isvc(_rolling())
    metrics = {"stale": False, "pools": [{"name": "student", "ttftP95Ms": 900.0, "stale": False}]}
    patch, events = promotion_update(isvc, _body(isvc), {"metrics": metrics}, _children(2, 1, 1))
    assert patch is not None
    assert patch["spec"]["fallback"]["pools"][0]["model"]["path"] == "/models/small"  # the previous model back
    recorded = from_annotations(patch["metadata"]["annotations"])
    assert recorded is not None and recorded.state == "RolledBack"
    assert [(e.type, e.reason) for e in events] == [("Warning", "PromotionRolledBack")]
    assert "pool student back to /models/small" in events[0].message


def test_promotion_update_unchanged_rollout_patches_nothing() -> None:
    # The pool's Deployment not answered yet: "waiting for the pool's replicas", written once, then nothing.
    isvc = _isvc(_rolling())
    patch, events = promotion_update(isvc, _body(isvc), {}, {})
    assert patch is not None and events == []
    waiting = _isvc(patch["metadata"]["annotations"])
    assert promotion_update(waiting, _body(waiting), {}, {}) == (None, [])


def _tj(**spec: Any) -> TrainingJob:
    base: dict[str, Any] = {
        "model": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 256},
        "data": {"path": "/data"},
        "optimization": {"globalBatchTokens": 4096},
        "workers": {"count": 2, "gpusPerWorker": 1},
        "maxRestarts": 2,
        **spec,
    }
    return TrainingJob.model_validate({"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob",
                                       "metadata": {"name": "llama", "namespace": "ml"}, "spec": base})


def _job(suspend: bool = False, completions: int = 2, **status: Any) -> dict[str, Any]:
    return {"kind": "Job", "spec": {"completions": completions, "suspend": suspend}, "status": status}


FAILED = _job(failed=1, conditions=[{"type": "Failed", "status": "True"}])


@pytest.mark.parametrize(
    ("job", "spec", "restarted", "phase"),
    [
        ({}, {}, False, "Pending"),
        (_job(), {}, False, "Pending"),
        (_job(suspend=True), {}, False, "Pending"),  # Kueue has not admitted it
        (_job(active=2), {}, False, "Running"),
        (_job(active=2), {"suspend": True}, False, "Suspended"),
        (_job(), {}, True, "Restarting"),
        (_job(succeeded=2), {}, False, "Succeeded"),
        (_job(conditions=[{"type": "Complete", "status": "True"}]), {}, False, "Succeeded"),
        (FAILED, {}, False, "Failed"),
    ],
)
def test_tj_phase(job: dict[str, Any], spec: dict[str, Any], restarted: bool, phase: str) -> None:
    assert trainingjob_phase(_tj(**spec), Observed(job=job, attempt=0, restarted=restarted))[0] == phase


def test_tj_restart_due_until_max_restarts() -> None:
    tj = _tj()
    assert restart_due(tj, FAILED, 0) and restart_due(tj, FAILED, 1)
    assert not restart_due(tj, FAILED, 2)  # maxRestarts 2 used up: Failed
    assert not restart_due(tj, _job(active=2), 0)


def test_tj_running_takes_rank0s_metrics_and_start_time() -> None:
    seen = Observed(job=_job(active=2), attempt=1, worker={"step": 40, "loss": 2.5, "mfu": 0.41, "junk": 1})
    status, events = trainingjob_status(_tj(), seen, {"phase": "Pending", "restarts": 1}, 3, NOW)
    assert {k: status[k] for k in ("phase", "restarts", "observedGeneration", "startTime", "step", "loss", "mfu")} == {
        "phase": "Running", "restarts": 1, "observedGeneration": 3, "startTime": NOW, "step": 40, "loss": 2.5,
        "mfu": 0.41}
    assert "junk" not in status
    assert _cond(status, "Ready") == ("True", "Running", "2/2 workers active")
    assert _cond(status, "Degraded") == ("False", "AsExpected", "")
    assert events == [Event("Normal", "Running", "2/2 workers active")]
    # Running already: start time kept (not in the patch), no Event.
    status, events = trainingjob_status(_tj(), seen, {"phase": "Running", "startTime": "t0"}, 3, NOW)
    assert "startTime" not in status and events == []


def test_tj_unreachable_rank0_is_degraded_and_keeps_the_last_values() -> None:
    seen = Observed(job=_job(active=2), attempt=0, worker_error="GET http://x: TimeoutError")
    status, _ = trainingjob_status(_tj(), seen, {"phase": "Running", "step": 7}, 1, NOW)
    assert "step" not in status  # the patch leaves the last value in place
    assert _cond(status, "Degraded") == ("True", "WorkerStatusStale",
                                         "rank 0 status unreachable, last values kept: GET http://x: TimeoutError")


def test_tj_restart_status_and_events_name_the_attempt_and_checkpoint() -> None:
    old = {"phase": "Running", "lastCheckpoint": "s3://c/step-40"}
    status, events = trainingjob_status(_tj(), Observed(job=_job(), attempt=2, restarted=True), old, 1, NOW)
    assert status["phase"] == "Restarting" and status["restarts"] == 2
    assert events == [Event("Normal", "Restarting", "attempt 2 created")]
    assert restart_event(_tj(), 2, old) == Event(
        "Warning", "Restarting", "worker failure; restart 2/2, resuming from s3://c/step-40")
    assert restart_event(_tj(), 1, {}).message.endswith("resuming from the start")


def test_tj_failed_and_succeeded_are_final() -> None:
    status, events = trainingjob_status(_tj(), Observed(job=FAILED, attempt=2), {"phase": "Running"}, 1, NOW)
    assert status["phase"] == "Failed" and status["completionTime"] == NOW
    assert _cond(status, "Degraded")[:2] == ("True", "Failed")
    assert [(e.type, e.reason) for e in events] == [("Warning", "Failed")]
    status, events = trainingjob_status(_tj(), Observed(job=_job(succeeded=2), attempt=0), {}, 1, NOW)
    assert status["phase"] == "Succeeded" and _cond(status, "Ready")[0] == "True"
    assert [(e.type, e.reason) for e in events] == [("Normal", "Succeeded")]
    # Finished before: the phase stays whatever the Job now says, no Event.
    kept, events = trainingjob_status(_tj(), Observed(job={}, attempt=1), {"phase": "Succeeded"}, 2, NOW)
    assert kept == {"phase": "Succeeded", "observedGeneration": 2, "restarts": 1} and events == []


def test_promotion_target_found_needs_the_service_and_its_pool() -> None:
    tj = _tj(output={"path": "pvc://models/out", "promoteTo": {"inferenceService": "chat", "pool": "student"}})
    assert promotion_target_found(tj, None) == (
        False, "InferenceServiceNotFound", "InferenceService ml/chat does not exist")
    no_pool = _body(_isvc())
    no_pool["spec"]["fallback"]["pools"][0]["name"] = "tiny"
    assert promotion_target_found(tj, no_pool) == (
        False, "PoolNotFound", "InferenceService ml/chat has no pool 'student' (pools: primary, tiny)")
    assert promotion_target_found(tj, _body(_isvc())) == (True, "Found", "promotes to chat/student")
    with pytest.raises(ValueError):
        promotion_target_found(_tj(), None)


def test_promotion_target_events_on_missing_changed_and_found() -> None:
    missing = (False, "InferenceServiceNotFound", "InferenceService ml/chat does not exist")
    conds, events = promotion_target_conditions(None, missing, 1, NOW)
    assert [(c["type"], c["status"], c["reason"]) for c in conds] == [
        ("PromotionTarget", "False", "InferenceServiceNotFound")]
    assert [(e.type, e.reason) for e in events] == [("Warning", "PromotionTargetMissing")]
    assert promotion_target_conditions(conds, missing, 1, NOW)[1] == []  # still missing, same message: quiet
    other = (False, "PoolNotFound", "InferenceService ml/chat has no pool 'student' (pools: primary)")
    assert [e.reason for e in promotion_target_conditions(conds, other, 1, NOW)[1]] == ["PromotionTargetMissing"]
    found = (True, "Found", "promotes to chat/student")
    conds2, events = promotion_target_conditions(conds, found, 1, NOW)
    assert events == [Event("Normal", "PromotionTargetFound", "promotes to chat/student")]
    assert conds2[0]["status"] == "True"
    assert promotion_target_conditions(None, found, 1, NOW)[1] == []  # found at once: nothing to announce


def _promoting_tj() -> TrainingJob:
    return _tj(output={"path": "pvc://models/new", "promoteTo": {"inferenceService": "chat", "pool": "student"}})


def test_promotion_step_waits_for_the_service_and_its_pool() -> None:
    step = promotion_step(_promoting_tj(), {}, None, NOW)
    assert step.status == {"inferenceService": "chat", "pool": "student", "state": "Pending",
                           "message": "InferenceService chat not found"}
    assert step.patch is None and step.events == [] and step.target_events == []
    no_pool = _body(_isvc())
    no_pool["spec"]["fallback"]["pools"] = []
    step = promotion_step(_promoting_tj(), {}, no_pool, NOW)
    assert step.status["state"] == "Pending" and step.patch is None


def test_promotion_step_starts_a_rollout_with_the_pools_own_baseline() -> None:
    isvc = _body(_isvc())
    isvc["metadata"]["resourceVersion"] = "7"
    isvc["status"] = {"metrics": {"stale": False, "ttftP95Ms": 900.0,
                                  "pools": [{"name": "student", "ttftP95Ms": 120.0, "stale": False}]}}
    step = promotion_step(_promoting_tj(), {}, isvc, NOW)
    assert step.status["state"] == "RollingOut"
    assert step.patch is not None
    assert step.patch["spec"]["fallback"]["pools"][0]["model"]["path"] == "pvc://models/new"
    promo = from_annotations(step.patch["metadata"]["annotations"])
    assert promo is not None and (promo.training_job, promo.previous, promo.baseline_ttft_ms, promo.started_at) == (
        "llama", "/models/small", 120.0, NOW)
    assert [e.reason for e in step.events] == ["PromotionStarted"]
    assert step.events[0].message == "promoting pvc://models/new to chat/student (was /models/small)"
    assert step.target_events[0].message.endswith("from TrainingJob llama")


def test_promotion_step_follows_the_annotation_the_service_keeps() -> None:
    promo = Promotion(training_job="llama", pool="student", model="pvc://models/new", previous="/models/small",
                      state="RolledBack", message="pool student: TTFT p95 900 ms exceeds the SLO 500 ms")
    isvc = _body(_isvc({PROMOTION_ANNOTATION: promo.to_annotation()}))
    step = promotion_step(_promoting_tj(), {"state": "RollingOut"}, isvc, NOW)
    assert step.patch is None
    assert step.status == {"inferenceService": "chat", "pool": "student", "state": "RolledBack",
                           "message": promo.message}
    assert step.events == [Event("Warning", "PromotionRolledBack", promo.message)]
    assert promotion_step(_promoting_tj(), {"state": "RolledBack"}, isvc, NOW).events == []  # told once
    # Another TrainingJob's annotation: this one starts its own promotion.
    other = _body(_isvc({PROMOTION_ANNOTATION: Promotion(training_job="other", pool="student", model="x",
                                                         previous="y").to_annotation()}))
    assert promotion_step(_promoting_tj(), {}, other, NOW).status["state"] == "RollingOut"


def test_promotion_step_adds_a_lora_adapter_at_once() -> None:
    (tj,) = load_file(ROOT / "examples" / "trainingjob-lora.yaml")
    (isvc,) = load_file(ROOT / "examples" / "inferenceservice-lora.yaml")
    assert isinstance(tj, TrainingJob) and isinstance(isvc, InferenceService)
    body = _body(isvc)
    step = promotion_step(tj, {}, body, NOW)
    assert step.status["state"] == "Succeeded" and step.patch is not None
    assert {"name": "tiny-sql", "uri": "/adapters/tiny-sql"} in step.patch["spec"]["adapters"]
    assert [e.reason for e in step.events] == ["PromotionSucceeded"]
    assert [e.reason for e in step.target_events] == ["AdapterAdded"]
    del body["spec"]["lora"]
    step = promotion_step(tj, {}, body, NOW)
    assert step.status["state"] == "Pending" and "has no spec.lora" in step.status["message"] and step.patch is None
