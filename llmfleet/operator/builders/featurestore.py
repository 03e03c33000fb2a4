"""The offline generation CronJob of an InferenceService (a pure builder: CR -> manifest dict).

`llmfleet.operator.builders.inferenceservice` adds the owner's labels and the owner reference.
The Job reads the router's request log from the `<isvc>-requests` PersistentVolumeClaim (the router writes
`requests.jsonl` there), and asks the primary pool's Service directly (not the router, whose log would count
the generation's own requests). Where it writes and the router reads is one value, `store_url(isvc)`: the
spec's `featureStore.url`, else SQLite on that same volume, which both pods mount at LOG_MOUNT.
"""

from __future__ import annotations

from typing import Any

from llmfleet.api.contracts import (
    COMPONENT_LABEL,
    FEATURE_STORE_DB_FILE,
    INFERENCESERVICE_LABEL,
    MANAGED_LABELS,
    REPLICA_PORT,
    child_name,
)
from llmfleet.api.inferenceservice import InferenceService

LOG_MOUNT = "/var/lib/llmfleet"
LOG_FILE = "requests.jsonl"
# CronJob names are limited to 52 characters (the Job suffix takes the rest).
CRONJOB_NAME_LIMIT = 52


def store_url(isvc: InferenceService) -> str | None:
    """The feature store the router reads and the generation CronJob writes, or None when there is none.

    `featureStore.url` when set (PostgreSQL for several nodes); else, with a generationSchedule, SQLite on the
    request-log claim that both pods mount at LOG_MOUNT (the URL store.db.default_url(LOG_MOUNT) gives).
    """
    store = isvc.spec.feature_store
    if store is None:
        return None
    if store.url:
        return store.url
    if store.generation_schedule:
        return f"sqlite:///{LOG_MOUNT}/{FEATURE_STORE_DB_FILE}"
    return None


def request_log_claim(isvc: InferenceService) -> str:
    return f"{isvc.metadata.name}-requests"


def build_request_log_claim(isvc: InferenceService, size: str = "10Gi") -> dict[str, Any] | None:
    """The PersistentVolumeClaim the router writes its request log to and the CronJob reads, or None.

    ReadWriteMany: router pods and the generation Job may run on different nodes (it needs a storage class
    that offers RWX, e.g. NFS or CephFS; on a one-node cluster any class works).
    """
    store = isvc.spec.feature_store
    if store is None or not store.generation_schedule:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": request_log_claim(isvc), "namespace": isvc.metadata.namespace or "default"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}},
    }


def build_generation_cronjob(isvc: InferenceService, image: str) -> dict[str, Any] | None:
    """A batch/v1 CronJob running `llmfleet features generate`, or None without a generationSchedule."""
    store = isvc.spec.feature_store
    if store is None or not store.generation_schedule:
        return None
    name = isvc.metadata.name
    namespace = isvc.metadata.namespace or "default"
    primary = isvc.pools()[0]
    endpoint = f"http://{name}-{primary.name}.{namespace}.svc:{REPLICA_PORT}/v1"
    args = [
        "llmfleet", "features", "generate",
        "--log", f"{LOG_MOUNT}/{LOG_FILE}",
        "--model", primary.served_name,
        "--model-version", primary.model.path,
        "--endpoint", endpoint,
        "--min-frequency", str(store.min_frequency),
        "--no-progress",
    ]
    env: list[dict[str, Any]] = [
        {"name": "LLMFLEET_RUN_DIR", "value": LOG_MOUNT},
        {"name": "LLMFLEET_STORE_URL", "value": store_url(isvc)},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    labels = {INFERENCESERVICE_LABEL: name, COMPONENT_LABEL: "featurestore"}
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": child_name(name, "features", limit=CRONJOB_NAME_LIMIT),
            "namespace": namespace,
            "labels": {**MANAGED_LABELS, **labels},
        },
        "spec": {
            "schedule": store.generation_schedule,
            # Generation is resumable; two at once would only race for the same rows.
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": {
                    "backoffLimit": 2,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "restartPolicy": "OnFailure",
                            "containers": [
                                {
                                    "name": "generate",
                                    "image": image,
                                    "command": args,
                                    "env": env,
                                    "resources": {
                                        "requests": {"cpu": "1", "memory": "2Gi"},
                                        "limits": {"memory": "4Gi"},
                                    },
                                    "volumeMounts": [{"name": "requests", "mountPath": LOG_MOUNT}],
                                }
                            ],
                            "volumes": [
                                {"name": "requests",
                                 "persistentVolumeClaim": {"claimName": request_log_claim(isvc)}}
                            ],
                        },
                    },
                },
            },
        },
    }
