"""Storage locations through the builders: pvc:// mounts, fetch init containers into the cache, the router's
tokenizer folders, the training workers' resolved spec and upload environment; all valid Kubernetes objects."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from llmfleet.api import InferenceService, TrainingJob
from llmfleet.api.storage import parse_uri
from llmfleet.operator.builders import ServiceSpecError, build_inferenceservice, build_trainingjob
from llmfleet.operator.config import OperatorConfig
from llmfleet.router.config import ROUTER_MODEL_FILES, RouterConfig
from llmfleet.storage import cache_key

K8S_VERSION = "1.33.0"
CONFIG = OperatorConfig(fetch_image="llmfleet-fetch:test")


def _isvc(model: str, student: str, storage: dict[str, Any] | None = None) -> InferenceService:
    spec: dict[str, Any] = {
        "model": {"path": model}, "resources": {"gpus": 1},
        "fallback": {"pools": [{"name": "student", "model": {"path": student}, "resources": {"gpus": 1}}]},
    }
    if storage:
        spec["storage"] = storage
    return InferenceService.model_validate({"metadata": {"name": "chat", "namespace": "ml", "uid": "u1"}, "spec": spec})


def _by(ms: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [m for m in ms if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def _pod(ms: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    m = _by(ms, kind, name)
    return dict(m["spec"]["template"]["spec"])


def _validate(ms: list[dict[str, Any]]) -> None:
    for m in ms:
        if m["kind"] != "PodMonitor":
            kubernetes_validate.validate(copy.deepcopy(m), K8S_VERSION, strict=True)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _argv_model(container: dict[str, Any]) -> str:
    argv = container["command"]
    return str(argv[argv.index("--model") + 1])


def test_hf_model_fetched_once_into_the_shared_cache_claim_and_pvc_student_mounted() -> None:
    isvc = _isvc("hf://Qwen/Qwen2.5-7B-Instruct@main", "pvc://models/students/v3",
                 {"hf": {"tokenSecret": "hf-token"}, "cache": {"claim": "model-cache"}})
    ms = build_inferenceservice(isvc, CONFIG)
    _validate(ms)

    pod = _pod(ms, "Deployment", "chat-primary")
    (init,) = pod["initContainers"]
    assert init["image"] == "llmfleet-fetch:test"
    assert init["command"] == ["llmfleet", "fetch", "hf://Qwen/Qwen2.5-7B-Instruct@main", "/mnt/llmfleet/model"]
    assert _env(init)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    key = cache_key(parse_uri("hf://Qwen/Qwen2.5-7B-Instruct@main"))
    assert init["volumeMounts"][0] == {"name": "cache", "mountPath": "/mnt/llmfleet/model", "subPath": key}
    assert [m["name"] for m in init["volumeMounts"][1:]] == ["tmp", "home"]  # writable beside a read-only root
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in pod["volumes"]
    engine = pod["containers"][0]
    assert {"name": "cache", "mountPath": "/mnt/llmfleet/model", "subPath": key, "readOnly": True} in engine["volumeMounts"]
    assert _argv_model(engine) == "/mnt/llmfleet/model"
    assert "HF_TOKEN" not in _env(engine)  # only the fetch sees the token

    student = _pod(ms, "Deployment", "chat-student")
    assert "initContainers" not in student
    (claim,) = [v for v in student["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert {"name": claim["name"], "mountPath": "/mnt/llmfleet/model", "subPath": "students/v3", "readOnly": True} \
        in student["containers"][0]["volumeMounts"]
    assert _argv_model(student["containers"][0]) == "/mnt/llmfleet/model"
    # The rollout annotation keeps the URI: promotion compares it with the URI it handed the pool.
    assert _by(ms, "Deployment", "chat-student")["metadata"]["annotations"]["llmfleet.io/model"] == "pvc://models/students/v3"


def test_router_gets_each_pools_tokenizer_folder() -> None:
    isvc = _isvc("hf://Qwen/Qwen2.5-7B-Instruct", "pvc://models/small",
                 {"hf": {"tokenSecret": "hf-token"}, "cache": {"claim": "model-cache"}})
    ms = build_inferenceservice(isvc, CONFIG)
    router = _pod(ms, "Deployment", "chat-router")
    (init,) = router["initContainers"]
    include = [init["command"][i + 1] for i, a in enumerate(init["command"]) if a == "--include"]
    assert init["command"][:4] == ["llmfleet", "fetch", "hf://Qwen/Qwen2.5-7B-Instruct", "/mnt/llmfleet/model-primary"]
    assert include == list(ROUTER_MODEL_FILES) and not any("safetensors" in p for p in include)
    # Never the shared weights claim: a small emptyDir of its own.
    cache = next(v for v in router["volumes"] if v["name"] == "cache")
    assert cache == {"name": "cache", "emptyDir": {"sizeLimit": "2Gi"}}
    mounts = {m["mountPath"]: m for m in router["containers"][0]["volumeMounts"]}
    assert mounts["/mnt/llmfleet/model-primary"]["readOnly"] is True
    assert mounts["/mnt/llmfleet/model-student"]["subPath"] == "small"
    cfg = RouterConfig.from_yaml(_by(ms, "ConfigMap", "chat-router")["data"]["router.yaml"])
    assert [(p.name, p.tokenizer_path, p.model_path) for p in cfg.pools] == [
        ("primary", "/mnt/llmfleet/model-primary", "/mnt/llmfleet/model-primary"),
        ("student", "/mnt/llmfleet/model-student", "/mnt/llmfleet/model-student"),
    ]


def test_s3_model_with_endpoint_and_credentials_in_an_emptydir_cache() -> None:
    isvc = _isvc("s3://models/llama-8b", "/models/small", {
        "s3": {"endpoint": "http://minio.storage.svc:9000", "region": "eu-1", "credentialsSecret": "s3-creds",
               "addressingStyle": "path"},
        "cache": {"sizeLimit": "50Gi"},
    })
    ms = build_inferenceservice(isvc, CONFIG)
    _validate(ms)
    pod = _pod(ms, "Deployment", "chat-primary")
    (init,) = pod["initContainers"]
    env = _env(init)
    assert env["AWS_ENDPOINT_URL"] == "http://minio.storage.svc:9000" and env["AWS_DEFAULT_REGION"] == "eu-1"
    assert env["LLMFLEET_S3_ADDRESSING_STYLE"] == "path"
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SESSION_TOKEN"]["secretKeyRef"]["optional"] is True
    assert {"name": "cache", "emptyDir": {"sizeLimit": "50Gi"}} in pod["volumes"]
    assert init["volumeMounts"][0] == {"name": "cache", "mountPath": "/mnt/llmfleet/model", "subPath": "model"}
    # A local student path is used in place: no fetch, no extra volume.
    student = _pod(ms, "Deployment", "chat-student")
    assert "initContainers" not in student and _argv_model(student["containers"][0]) == "/models/small"


def test_tiny_models_are_refused_on_kubernetes_naming_the_field() -> None:
    with pytest.raises(ServiceSpecError, match=r"spec\.fallback\.pools\[name=student\]\.model\.path: tiny://"):
        build_inferenceservice(_isvc("/models/a", "tiny://tiny-llama"), CONFIG)


def _tj(**spec: Any) -> TrainingJob:
    base: dict[str, Any] = {
        "model": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 256},
        "data": {"path": "/data"}, "optimization": {"globalBatchTokens": 4096},
        "workers": {"count": 2, "gpusPerWorker": 8},
    }
    base.update(spec)
    return TrainingJob.model_validate({"metadata": {"name": "llama", "namespace": "ml", "uid": "u2"}, "spec": base})


def test_training_fetches_inputs_and_uploads_an_s3_export() -> None:
    tj = _tj(
        data={"path": "s3://llm-data/tokens/v1", "tokenizer": "hf://org/tok"},
        distillation={"teacher": "pvc://models/teacher-8b"},
        output={"path": "s3://llm-models/student/v1", "promoteTo": {"inferenceService": "chat", "pool": "student"}},
        storage={"s3": {"endpoint": "http://minio:9000", "credentialsSecret": "s3"}, "hf": {"tokenSecret": "hf"}},
    )
    ms = build_trainingjob(tj, CONFIG)
    _validate(ms)
    # Without LLMFLEET_FETCH_IMAGE the fetches run from the training image (it carries the storage extra).
    default = build_trainingjob(tj, OperatorConfig(train_image="train:1"))
    assert {c["image"] for c in _by(default, "Job", "llama-r0")["spec"]["template"]["spec"]["initContainers"]} == {"train:1"}
    worker_spec = yaml.safe_load(_by(ms, "ConfigMap", "llama-spec")["data"]["job.yaml"])["spec"]
    assert worker_spec["data"] == {"path": "/mnt/llmfleet/data", "tokenizer": "/mnt/llmfleet/tokenizer"}
    assert worker_spec["distillation"]["teacher"] == "/mnt/llmfleet/teacher"
    assert worker_spec["output"]["path"] == "s3://llm-models/student/v1"
    pod = _by(ms, "Job", "llama-r0")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-data", "fetch-tokenizer"]
    assert pod["initContainers"][0]["command"] == ["llmfleet", "fetch", "s3://llm-data/tokens/v1", "/mnt/llmfleet/data"]
    assert _env(pod["initContainers"][1])["HF_TOKEN"]["secretKeyRef"]["name"] == "hf"
    worker = pod["containers"][0]
    env = _env(worker)
    # Rank 0 uploads the export: the worker has the S3 environment (and nothing of the Hub's).
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000" and "AWS_SECRET_ACCESS_KEY" in env and "HF_TOKEN" not in env
    mounts = {m["mountPath"]: m for m in worker["volumeMounts"]}
    assert mounts["/mnt/llmfleet/teacher"]["readOnly"] is True and mounts["/mnt/llmfleet/teacher"]["subPath"] == "teacher-8b"
    assert mounts["/mnt/llmfleet/data"]["readOnly"] is True


def test_training_pvc_output_shares_the_claim_writable() -> None:
    tj = _tj(data={"path": "pvc://work/tokens"}, output={"path": "pvc://work/exports/v2"})
    ms = build_trainingjob(tj, CONFIG)
    _validate(ms)
    pod = _by(ms, "Job", "llama-r0")["spec"]["template"]["spec"]
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v and v["name"] != "checkpoints"]
    assert len(claims) == 1 and claims[0]["persistentVolumeClaim"] == {"claimName": "work", "readOnly": False}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/mnt/llmfleet/output"]["subPath"] == "exports/v2" and "readOnly" not in mounts["/mnt/llmfleet/output"]
    assert mounts["/mnt/llmfleet/data"]["readOnly"] is True
    worker_spec = yaml.safe_load(_by(ms, "ConfigMap", "llama-spec")["data"]["job.yaml"])["spec"]
    assert worker_spec["output"]["path"] == "/mnt/llmfleet/output" and worker_spec["data"]["path"] == "/mnt/llmfleet/data"
    assert "initContainers" not in pod


def test_local_locations_leave_the_pods_as_they_were() -> None:
    ms = build_trainingjob(_tj(), CONFIG)
    pod = _by(ms, "Job", "llama-r0")["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert [v["name"] for v in pod["volumes"]] == ["spec", "checkpoints", "dshm", "tmp", "home"]
    assert yaml.safe_load(_by(ms, "ConfigMap", "llama-spec")["data"]["job.yaml"])["spec"]["data"]["path"] == "/data"


@pytest.mark.parametrize(
    ("path", "model_dir", "want"),
    [
        ("file:///models/a", None, "/models/a"),
        ("hf://org/m", None, "org/m"),  # vLLM downloads a Hub id itself when nothing fetched it
        ("s3://bkt/m", "/mnt/llmfleet/model", "/mnt/llmfleet/model"),
        ("/models/a", "/elsewhere", "/elsewhere"),
    ],
)
def test_the_engine_loads_model_dir_else_the_location(path: str, model_dir: str | None, want: str) -> None:
    from llmfleet.workers.serve.vllm_args import render_vllm_args

    isvc = _isvc(path, "/models/s")
    argv = render_vllm_args(isvc, isvc.pools()[0], model_dir=model_dir)
    assert argv[argv.index("--model") + 1] == want


def test_tiny_teacher_is_refused_on_kubernetes_naming_the_field() -> None:
    # The API accepts tiny:// for teachers and tokenizers (llmfleet train resolves them); a cluster cannot.
    with pytest.raises(ValueError, match=r"spec\.distillation\.teacher: tiny://"):
        build_trainingjob(_tj(distillation={"teacher": "tiny://tiny-llama"}), CONFIG)


async def test_operator_marks_a_tiny_teacher_invalid_instead_of_retrying() -> None:
    from llmfleet.operator.reconcile_tj import reconcile_trainingjob

    body = _tj(distillation={"teacher": "tiny://tiny-llama"}).model_dump(by_alias=True, exclude_none=True)
    body["metadata"].update({"uid": "u", "generation": 2})
    out = await reconcile_trainingjob(body, None, CONFIG, "t")  # type: ignore[arg-type]
    ready = out.status["conditions"][0]
    assert out.status["phase"] == "Invalid" and ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.distillation.teacher: tiny://")
