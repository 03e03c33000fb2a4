"""TrainingJob -> Kubernetes objects: spec ConfigMap, headless rendezvous Service, Indexed Job, gang scheduling.

Pure: the same CR, config and attempt number always give the same manifests.
"""

from __future__ import annotations

from typing import Any

from llmfleet.api import TrainingJob, TrainingJobSpec
from llmfleet.api.contracts import (
    ATTEMPT_ANNOTATION,
    COMPONENT_LABEL,
    KUEUE_QUEUE_LABEL,
    POD_GROUP_LABEL,
    RENDEZVOUS_PORT,
    TRAININGJOB_LABEL,
    child_name,
)
from llmfleet.api.loader import dump_yaml
from llmfleet.operator.builders.common import (
    Manifest,
    metadata,
    node_placement,
    resource_requests,
    tolerations,
)
from llmfleet.operator.builders.security import ENGINE_SCRATCH, restricted
from llmfleet.operator.builders.storage import PodStorage, fetch_image
from llmfleet.operator.config import OperatorConfig
from llmfleet.workers.train.graceful import GRACE_ENV

SPEC_DIR = "/etc/llmfleet"
SPEC_KEY = "job.yaml"


def tj_labels(tj: TrainingJob) -> dict[str, str]:
    return {TRAININGJOB_LABEL: tj.metadata.name, COMPONENT_LABEL: "worker"}


def service_name(tj: TrainingJob) -> str:
    return child_name(tj.metadata.name, "", limit=50)


def spec_configmap_name(tj: TrainingJob) -> str:
    return child_name(tj.metadata.name, "spec")


def job_name(tj: TrainingJob, attempt: int) -> str:
    # Pod hostnames are `<job>-<index>` and must stay a DNS label: keep room for the index.
    return child_name(tj.metadata.name, f"r{attempt}", limit=52)


def rank0_host(tj: TrainingJob, attempt: int) -> str:
    """Stable DNS name of rank 0 (Indexed Job pod hostname under the headless Service's subdomain)."""
    return f"{job_name(tj, attempt)}-0.{service_name(tj)}"


def uses_kueue(tj: TrainingJob) -> bool:
    return tj.spec.scheduling.queue is not None


def uses_pod_group(tj: TrainingJob, config: OperatorConfig) -> bool:
    s = tj.spec.scheduling
    return s.gang and s.queue is None and tj.spec.workers.count > 1 and config.capabilities.pod_group


def worker_storage(tj: TrainingJob, config: OperatorConfig) -> tuple[PodStorage, TrainingJobSpec]:
    """The workers' storage (volumes, fetch init containers, upload environment) and the spec they read.

    In that spec every input location (data, tokenizer, teacher) is the folder it has inside the pod, and the
    output is a mounted folder (pvc://) or the s3:// URI the trainer uploads its export to.
    """
    spec = tj.spec
    store = PodStorage(spec.storage, fetch_image(config))
    data = spec.data.model_copy(update={
        "path": store.add_input("spec.data.path", "data", spec.data.path),
        "tokenizer": store.add_input("spec.data.tokenizer", "tokenizer", spec.data.tokenizer)
        if spec.data.tokenizer else None,
    })
    update: dict[str, Any] = {"data": data}
    if spec.distillation is not None:
        teacher = store.add_input("spec.distillation.teacher", "teacher", spec.distillation.teacher)
        update["distillation"] = spec.distillation.model_copy(update={"teacher": teacher})
    if spec.output is not None:
        update["output"] = spec.output.model_copy(update={"path": store.add_output("output", spec.output.path)})
    return store, spec.model_copy(update=update)


def build_spec_configmap(tj: TrainingJob, worker_spec: TrainingJobSpec | None = None) -> Manifest:
    """The spec the workers read: `worker_spec` (locations resolved to pod folders), else the CR's."""
    doc = {
        "apiVersion": tj.api_version,
        "kind": tj.kind,
        "metadata": {"name": tj.metadata.name, "namespace": tj.metadata.namespace or "default"},
        "spec": (worker_spec or tj.spec).to_wire(),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(tj, spec_configmap_name(tj), tj_labels(tj)),
        "data": {SPEC_KEY: dump_yaml(doc)},
    }


def build_headless_service(tj: TrainingJob) -> Manifest:
    labels = tj_labels(tj)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(tj, service_name(tj), labels),
        "spec": {
            "clusterIP": "None",
            # Rendezvous needs DNS for pods before they are ready.
            "publishNotReadyAddresses": True,
            "selector": labels,
            "ports": [
                {"name": "rdzv", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"},
                {"name": "metrics", "port": tj.spec.metrics.port, "targetPort": tj.spec.metrics.port, "protocol": "TCP"},
            ],
        },
    }


def worker_command(tj: TrainingJob, attempt: int) -> list[str]:
    w = tj.spec.workers
    return [
        "torchrun",
        f"--nnodes={w.count}",
        f"--nproc-per-node={max(1, w.gpus_per_worker)}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rank0_host(tj, attempt)}:{RENDEZVOUS_PORT}",
        f"--rdzv-id={job_name(tj, attempt)}",
        # The operator restarts the whole gang from the last checkpoint; torchrun must not restart alone.
        "--max-restarts=0",
        "-m", "llmfleet.workers.train",
        "--spec", f"{SPEC_DIR}/{SPEC_KEY}",
    ]


