"""Offline feature generation: the router writes its request log on the volume the generation CronJob reads."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from llmfleet.api import InferenceService
from llmfleet.operator.builders.inferenceservice import build_inferenceservice
from llmfleet.operator.config import OperatorConfig
from llmfleet.operator.rbac import allows
from llmfleet.router.config import RouterConfig


def _isvc(feature_store: dict[str, Any] | None) -> InferenceService:
    spec: dict[str, Any] = {"model": {"path": "/m"}, "resources": {"gpus": 1}}
    if feature_store is not None:
        spec["featureStore"] = feature_store
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u-1"}, "spec": spec,
    })


def _by(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def test_generation_schedule_shares_one_claim_between_router_and_cronjob() -> None:
    ms = build_inferenceservice(_isvc({"generationSchedule": "0 3 * * *"}), OperatorConfig())
    (claim,) = _by(ms, "PersistentVolumeClaim")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    kubernetes_validate.validate(claim, "1.30", strict=True)

    router = next(m for m in _by(ms, "Deployment") if m["metadata"]["name"] == "chat-router")
    pod = router["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert vol["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == vol["name"])

    (cron,) = _by(ms, "CronJob")
    job_pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]
               for v in job_pod["volumes"])
    args = job_pod["containers"][0].get("args") or job_pod["containers"][0]["command"]
    log_path = args[args.index("--log") + 1]

    configmap = next(m for m in _by(ms, "ConfigMap") if m["metadata"]["name"] == "chat-router")
    cfg = RouterConfig.from_yaml(configmap["data"]["router.yaml"])
    assert cfg.request_log == log_path and log_path.startswith(mount["mountPath"] + "/")
    assert allows("", "persistentvolumeclaims", "create")


def test_no_generation_no_claim_and_no_request_log() -> None:
    for store in (None, {"url": "postgresql+psycopg://x@db/f"}):
        ms = build_inferenceservice(_isvc(store), OperatorConfig())
        assert _by(ms, "PersistentVolumeClaim") == [] and _by(ms, "CronJob") == []
        configmap = next(m for m in _by(ms, "ConfigMap") if m["metadata"]["name"] == "chat-router")
        assert RouterConfig.from_yaml(configmap["data"]["router.yaml"]).request_log is None


def _store_path_claim(pod: dict[str, Any], container: dict[str, Any], path: str) -> str | None:
    """The claim that holds `path` in this pod (the volume mounted at a folder above it)."""
    for m in container["volumeMounts"]:
        if path.startswith(m["mountPath"].rstrip("/") + "/"):
            vol = next(v for v in pod["volumes"] if v["name"] == m["name"])
            return str(vol.get("persistentVolumeClaim", {}).get("claimName"))
    return None


def test_router_reads_the_store_the_cronjob_writes() -> None:
    """One location by construction (featurestore.store_url): SQLite on the shared claim, or the spec's URL."""
    from sqlalchemy.engine import make_url

    from llmfleet.operator.builders.featurestore import LOG_MOUNT
    from llmfleet.store.db import default_url

    pg = "postgresql+psycopg://llmfleet@db.ml.svc/features"
    for store, want in (({"generationSchedule": "0 3 * * *"}, default_url(LOG_MOUNT)),
                        ({"generationSchedule": "0 3 * * *", "url": pg}, pg)):
        isvc = _isvc(store)
        isvc.spec.router.feature_store_lookup = True
        ms = build_inferenceservice(isvc, OperatorConfig())
        configmap = next(m for m in _by(ms, "ConfigMap") if m["metadata"]["name"] == "chat-router")
        router_url = RouterConfig.from_yaml(configmap["data"]["router.yaml"]).feature_store.url
        (cron,) = _by(ms, "CronJob")
        job_pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        job_env = {e["name"]: e.get("value") for e in job_pod["containers"][0]["env"]}
        assert router_url == job_env["LLMFLEET_STORE_URL"] == want
        if want.startswith("sqlite"):
            db = str(make_url(want).database)
            router = next(m for m in _by(ms, "Deployment") if m["metadata"]["name"] == "chat-router")
            router_pod = router["spec"]["template"]["spec"]
            claim = _store_path_claim(router_pod, router_pod["containers"][0], db)
            assert claim == "chat-requests"
            assert _store_path_claim(job_pod, job_pod["containers"][0], db) == claim


def test_lookups_without_a_shared_store_are_an_invalid_spec() -> None:
    import pytest

    from llmfleet.operator.builders import ServiceSpecError

    for store in (None, {"semanticThreshold": 0.9}):
        isvc = _isvc(store)
        isvc.spec.router.feature_store_lookup = True
        with pytest.raises(ServiceSpecError, match=r"^spec\.router\.featureStoreLookup: "):
            build_inferenceservice(isvc, OperatorConfig())
