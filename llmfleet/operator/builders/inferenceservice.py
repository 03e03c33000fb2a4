"""InferenceService -> Kubernetes objects: per pool a Deployment, Service and PDB; the router; monitoring.

Pure: the same CR, config and promotion state always give the same manifests (no API calls, no clock).
"""

from __future__ import annotations

import hashlib
from typing import Any

from llmfleet.api import InferenceService, PoolView
from llmfleet.api.contracts import (
    COMPONENT_LABEL,
    CONFIG_HASH_ANNOTATION,
    INFERENCESERVICE_LABEL,
    KV_EVENTS_PORT,
    MODEL_ANNOTATION,
    POOL_LABEL,
    REPLICA_PORT,
    ROUTER_PORT,
    SERVING_LABEL,
    child_name,
)
from llmfleet.api.inferenceservice import ROUTER_SUFFIX
from llmfleet.api.loader import problems_line
from llmfleet.api.storage import CacheSpec
from llmfleet.operator.builders.common import (
    Manifest,
    metadata,
    node_placement,
    resource_requests,
    tolerations,
)
from llmfleet.operator.builders.featurestore import (
    LOG_FILE,
    LOG_MOUNT,
    build_generation_cronjob,
    build_request_log_claim,
    store_url,
    store_url_env,
)
from llmfleet.operator.builders.security import ENGINE_SCRATCH, restricted
from llmfleet.operator.builders.storage import PodStorage, StorageSpecError, fetch_image
from llmfleet.operator.config import OperatorConfig
from llmfleet.plan.pool_presets import model_preset_problems
from llmfleet.router.config import (
    DISCOVERY_RULES,
    ROUTER_CONFIG_DIR,
    ROUTER_CONFIG_KEY,
    ROUTER_MODEL_FILES,
    TENANTS_DIR,
    UPSTREAM_API_KEY_ENV,
    UPSTREAM_KEY_SECRET_KEY,
    router_config_from_service,
)
from llmfleet.workers.serve.vllm_args import (
    InvalidServeSpec,
    engine_env_defaults,
    model_location_field,
    serve_command,
)

# The router fetches only these files of each pool's model (tokenizer, chat template, shape): no weights.
ROUTER_CACHE = CacheSpec(size_limit="2Gi")


class ServiceSpecError(ValueError):
    """The spec passes the schema and pydantic but cannot be rendered; the message starts with the field path."""


def isvc_labels(isvc: InferenceService) -> dict[str, str]:
    return {INFERENCESERVICE_LABEL: isvc.metadata.name}


def pool_labels(isvc: InferenceService, pool: str) -> dict[str, str]:
    return {**isvc_labels(isvc), POOL_LABEL: pool, COMPONENT_LABEL: "replica"}


def router_labels(isvc: InferenceService) -> dict[str, str]:
    return {**isvc_labels(isvc), COMPONENT_LABEL: "router"}


def pool_name(isvc: InferenceService, pool: str) -> str:
    return child_name(isvc.metadata.name, pool)


def router_name(isvc: InferenceService) -> str:
    return child_name(isvc.metadata.name, ROUTER_SUFFIX)


