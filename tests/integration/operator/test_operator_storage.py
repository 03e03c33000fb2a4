"""pvc:// and s3:// locations through the real operator and the emulator: replicas mount the model claim,
training mounts its data and export claims, and promotion hands the pool the export's URI (which the pool
then mounts), never a folder of the training pod."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from operator_testkit import eventually, isvc_manifest, tj_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ISVC = "llmfleet.io/v1alpha1/inferenceservices"
TJ = "llmfleet.io/v1alpha1/trainingjobs"
DEPLOY = "apps/v1/deployments"
JOBS = "batch/v1/jobs"


def _pod(dep: dict[str, Any]) -> dict[str, Any]:
    return dict(dep["spec"]["template"]["spec"])


def _model_mount(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    engine = pod["containers"][0]
    argv = engine["command"]
    folder = argv[argv.index("--model") + 1]
    mount = next(m for m in engine["volumeMounts"] if m["mountPath"] == folder)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    return mount, volume


async def test_pvc_models_mounted_and_promotion_hands_over_the_uri(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    spec = isvc_manifest(model={"path": "pvc://models/llama/v1", "servedName": "llama"})
    spec["spec"]["fallback"]["pools"][0]["model"] = {"path": "s3://llm-models/small"}
    spec["spec"]["storage"] = {"s3": {"endpoint": "http://minio:9000", "credentialsSecret": "s3"}}
    await emu.put(ISVC, spec)

    primary = await eventually(lambda: emu.get(DEPLOY, "ml", "chat-primary"))
    mount, volume = _model_mount(_pod(primary))
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert mount["subPath"] == "llama/v1" and mount["readOnly"] is True
    student = _pod(await eventually(lambda: emu.get(DEPLOY, "ml", "chat-student")))
    assert student["initContainers"][0]["command"][:3] == ["llmfleet", "fetch", "s3://llm-models/small"]
    router = _pod(await eventually(lambda: emu.get(DEPLOY, "ml", "chat-router")))
    assert {m["mountPath"] for m in router["containers"][0]["volumeMounts"]} >= {
        "/mnt/llmfleet/model-primary", "/mnt/llmfleet/model-student"}

    # Training reads its data from one claim and exports to another folder of the models claim.
    output = {"path": "pvc://models/llama/v2", "promoteTo": {"inferenceService": "chat", "pool": "primary"}}
    await emu.put(TJ, tj_manifest(data={"path": "pvc://datasets/tokens"}, output=output))
    job = await eventually(lambda: emu.get(JOBS, "ml", "train-r0"))
    worker_pod = job["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in worker_pod["containers"][0]["volumeMounts"]}
    assert mounts["/mnt/llmfleet/output"]["subPath"] == "llama/v2"
    assert mounts["/mnt/llmfleet/data"] == {**mounts["/mnt/llmfleet/data"], "subPath": "tokens", "readOnly": True}
    worker_spec = yaml.safe_load(emu.get("v1/configmaps", "ml", "train-spec")["data"]["job.yaml"])["spec"]
    assert worker_spec["output"]["path"] == "/mnt/llmfleet/output"  # the workers write to the mounted folder

    await emu.patch(JOBS, "ml", "train-r0", {"status": {"succeeded": 2}}, "status")
    # The pool gets the URI from the TrainingJob's spec, not the worker's folder ...
    await eventually(lambda: emu.get(ISVC, "ml", "chat")["spec"]["model"]["path"] == "pvc://models/llama/v2")

    # ... and its Deployment mounts that folder of the claim.
    def rolled() -> Any:
        dep = emu.get(DEPLOY, "ml", "chat-primary")
        return dep["metadata"]["annotations"]["llmfleet.io/model"] == "pvc://models/llama/v2" and dep

    mount, volume = _model_mount(_pod(await eventually(rolled)))
    assert volume["persistentVolumeClaim"]["claimName"] == "models" and mount["subPath"] == "llama/v2"


async def test_a_tiny_model_is_an_invalid_spec_on_kubernetes(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    await emu.put(ISVC, isvc_manifest(name="tiny", model={"path": "tiny://tiny-llama"}))

    def invalid() -> Any:
        status = emu.get(ISVC, "ml", "tiny").get("status") or {}
        return status.get("phase") == "Invalid" and status

    status = await eventually(invalid)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "spec.model.path: tiny://" in ready["message"]
    assert emu.get(DEPLOY, "ml", "tiny-primary") is None
