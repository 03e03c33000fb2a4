"""One malformed object never stops the others: a TrainingJob with `workers.count: "two"` and an
InferenceService with `spec: "string"` (objects an API server's schema would refuse today, but which exist when
they were written before a CRD upgrade) beside healthy InferenceServices. Each malformed object gets its own
condition and Warning Event; the operator's reconciles and the autoscaler's timers go on for the rest."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from operator_testkit import eventually, isvc_manifest, tj_manifest

from llmfleet.api.contracts import SERVING_PRIORITY_ANNOTATION, SUSPENDED_BY_ANNOTATION

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ISVC = "llmfleet.io/v1alpha1/inferenceservices"
TJ = "llmfleet.io/v1alpha1/trainingjobs"
DEPLOY = "apps/v1/deployments"


def _ready_condition(emu: Any, resource: str, name: str) -> dict[str, Any] | None:
    status = (emu.get(resource, "ml", name) or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), None)


def _warnings(emu: Any, name: str) -> list[dict[str, Any]]:
    return [e for e in emu.list("v1/events", "ml")
            if e["involvedObject"]["name"] == name and e["type"] == "Warning"]


async def test_malformed_objects_get_conditions_and_the_rest_is_served(cluster: Any, spawn: Any) -> None:
    emu, url = cluster
    bad_tj = tj_manifest(name="bad-train")
    bad_tj["spec"]["workers"]["count"] = "two"
    await emu.put(TJ, bad_tj)
    bad_isvc = isvc_manifest(name="bad-chat")
    bad_isvc["spec"] = "string"
    await emu.put(ISVC, bad_isvc)
    # A job the healthy service `chat` suspended earlier: its autoscaler timer resumes it (the service is not
    # burning its SLO), which needs the namespace's TrainingJobs, the malformed one among them.
    paused = tj_manifest(name="paused", suspend=True)
    paused["metadata"]["annotations"] = {SUSPENDED_BY_ANNOTATION: "chat"}
    await emu.put(TJ, paused)
    for name in ("chat", "other"):
        isvc = isvc_manifest(name=name, autoscaling={"intervalSeconds": 1})
        if name == "other":  # a serving priority that is no integer: that service's Event, no one else's problem
            isvc["metadata"]["annotations"] = {SERVING_PRIORITY_ANNOTATION: "high"}
        await emu.put(ISVC, isvc)

    # A process: the operator with the autoscaler's timers (importing them registers them for good in kopf's
    # default registry, which the in-process operators of other tests share).
    op = await spawn(url, "--standalone")

    for name in ("chat", "other"):
        await eventually(lambda n=name: emu.get(DEPLOY, "ml", f"{n}-router"), timeout=30)
        await eventually(lambda n=name: _ready_condition(emu, ISVC, n), timeout=30)

    tj_cond = await eventually(lambda: _ready_condition(emu, TJ, "bad-train"), timeout=30)
    assert tj_cond["status"] == "False" and tj_cond["reason"] == "InvalidSpec"
    assert "spec.workers.count" in tj_cond["message"]
    isvc_cond = await eventually(lambda: _ready_condition(emu, ISVC, "bad-chat"), timeout=30)
    assert isvc_cond["status"] == "False" and isvc_cond["reason"] == "InvalidSpec"
    assert isvc_cond["message"].startswith("spec:")
    assert await eventually(lambda: _warnings(emu, "bad-train"))
    assert await eventually(lambda: _warnings(emu, "bad-chat"))
    assert emu.get(DEPLOY, "ml", "bad-chat-router") is None

    # The autoscaler's timer of `chat` arbitrated despite the malformed job beside it.
    await eventually(lambda: emu.get(TJ, "ml", "paused")["spec"]["suspend"] is False, timeout=45)

    def resumed() -> set[str]:
        return {e["involvedObject"]["name"] for e in emu.list("v1/events", "ml") if e["reason"] == "ResumedAfterServing"}

    await eventually(lambda: resumed() >= {"paused", "chat"})
    bad = emu.get(TJ, "ml", "bad-train")
    assert bad["spec"]["workers"]["count"] == "two" and not bad["spec"].get("suspend")
    assert not [ln for ln in op.lines() if "Traceback" in ln], op.lines()[-20:]

    def annotation_warnings() -> list[dict[str, Any]]:
        return [e for e in _warnings(emu, "other") if e["reason"] == "InvalidAnnotation"]

    (warning,) = await eventually(annotation_warnings)
    assert SERVING_PRIORITY_ANNOTATION in warning["message"] and "'high'" in warning["message"]
    await asyncio.sleep(2.5)  # more autoscaler ticks (1 s): still one Event for the same value
    assert len(annotation_warnings()) == 1