def pool_selector(isvc: InferenceService, pool: str) -> str:
    """Label selector of a pool's pods (status.selector for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in pool_labels(isvc, pool).items())


def _serve_command(isvc: InferenceService, pool: PoolView, model_dir: str) -> list[str]:
    try:
        return serve_command(isvc, pool, port=REPLICA_PORT, model_dir=model_dir)
    except InvalidServeSpec as err:
        raise ServiceSpecError(str(err)) from None


def add_model(store: PodStorage, isvc: InferenceService, pool: PoolView, role: str, include: tuple[str, ...] = ()) -> str:
    try:
        return store.add_input(model_location_field(pool), role, pool.model.path, include)
    except StorageSpecError as err:
        raise ServiceSpecError(str(err)) from None


def _probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _secret_env(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": UPSTREAM_KEY_SECRET_KEY}}}


def build_pool_deployment(isvc: InferenceService, pool: PoolView, config: OperatorConfig) -> Manifest:
    labels = pool_labels(isvc, pool.name)
    key_secret = isvc.spec.router.upstream_key_secret
    gpus = pool.resources.gpus
    # The model: a pvc:// claim mounted read-only, or s3:// / hf:// fetched once into the cache volume.
    store = PodStorage(isvc.spec.storage, fetch_image(config))
    model_dir = add_model(store, isvc, pool, "model")
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}, *store.volumes]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, *store.mounts]
    container: dict[str, Any] = {
        "name": "engine",
        "image": isvc.spec.image or config.serve_image,
        "command": _serve_command(isvc, pool, model_dir),
        "ports": [
            {"name": "http", "containerPort": REPLICA_PORT, "protocol": "TCP"},
            *([{"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"}]
              if isvc.publishes_kv_events(pool) else []),
        ],
        "env": [
            {"name": "LLMFLEET_INFERENCESERVICE", "value": isvc.metadata.name},
            {"name": "LLMFLEET_POOL", "value": pool.name},
            # CPU pools: what `llmfleet up` sets too (vllm_args.CPU_ENGINE_ENV: replicas on one node otherwise spin
            # on each other's cores); the pool's vllm.env wins over these defaults.
            *({"name": k, "value": v} for k, v in {"VLLM_NO_USAGE_STATS": "1", "NCCL_NVLS_ENABLE": "0",
                                                   **engine_env_defaults(isvc, pool), **pool.vllm.env}.items()),
            # vLLM's --api-key, from the environment so the key stays out of the pod spec and `ps`: /v1 requests
            # without it get 401 (/health and /metrics stay open for probes and scrapers).
            *([_secret_env("VLLM_API_KEY", key_secret)] if key_secret else []),
        ],
        "resources": resource_requests(pool.resources.cpu, pool.resources.memory, gpus, pool.resources.mig_profile),
        # Model loading can take minutes: the startup probe holds liveness off until /health answers.
        "startupProbe": _probe("/health", "http", 10, 180),
        "readinessProbe": _probe("/health", "http", 5, 3),
        "livenessProbe": _probe("/health", "http", 15, 4),
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        **({"initContainers": store.init_containers} if store.init_containers else {}),
        "containers": [container],
        "volumes": volumes,
        # The serving wrapper drains in-flight requests for drainSeconds after SIGTERM.
        "terminationGracePeriodSeconds": isvc.spec.drain_seconds + 15,
        "enableServiceLinks": False,
    }
    pod_spec |= node_placement(pool.resources.gpu_type, pool.resources.node_selector) | priority(isvc)
    if tol := tolerations(gpus, pool.resources.tolerations):
        pod_spec["tolerations"] = tol
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(isvc, pool_name(isvc, pool.name), labels, {MODEL_ANNOTATION: pool.model.path}),
        "spec": {
            "replicas": pool.replicas,
            "selector": {"matchLabels": labels},
            # One replica at a time, never below the desired count: model rollouts are gradual.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                # The serving label is outside the Deployment selector: the autoscaler flips it to "false" to
                # take a chosen replica out of the Service (drain) before removing it.
                "metadata": {"labels": {**labels, SERVING_LABEL: "true"}, "annotations": {MODEL_ANNOTATION: pool.model.path}},
                "spec": restricted(pod_spec, ENGINE_SCRATCH, config.pod_user, config.image_pull_secrets),
            },
        },
    }


def build_pool_service(isvc: InferenceService, pool: PoolView) -> Manifest:
    labels = pool_labels(isvc, pool.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, pool_name(isvc, pool.name), labels),
        "spec": {
            "selector": {**labels, SERVING_LABEL: "true"},
            "ports": [{"name": "http", "port": REPLICA_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pool_pdb(isvc: InferenceService, pool: PoolView) -> Manifest:
    labels = pool_labels(isvc, pool.name)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, pool_name(isvc, pool.name), labels),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }


def _request_log_claim(isvc: InferenceService) -> tuple[Manifest, str, str] | None:
    """(claim, mount folder, log file) of the request log the router writes and the generation CronJob reads."""
    claim = build_request_log_claim(isvc)
    if claim is None:
        return None
    return claim, LOG_MOUNT, f"{LOG_MOUNT}/{LOG_FILE}"


def router_config_yaml(
    isvc: InferenceService, request_log: str | None = None, model_folders: dict[str, str] | None = None
) -> str:
    cfg = router_config_from_service(isvc, model_folders=model_folders)
    if request_log:
        cfg = cfg.model_copy(update={"request_log": request_log})
    # The store the generation CronJob writes (store_url), never a file inside the router's own container; a
    # URL kept in a Secret reaches the router as STORE_URL_ENV (url_env), never this ConfigMap.
    url = store_url(isvc)
    if cfg.feature_store.enabled and url is None and cfg.feature_store.url_env is None:
        raise ServiceSpecError(
            "spec.router.featureStoreLookup: the router would look up an empty store of its own; set "
            "spec.featureStore.url or urlSecretRef (PostgreSQL) or spec.featureStore.generationSchedule (SQLite on "
            "the shared request-log volume)"
        )
    return cfg.model_copy(update={"feature_store": cfg.feature_store.model_copy(update={"url": url})}).to_yaml()


def build_replica_network_policy(isvc: InferenceService, config: OperatorConfig) -> Manifest:
    """Ingress to every replica pod of `isvc` from its router only, plus the operator and the metrics scraper
    (config.replica_ingress_from). All ports: the router also subscribes to the replicas' KV-cache events."""
    replicas = {**isvc_labels(isvc), COMPONENT_LABEL: "replica"}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(isvc, child_name(isvc.metadata.name, "replicas"), replicas),
        "spec": {
            "podSelector": {"matchLabels": replicas},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": router_labels(isvc)}},
                                  # the feature store's generation Job asks the primary pool directly
                                  {"podSelector": {"matchLabels": {**isvc_labels(isvc), COMPONENT_LABEL: "featurestore"}}},
                                  *config.replica_ingress_from]}],
        },
    }


