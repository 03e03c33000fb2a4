"""The names every llmfleet component agrees on: API group and version, ports, label and annotation keys.

The bottom floor of the package: the operator writes these names into manifests, the router, autoscaler,
workers and the local runtime read them back. Each is defined here once; everything else imports it.
This module imports nothing from llmfleet.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

# ---- API
GROUP = "llmfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
INFERENCESERVICE_PLURAL = "inferenceservices"
TRAININGJOB_PLURAL = "trainingjobs"
# Server-side apply field manager of everything the control plane writes.
FIELD_MANAGER = "llmfleet-operator"

# ---- ports
REPLICA_PORT = 8000  # a serving replica's OpenAI API (vLLM or the drain wrapper in front of it)
ROUTER_PORT = 8080  # the router's OpenAI API and /metrics
KV_EVENTS_PORT = 5557  # a vLLM replica's KV-cache event stream (ZMQ PUB, --kv-events-config); vLLM's own default
TRAINING_METRICS_PORT = 9400  # Prometheus /metrics and /status on every training rank
RENDEZVOUS_PORT = 29400  # torch elastic rendezvous of a TrainingJob
OPERATOR_METRICS_PORT = 8080  # the operator's /metrics
OPERATOR_LIVENESS_PORT = 8081  # the operator's /healthz

# ---- metrics
# Gauges llmfleet's serving wrapper adds to a replica's /metrics, read from the model folder's config.json (the
# router's and the autoscaler's pods do not have the folder): K and V bytes per token over all tensor-parallel
# ranks (the router sizes a host KV tier in blocks with it), and the model's planner shape, one sample per field
# with the field in label `dim` (the autoscaler seeds a pool that has no model preset from it).
KV_BYTES_PER_TOKEN_METRIC = "llmfleet:kv_cache_bytes_per_token"
MODEL_SHAPE_METRIC = "llmfleet:model_shape"
MODEL_SHAPE_DIM_LABEL = "dim"

# ---- files
# The SQLite file of the default feature store, in a run folder (local) or on the request-log volume (cluster).
FEATURE_STORE_DB_FILE = "featurestore.db"
# How text files a user hands in (serving traces, `llmfleet plan --prompts` lists) are read: UTF-8 whatever the
# locale, a leading byte-order mark skipped. Spreadsheet tools and pandas' "utf-8-sig" write one; read as text it
# renames a CSV's first column ("missing columns TIMESTAMP") and makes a JSONL's first line invalid.
INPUT_TEXT_ENCODING = "utf-8-sig"

# ---- environment
# The feature store's SQLAlchemy URL, where a URL with credentials travels: the router and the generation
# CronJob get it from spec.featureStore.urlSecretRef (valueFrom secretKeyRef), `llmfleet features` and the
# local runtime read it from the shell.
STORE_URL_ENV = "LLMFLEET_STORE_URL"

# ---- labels
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PART_OF_LABEL = "app.kubernetes.io/part-of"
# Recommended labels the chart puts on the operator's pods (and the Prometheus Operator on Prometheus'): the
# replicas' NetworkPolicy admits pods by them.
APP_NAME_LABEL = "app.kubernetes.io/name"
APP_COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_LABELS = {MANAGED_BY_LABEL: "llmfleet", PART_OF_LABEL: "llmfleet"}
INFERENCESERVICE_LABEL = f"{GROUP}/inferenceservice"
TRAININGJOB_LABEL = f"{GROUP}/trainingjob"
POOL_LABEL = f"{GROUP}/pool"
# Values: replica, router, featurestore (InferenceService children), worker (TrainingJob pods).
COMPONENT_LABEL = f"{GROUP}/component"
# On serving pods, "true"; the pool's Service selects on it and the Deployment's selector does not, so the
# autoscaler's scale-in sets "false" to take a pod out of the EndpointSlices (routers stop sending it new
# requests) while the ReplicaSet keeps it running until its in-flight requests are done.
SERVING_LABEL = f"{GROUP}/serving"
# On a pod the autoscaler is draining before it deletes it.
DRAINING_LABEL = f"{GROUP}/draining"

# Keys of other projects that llmfleet writes.
# NVIDIA device plugin's extended resources: whole GPUs, and MIG instances under the mixed strategy
# (nvidia.com/mig-3g.71gb); GPU nodes carry a NoSchedule taint of the whole-GPU key.
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# NVIDIA GPU feature discovery's node label: the driver's product name, spaces as dashes ("NVIDIA-H100-80GB-HBM3").
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# Kueue: the LocalQueue a TrainingJob's Job is admitted through.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# scheduler-plugins coscheduling: the PodGroup a training pod belongs to (gang scheduling).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

# ---- annotations
# The model path a pool's pods serve (on the Deployment and its pod template).
MODEL_ANNOTATION = f"{GROUP}/model"
# Hash of the router's ConfigMap on the router's pod template: a changed config rolls the router.
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# The attempt number on a TrainingJob's Job.
ATTEMPT_ANNOTATION = f"{GROUP}/attempt"
# On an InferenceService: a model promotion in progress (written by the TrainingJob reconcile, advanced by
# the InferenceService reconcile).
PROMOTION_ANNOTATION = f"{GROUP}/promotion"
# On an InferenceService: the autoscaler's persisted policy state (JSON).
AUTOSCALER_STATE_ANNOTATION = f"{GROUP}/autoscaler-state"
# On a TrainingJob the autoscaler suspended to free GPUs: who suspended it.
SUSPENDED_BY_ANNOTATION = f"{GROUP}/suspended-by"
# On an InferenceService: its priority when serving competes with training for GPUs.
SERVING_PRIORITY_ANNOTATION = f"{GROUP}/priority"
# On an InferenceService: the planner preset that seeds capacity, `<key>` or `<key>.<pool>`.
MODEL_PRESET_ANNOTATION = f"{GROUP}/model-preset"
# Kubernetes: the ReplicaSet removes the pod with the lowest cost first on scale-down.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


def prometheus_label(key: str) -> str:
    """A label key as Prometheus relabelling writes it: `llmfleet.io/pool` -> `llmfleet_io_pool`."""
    return key.replace(".", "_").replace("/", "_").replace("-", "_")


def pool_selector(service: str, pool: str) -> str:
    """Label selector of the pods of one pool of an InferenceService."""
    return f"{INFERENCESERVICE_LABEL}={service},{POOL_LABEL}={pool}"


def child_name(owner: str, suffix: str = "", limit: int = 63) -> str:
    """`<owner>-<suffix>`, shortened with a stable hash when longer than `limit` (DNS-1123 label)."""
    name = f"{owner}-{suffix}" if suffix else owner
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = limit - len(digest) - 1
    return f"{name[:keep].rstrip('-')}-{digest}"


def now_iso() -> str:
    """The current UTC time as Kubernetes writes timestamps (RFC 3339, seconds, `Z`)."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