# Pod grace on SIGTERM (suspend, preemption): the workers finish their step and flush a checkpoint. torchrun
# SIGKILLs its workers 30 s after forwarding the signal, so their budget is min(this, 30 s); the rest covers
# torchrun's own shutdown.
STOP_GRACE_S = 120


def worker_env(tj: TrainingJob, attempt: int) -> list[dict[str, Any]]:
    # No resume variable: every attempt resumes from the newest complete checkpoint under checkpoint.uri, which
    # is never older than status.lastCheckpoint (a flush on SIGTERM can land after the operator's last read).
    env: list[dict[str, Any]] = [
        {"name": "LLMFLEET_TRAININGJOB", "value": tj.metadata.name},
        {"name": "LLMFLEET_ATTEMPT", "value": str(attempt)},
        {"name": GRACE_ENV, "value": str(STOP_GRACE_S)},
        {"name": "NCCL_NVLS_ENABLE", "value": "0"},
        {"name": "NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"name": "OMP_NUM_THREADS", "value": "1"},
    ]
    return env


def build_job(
    tj: TrainingJob,
    config: OperatorConfig,
    attempt: int,
    created: bool = False,
    store: PodStorage | None = None,
) -> Manifest:
    """The Indexed Job of one attempt. `created`: the Job exists already (Kueue now owns `suspend`)."""
    store = store or worker_storage(tj, config)[0]
    w = tj.spec.workers
    labels = tj_labels(tj)
    gpus = w.gpus_per_worker
    ckpt = tj.spec.checkpoint
    ckpt_volume: dict[str, Any] = (
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": ckpt.pvc}}
        if ckpt.pvc
        else {"name": "checkpoints", "emptyDir": {}}
    )
    container: dict[str, Any] = {
        "name": "worker",
        "image": w.image or config.train_image,
        "command": worker_command(tj, attempt),
        "env": worker_env(tj, attempt) + store.env,
        "ports": [
            {"name": "rdzv", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": tj.spec.metrics.port, "protocol": "TCP"},
        ],
        "resources": resource_requests(w.cpu, w.memory, gpus),
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "checkpoints", "mountPath": ckpt.uri},
            {"name": "dshm", "mountPath": "/dev/shm"},
            *store.mounts,
        ],
    }
    pod_labels = dict(labels)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": service_name(tj),
        **({"initContainers": store.init_containers} if store.init_containers else {}),
        "containers": [container],
        "volumes": [
            {"name": "spec", "configMap": {"name": spec_configmap_name(tj)}},
            ckpt_volume,
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            *store.volumes,
        ],
        "terminationGracePeriodSeconds": STOP_GRACE_S,
        "enableServiceLinks": False,
    }
    if tj.spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = tj.spec.scheduling.priority_class_name
    pod_spec |= node_placement(w.gpu_type, w.node_selector)
    if tol := tolerations(gpus, w.tolerations):
        pod_spec["tolerations"] = tol
    if uses_pod_group(tj, config):
        pod_labels[POD_GROUP_LABEL] = service_name(tj)
        pod_spec["schedulerName"] = config.gang_scheduler_name
    meta_labels = dict(labels)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": w.count,
        "parallelism": w.count,
        # Any worker failure fails the attempt; the operator recreates the gang (maxRestarts).
        "backoffLimit": 0,
        "template": {"metadata": {"labels": pod_labels},
                     "spec": restricted(pod_spec, ENGINE_SCRATCH, config.pod_user, config.image_pull_secrets)},
    }
    if uses_kueue(tj):
        queue = tj.spec.scheduling.queue
        if queue is not None:
            meta_labels[KUEUE_QUEUE_LABEL] = queue
        # Created suspended; Kueue unsuspends on admission. Once it exists, leave `suspend` to Kueue
        # unless the user suspends (then we own it again and Kueue keeps it suspended).
        if tj.spec.suspend or not created:
            job_spec["suspend"] = True
    else:
        job_spec["suspend"] = tj.spec.suspend
    manifest: Manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(tj, job_name(tj, attempt), meta_labels, {ATTEMPT_ANNOTATION: str(attempt)}),
        "spec": job_spec,
    }
    return manifest


def build_pod_group(tj: TrainingJob) -> Manifest:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": metadata(tj, service_name(tj), tj_labels(tj)),
        "spec": {"minMember": tj.spec.workers.count, "scheduleTimeoutSeconds": 600},
    }


def build_worker_pod_monitor(tj: TrainingJob) -> Manifest:
    labels = tj_labels(tj)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(tj, service_name(tj), labels),
        "spec": {
            "selector": {"matchLabels": labels},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def build_trainingjob(
    tj: TrainingJob,
    config: OperatorConfig,
    attempt: int = 0,
    job_created: bool = False,
) -> list[Manifest]:
    """Every child of `tj` for the given attempt, in apply order."""
    store, worker_spec = worker_storage(tj, config)
    out = [build_spec_configmap(tj, worker_spec), build_headless_service(tj)]
    if uses_pod_group(tj, config):
        out.append(build_pod_group(tj))
    if config.capabilities.pod_monitor:
        out.append(build_worker_pod_monitor(tj))
    out.append(build_job(tj, config, attempt, created=job_created, store=store))
    return out
