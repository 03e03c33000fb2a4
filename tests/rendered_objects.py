"""Every object llmfleet puts into a cluster, for tests that check them all (Pod Security, no credentials):
the builders' children of each example and of specs that turn on every optional piece (fetch init containers
with S3 and Hugging Face credentials, the feature store's CronJob, tenant and upstream keys, LoRA, Kueue,
gang scheduling, PodMonitors), and `helm template` of the chart with its defaults and every ci values file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from llmfleet.api import InferenceService, TrainingJob, load_file
from llmfleet.operator.builders import build_inferenceservice, build_trainingjob
from llmfleet.operator.config import Capabilities, OperatorConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG = OperatorConfig(capabilities=Capabilities(pod_group=True, pod_monitor=True), fetch_image="fetch:test")

_META = {"namespace": "ml", "uid": "uid-1"}

KITCHEN_SINK_ISVC: dict[str, Any] = {
    "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
    "metadata": {"name": "sink", **_META},
    "spec": {
        "model": {"path": "s3://models/llama-8b", "servedName": "llama"},
        "replicas": 2, "maxReplicas": 4,
        "resources": {"gpus": 1, "gpuType": "H200", "cpu": "8", "memory": "64Gi"},
        "storage": {"s3": {"endpoint": "http://minio.storage.svc:9000", "region": "eu-1",
                           "credentialsSecret": "s3-creds", "addressingStyle": "path"},
                    "hf": {"tokenSecret": "hf-token"}},
        "router": {"apiKeysSecret": "tenant-keys", "upstreamKeySecret": "upstream-key", "featureStoreLookup": True},
        "fallback": {"pools": [{"name": "student", "model": {"path": "hf://org/student@main"}, "replicas": 1,
                                "resources": {"gpus": 1, "cpu": "4", "memory": "32Gi"}}]},
        "featureStore": {"urlSecretRef": {"name": "store-url", "key": "url"}, "generationSchedule": "0 3 * * *"},
    },
}
KITCHEN_SINK_TJ: dict[str, Any] = {
    "apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob",
    "metadata": {"name": "sink-train", **_META},
    "spec": {
        "model": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 256},
        "data": {"path": "s3://data/tokens", "tokenizer": "hf://org/tok"},
        "optimization": {"globalBatchTokens": 2048, "microBatch": 1, "steps": 10},
        "workers": {"count": 2, "gpusPerWorker": 4, "gpuType": "H200"},
        "checkpoint": {"uri": "/checkpoints", "pvc": "ckpt", "interval": 5},
        "storage": {"s3": {"credentialsSecret": "s3-creds"}, "hf": {"tokenSecret": "hf-token"}},
        "output": {"path": "s3://models/out"},
    },
}


def builder_objects(config: OperatorConfig = CONFIG) -> list[tuple[str, dict[str, Any]]]:
    """(source, object) of every child the builders render for the examples and the kitchen-sink specs."""
    resources: list[tuple[str, InferenceService | TrainingJob]] = [
        (p.name, r) for p in sorted(ROOT.glob("examples/*.yaml")) for r in load_file(p)
    ]
    resources += [("kitchen-sink", InferenceService.model_validate(copy.deepcopy(KITCHEN_SINK_ISVC))),
                  ("kitchen-sink", TrainingJob.model_validate(copy.deepcopy(KITCHEN_SINK_TJ)))]
    gang = copy.deepcopy(KITCHEN_SINK_TJ)
    gang["metadata"]["name"] = "queued"
    gang["spec"]["scheduling"] = {"queue": "team-a", "priorityClassName": "batch"}
    resources.append(("kitchen-sink-kueue", TrainingJob.model_validate(gang)))
    out: list[tuple[str, dict[str, Any]]] = []
    for source, resource in resources:
        cr = resource.model_copy(deep=True)
        cr.metadata.uid = cr.metadata.uid or "uid-example"
        children = build_inferenceservice(cr, config) if isinstance(cr, InferenceService) else build_trainingjob(cr, config)
        out += [(source, m) for m in children]
    return out


def chart_objects() -> list[tuple[str, dict[str, Any]]]:
    """(values file, object) of `helm template` with the defaults and every charts/llmfleet/ci values file."""
    from helmchart import CHART, render

    out = [("default values", d) for d in render()]
    for values in sorted((CHART / "ci").glob("*.yaml")):
        out += [(values.name, d) for d in render("-f", str(values))]
    return out


def dump(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=True)