def priority(isvc: InferenceService) -> dict[str, str]:
    """The serving pods' priorityClassName, when the spec names one."""
    return {"priorityClassName": isvc.spec.priority_class_name} if isvc.spec.priority_class_name else {}


def build_router(isvc: InferenceService, config: OperatorConfig) -> list[Manifest]:
    """ConfigMap, ServiceAccount + Role for EndpointSlice discovery, Deployment and Service of the router."""
    name = router_name(isvc)
    labels = router_labels(isvc)
    # Each pool's tokenizer and chat template, so prefix keys are the engine's token blocks.
    store = PodStorage(isvc.spec.storage, fetch_image(config), cache=ROUTER_CACHE)
    folders = {pool.name: add_model(store, isvc, pool, f"model-{pool.name}", ROUTER_MODEL_FILES) for pool in isvc.pools()}
    # With offline generation on, the router logs requests where the generation CronJob reads them.
    request_log = _request_log_claim(isvc)
    config_yaml = router_config_yaml(isvc, request_log[2] if request_log else None, folders)
    digest = hashlib.sha256(config_yaml.encode()).hexdigest()[:16]
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(isvc, name, labels),
        "data": {ROUTER_CONFIG_KEY: config_yaml},
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(isvc, name, labels)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(isvc, name, labels),
        "rules": [{k: list(v) for k, v in rule.items()} for rule in DISCOVERY_RULES],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(isvc, name, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": isvc.metadata.namespace or "default"}],
    }
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": name}}]
    mounts: list[dict[str, Any]] = [{"name": "config", "mountPath": ROUTER_CONFIG_DIR, "readOnly": True}]
    if secret := isvc.spec.router.api_keys_secret:
        volumes.append({"name": "tenants", "secret": {"secretName": secret}})
        mounts.append({"name": "tenants", "mountPath": TENANTS_DIR, "readOnly": True})
    if request_log is not None:
        claim_name = request_log[0]["metadata"]["name"]
        volumes.append({"name": "requests", "persistentVolumeClaim": {"claimName": claim_name}})
        mounts.append({"name": "requests", "mountPath": request_log[1]})
    volumes += store.volumes
    mounts += store.mounts
    container = {
        "name": "router",
        "image": config.router_image,
        "command": [
            "llmfleet", "router", "--config", f"{ROUTER_CONFIG_DIR}/{ROUTER_CONFIG_KEY}", "--port", str(ROUTER_PORT),
        ],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        # Only the router's pods read the replicas' key; clients never see it. The store's URL from its Secret.
        "env": [
            *([_secret_env(UPSTREAM_API_KEY_ENV, isvc.spec.router.upstream_key_secret)]
              if isvc.spec.router.upstream_key_secret else []),
            *([env] if (env := store_url_env(isvc)) and "valueFrom" in env else []),
        ],
        "resources": resource_requests("1", "1Gi", 0),
        "readinessProbe": _probe("/health", "http", 5, 3),
        "livenessProbe": _probe("/health", "http", 10, 3),
        "volumeMounts": mounts,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(isvc, name, labels),
        "spec": {
            "replicas": isvc.spec.router.replicas,
            "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                # The config hash restarts the router when its ConfigMap changes.
                "metadata": {"labels": labels, "annotations": {CONFIG_HASH_ANNOTATION: digest}},
                "spec": restricted({
                    "serviceAccountName": name,
                    **({"initContainers": store.init_containers} if store.init_containers else {}),
                    "containers": [container],
                    "volumes": volumes,
                    "terminationGracePeriodSeconds": int(isvc.spec.router.request_timeout_seconds) + 5,
                    "enableServiceLinks": False,
                    **priority(isvc),
                }, user=config.pod_user, pull_secrets=config.image_pull_secrets),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, name, labels),
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    owned_claim = []
    if request_log is not None:
        claim = request_log[0]
        owned_claim = [{**claim, "metadata": metadata(isvc, claim["metadata"]["name"], labels)}]
    return [*owned_claim, configmap, account, role, binding, deployment, service]


def build_pod_monitor(isvc: InferenceService) -> Manifest:
    labels = isvc_labels(isvc)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(isvc, isvc.metadata.name, labels),
        "spec": {
            "selector": {"matchLabels": labels},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def build_feature_store_job(isvc: InferenceService, config: OperatorConfig) -> Manifest | None:
    """The store's offline generation CronJob, or None without a generationSchedule."""
    manifest = build_generation_cronjob(isvc, config.router_image, config.pod_user, config.image_pull_secrets)
    if manifest is None:
        return None
    meta = manifest.setdefault("metadata", {})
    meta.setdefault("namespace", isvc.metadata.namespace or "default")
    meta["labels"] = {**meta.get("labels", {}), **isvc_labels(isvc), COMPONENT_LABEL: "featurestore"}
    meta["ownerReferences"] = metadata(isvc, "x", {})["ownerReferences"]
    if secret := isvc.spec.router.upstream_key_secret:
        # The generation Job asks the primary pool directly: it needs the replicas' key too (read by
        # `llmfleet features generate` from OPENAI_API_KEY, its --api-key-env default).
        pod = manifest["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        for container in pod["containers"]:
            container["env"] = [*container.get("env", []), _secret_env("OPENAI_API_KEY", secret)]
    return manifest


def build_inferenceservice(isvc: InferenceService, config: OperatorConfig) -> list[Manifest]:
    """Every child of `isvc`, in apply order (config before the pods that read it)."""
    if problems := model_preset_problems(isvc):
        raise ServiceSpecError(problems_line(problems))
    out: list[Manifest] = []
    for pool in isvc.pools():
        out += [build_pool_deployment(isvc, pool, config), build_pool_service(isvc, pool), build_pool_pdb(isvc, pool)]
    out += build_router(isvc, config)
    if isvc.spec.router.isolate_pools:
        out.append(build_replica_network_policy(isvc, config))
    if config.capabilities.pod_monitor:
        out.append(build_pod_monitor(isvc))
    if (job := build_feature_store_job(isvc, config)) is not None:
        out.append(job)
    return out
