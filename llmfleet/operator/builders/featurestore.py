"""The offline generation CronJob of an InferenceService (a pure builder: CR -> manifest dict).

`llmfleet.operator.builders.inferenceservice` adds the owner's labels and the owner reference.
The Job reads the router's request log from the `<isvc>-requests` PersistentVolumeClaim (the router writes
`requests.jsonl` there), and asks the primary pool's Service directly (not the router, whose log would count
the generation's own requests). Where it writes and the router reads is one value, given to both pods as
LLMFLEET_STORE_URL (`store_url_env`): from the Secret of `featureStore.urlSecretRef`, else the spec's
`featureStore.url`, else SQLite on that same volume, which both pods mount at LOG_MOUNT.
"""

from __future__ import annotations

from typing import Any

from llmfleet.api.contracts import (
    COMPONENT_LABEL,
    FEATURE_STORE_DB_FILE,
    INFERENCESERVICE_LABEL,
    MANAGED_LABELS,
    REPLICA_PORT,
    STORE_URL_ENV,
    child_name,
)
from llmfleet.api.inferenceservice import InferenceService
from llmfleet.operator.builders.security import restricted
from llmfleet.operator.config import POD_UID

LOG_MOUNT = "/var/lib/llmfleet"
LOG_FILE = "requests.jsonl"
# CronJob names are limited to 52 characters (the Job suffix takes the rest).
CRONJOB_NAME_LIMIT = 52


def store_url(isvc: InferenceService) -> str | None:
    """The feature store the router reads and the generation CronJob writes, when the spec holds its URL.

    `featureStore.url` when set (PostgreSQL for several nodes, no password: the API refuses one); else, without
    a urlSecretRef and with a generationSchedule, SQLite on the request-log claim that both pods mount at
    LOG_MOUNT (the URL store.db.default_url(LOG_MOUNT) gives). None otherwise (a Secret holds it, or none).
    """
    store = isvc.spec.feature_store
    if store is None or store.url_secret_ref is not None:
        return None
    if store.url:
        return store.url
    if store.generation_schedule:
        return f"sqlite:///{LOG_MOUNT}/{FEATURE_STORE_DB_FILE}"
    return None


def store_url_env(isvc: InferenceService) -> dict[str, Any] | None:
    """The STORE_URL_ENV variable of the pods that use the store: from the Secret (urlSecretRef), else the
    spec's URL; None when there is no store."""
    store = isvc.spec.feature_store
    if store is not None and (ref := store.url_secret_ref) is not None:
        return {"name": STORE_URL_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
    url = store_url(isvc)
    return {"name": STORE_URL_ENV, "value": url} if url else None


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


def build_generation_cronjob(isvc: InferenceService, image: str, user: int | None = POD_UID,
                             pull_secrets: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A batch/v1 CronJob running `llmfleet features generate` (its pod running as `user`, pulling its image with
    `pull_secrets`), or None without a generationSchedule."""
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
        *filter(None, [store_url_env(isvc)]),
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
                        "spec": restricted({
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
                        }, user=user, pull_secrets=pull_secrets),
                    },
                },
            },
        },
    }
