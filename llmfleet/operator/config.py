"""Operator settings: images and endpoints from the environment, fixed names shared by builders and handlers."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmfleet.api.common import DNS_SUBDOMAIN_PATTERN
from llmfleet.api.contracts import APP_COMPONENT_LABEL, APP_NAME_LABEL

DEFAULT_ROUTER_IMAGE = "ghcr.io/llmfleet/llmfleet:0.1.0"
DEFAULT_SERVE_IMAGE = "ghcr.io/llmfleet/llmfleet-serve:0.1.0"
DEFAULT_TRAIN_IMAGE = "ghcr.io/llmfleet/llmfleet-train:0.1.0"
# How the operator reaches rank 0's /status: {pod} {service} {namespace} {port} {name} are filled in.
DEFAULT_STATUS_URL = "http://{pod}.{service}.{namespace}.svc:{port}/status"
# Who besides the router may reach replica pods (NetworkPolicy peers): the operator itself (drain checks and
# the autoscaler's direct scrapes: the chart's operator pod labels) and Prometheus (the Prometheus Operator's
# pod label), in any namespace. The chart sets LLMFLEET_REPLICA_INGRESS_FROM (a JSON list of peers).
DEFAULT_REPLICA_INGRESS_FROM: tuple[dict[str, Any], ...] = (
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {APP_NAME_LABEL: "llmfleet", APP_COMPONENT_LABEL: "operator"}}},
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {APP_NAME_LABEL: "prometheus"}}},
)

# The user and group of the pods the operator creates: the llmfleet images' user (docker/*.Dockerfile: ARG
# UID=10001). LLMFLEET_POD_USER=image leaves them to the image or the platform (OpenShift assigns a UID from the
# namespace's range and refuses pods that name another).
POD_UID = 10001


def _env_pod_user(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return POD_UID
    if raw == "image":
        return None
    try:
        uid = int(raw)
    except ValueError:
        uid = -1
    if uid < 1:
        raise ValueError(f"LLMFLEET_POD_USER must be a user id >= 1 (not root) or 'image', got {raw!r}")
    return uid


def _env_pull_secrets(raw: str | None) -> tuple[str, ...]:
    """LLMFLEET_IMAGE_PULL_SECRETS: Secret names, comma-separated (the chart's workloads.imagePullSecrets)."""
    names = tuple(n.strip() for n in (raw or "").split(",") if n.strip())
    bad = [n for n in names if len(n) > 253 or not re.fullmatch(DNS_SUBDOMAIN_PATTERN, n)]
    if bad:
        raise ValueError(f"LLMFLEET_IMAGE_PULL_SECRETS: {bad[0]!r} is not a Secret name")
    return names


# `llmfleet operator --priority` range: with the identity tie-break in the low 32 bits (run.kopf_priority), kopf's
# peering priority stays a signed 64-bit integer, what the API server keeps of a JSON integer.
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


@dataclass(frozen=True)
class Capabilities:
    """Optional APIs found in the cluster at start-up; builders emit their objects only when present."""

    pod_group: bool = False  # scheduling.x-k8s.io/v1alpha1 PodGroup (scheduler-plugins coscheduling)
    pod_monitor: bool = False  # monitoring.coreos.com/v1 PodMonitor (Prometheus Operator)


@dataclass(frozen=True)
class OperatorConfig:
    """Everything builders and handlers read besides the CR itself."""

    router_image: str = DEFAULT_ROUTER_IMAGE
    serve_image: str = DEFAULT_SERVE_IMAGE
    train_image: str = DEFAULT_TRAIN_IMAGE
    # Image of the `llmfleet fetch` init containers (needs the storage extra); the training image when unset.
    fetch_image: str | None = None
    status_url_template: str = DEFAULT_STATUS_URL
    status_timeout_seconds: float = 2.0
    timer_interval_seconds: float = 30.0
    gang_scheduler_name: str = "scheduler-plugins-scheduler"
    capabilities: Capabilities = field(default_factory=Capabilities)
    # Cluster-wide defaults for InferenceService spec sections (Helm `defaults:`), filled in under the CR's
    # own values: {"router": {...}, "autoscaling": {...}}.
    spec_defaults: Mapping[str, Any] = field(default_factory=dict)
    # NetworkPolicy peers admitted to replica pods besides the service's own router.
    replica_ingress_from: tuple[dict[str, Any], ...] = DEFAULT_REPLICA_INGRESS_FROM
    # runAsUser/runAsGroup/fsGroup of the pods the operator creates; None: the image's or the platform's.
    pod_user: int | None = POD_UID
    # Secrets (in each CR's namespace) that pull the images of the pods the operator creates.
    image_pull_secrets: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, capabilities: Capabilities | None = None) -> OperatorConfig:
        env = os.environ
        return cls(
            router_image=env.get("LLMFLEET_ROUTER_IMAGE") or DEFAULT_ROUTER_IMAGE,
            serve_image=env.get("LLMFLEET_SERVE_IMAGE") or DEFAULT_SERVE_IMAGE,
            train_image=env.get("LLMFLEET_TRAIN_IMAGE") or DEFAULT_TRAIN_IMAGE,
            fetch_image=env.get("LLMFLEET_FETCH_IMAGE") or None,
            status_url_template=env.get("LLMFLEET_TRAIN_STATUS_URL") or DEFAULT_STATUS_URL,
            status_timeout_seconds=_env_float("LLMFLEET_TRAIN_STATUS_TIMEOUT", 2.0),
            timer_interval_seconds=_env_float("LLMFLEET_RECONCILE_INTERVAL", 30.0),
            gang_scheduler_name=env.get("LLMFLEET_GANG_SCHEDULER") or "scheduler-plugins-scheduler",
            capabilities=capabilities or Capabilities(),
            spec_defaults=load_spec_defaults(env.get("LLMFLEET_DEFAULTS_FILE")),
            replica_ingress_from=load_peers(env.get("LLMFLEET_REPLICA_INGRESS_FROM")),
            pod_user=_env_pod_user(env.get("LLMFLEET_POD_USER")),
            image_pull_secrets=_env_pull_secrets(env.get("LLMFLEET_IMAGE_PULL_SECRETS")),
        )


