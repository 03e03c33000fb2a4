"""The generation CronJob builder (pure: CR -> dict)."""

from __future__ import annotations

from typing import Any

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.operator.builders.featurestore import build_generation_cronjob


def _isvc(store: dict[str, Any] | None, name: str = "chat") -> InferenceService:
    spec: dict[str, Any] = {"model": {"path": "/models/tiny-v3", "servedName": "tiny"}}
    if store is not None:
        spec["featureStore"] = store
    return InferenceService.model_validate({"metadata": {"name": name, "namespace": "ml"}, "spec": spec})


def test_no_schedule_no_cronjob() -> None:
    assert build_generation_cronjob(_isvc(None), "img") is None
    assert build_generation_cronjob(_isvc({"url": "postgresql://db/fs"}), "img") is None


def test_cronjob_runs_generate_against_the_primary_pool() -> None:
    cj = build_generation_cronjob(
        _isvc({"generationSchedule": "*/30 * * * *", "minFrequency": 5, "url": "postgresql+psycopg://u@db/fs"}),
        "ghcr.io/llmfleet/llmfleet:1",
    )
    assert cj is not None
    assert cj["apiVersion"] == "batch/v1" and cj["kind"] == "CronJob"
    assert cj["metadata"]["name"] == "chat-features" and cj["metadata"]["namespace"] == "ml"
    assert cj["metadata"]["labels"]["llmfleet.io/component"] == "featurestore"
    assert cj["spec"]["schedule"] == "*/30 * * * *" and cj["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "ghcr.io/llmfleet/llmfleet:1"
    cmd = c["command"]
    assert cmd[:3] == ["llmfleet", "features", "generate"]
    opts = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert opts["--model"] == "tiny" and opts["--model-version"] == "/models/tiny-v3"
    assert opts["--endpoint"] == "http://chat-primary.ml.svc:8000/v1" and opts["--min-frequency"] == "5"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["LLMFLEET_STORE_URL"] == "postgresql+psycopg://u@db/fs"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "chat-requests"
    assert pod["restartPolicy"] == "OnFailure"


def test_long_names_are_shortened_for_cronjobs() -> None:
    cj = build_generation_cronjob(_isvc({"generationSchedule": "@hourly"}, name="a" * 60), "img")
    assert cj is not None and len(cj["metadata"]["name"]) <= 52
    env = {e["name"]: e["value"] for e in cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    # SQLite default on the mounted volume, named explicitly (the router is given the same URL).
    assert env["LLMFLEET_STORE_URL"] == "sqlite:////var/lib/llmfleet/featurestore.db"


def test_cronjob_validates_against_kubernetes_schema() -> None:
    import kubernetes_validate

    cj = build_generation_cronjob(_isvc({"generationSchedule": "@daily"}), "img")
    kubernetes_validate.validate(cj, "1.30", strict=True)