def load_peers(raw: str | None) -> tuple[dict[str, Any], ...]:
    """NetworkPolicy peers from JSON (a list of objects); unset or empty = the defaults."""
    if not raw:
        return DEFAULT_REPLICA_INGRESS_FROM
    try:
        peers = json.loads(raw)
    except ValueError as err:
        raise ValueError(f"LLMFLEET_REPLICA_INGRESS_FROM: not JSON: {err}") from None
    if not isinstance(peers, list) or not all(isinstance(p, dict) for p in peers):
        raise ValueError("LLMFLEET_REPLICA_INGRESS_FROM: expected a JSON list of NetworkPolicy peers")
    return tuple(peers)


# Sections of InferenceService.spec that cluster-wide defaults may fill.
DEFAULTABLE_SECTIONS = ("router", "autoscaling")


def load_spec_defaults(path: str | None) -> dict[str, Any]:
    """Read the defaults file (YAML, CRD field names); a missing path means no defaults."""
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"LLMFLEET_DEFAULTS_FILE {path}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"LLMFLEET_DEFAULTS_FILE {path}: expected a mapping of spec sections")
    unknown = sorted(set(data) - set(DEFAULTABLE_SECTIONS))
    if unknown:
        raise ValueError(f"LLMFLEET_DEFAULTS_FILE {path}: unknown sections {unknown}; allowed {list(DEFAULTABLE_SECTIONS)}")
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def with_spec_defaults(spec: Any, defaults: Mapping[str, Any]) -> Any:
    """The spec with each defaultable section's missing keys taken from the defaults (the CR always wins).

    A spec that is not a mapping is returned as it is: validation then reports it (spec: ...) as a condition."""
    if spec is not None and not isinstance(spec, Mapping):
        return spec
    out = dict(spec or {})
    for section, values in defaults.items():
        own = out.get(section)
        if own is None or isinstance(own, dict):
            out[section] = {**values, **(own or {})}
    return out
