"""Storage locations -> pod pieces: volumes, mounts, fetch init containers and the environment that reaches them.

Every location field becomes a folder inside the pod under MOUNT_ROOT/<role> (role: model, data, teacher, ...):
- pvc://claim/path: the claim is a volume, mounted at that folder with subPath=path (read-only for inputs);
- s3:// and hf://: an init container runs `llmfleet fetch URI FOLDER` into the cache volume (an emptyDir, or
  spec.storage.cache.claim shared by the pods: each location gets its own folder there and is fetched once),
  which the main container then mounts read-only at the same folder;
- a local path is used in place (a folder baked into the image).
An s3:// output stays a URI: the trainer uploads its export there, with the same environment as a fetch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.api.storage import (
    HF_ENDPOINT_ENV,
    HF_TOKEN_KEY,
    S3_ADDRESSING_ENV,
    S3_ENDPOINT_ENV,
    S3_OPTIONAL_SECRET_KEYS,
    S3_REGION_ENV,
    S3_SECRET_KEYS,
    CacheSpec,
    StorageSpec,
    StorageUri,
    parse_uri,
)
from llmfleet.operator.builders.common import resource_requests
from llmfleet.operator.config import OperatorConfig
from llmfleet.storage.common import cache_key

MOUNT_ROOT = "/mnt/llmfleet"
CACHE_VOLUME = "cache"
FETCH_RESOURCES = resource_requests("500m", "1Gi", 0)


def fetch_image(config: OperatorConfig) -> str:
    """The image of the `llmfleet fetch` init containers: LLMFLEET_FETCH_IMAGE, else the training image (the one
    image that carries the storage extra, boto3 and huggingface_hub)."""
    return config.fetch_image or config.train_image


class StorageSpecError(ValueError):
    """A location the pod cannot reach; the message starts with the field path."""


def pod_folder(role: str) -> str:
    """Where the location of `role` appears inside the pod (also what the worker's resolved spec says)."""
    return f"{MOUNT_ROOT}/{role}"


def storage_env(storage: StorageSpec, uri: StorageUri) -> list[dict[str, Any]]:
    """Environment of a container that fetches from or uploads to `uri` (standard SDK variable names)."""
    env: list[dict[str, Any]] = []
    if uri.scheme == "s3":
        s3 = storage.s3
        if s3.endpoint:
            env.append({"name": S3_ENDPOINT_ENV, "value": s3.endpoint})
        if s3.region:
            env.append({"name": S3_REGION_ENV, "value": s3.region})
        if s3.addressing_style != "auto":
            env.append({"name": S3_ADDRESSING_ENV, "value": s3.addressing_style})
        if s3.credentials_secret:
            for key in S3_SECRET_KEYS:
                env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": s3.credentials_secret, "key": key}}})
            for key in S3_OPTIONAL_SECRET_KEYS:
                env.append({"name": key, "valueFrom": {"secretKeyRef": {
                    "name": s3.credentials_secret, "key": key, "optional": True}}})
    elif uri.scheme == "hf":
        hf = storage.hf
        if hf.endpoint:
            env.append({"name": HF_ENDPOINT_ENV, "value": hf.endpoint})
        if hf.token_secret:
            env.append({"name": HF_TOKEN_KEY, "valueFrom": {"secretKeyRef": {"name": hf.token_secret, "key": HF_TOKEN_KEY}}})
        env.append({"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"})
    return env


def _claim_volume_name(claim: str) -> str:
    return "pvc-" + hashlib.sha256(claim.encode()).hexdigest()[:10]


@dataclass
class PodStorage:
    """Collects what a pod needs for its locations; `add_*` return the folder the main container reads."""

    storage: StorageSpec
    image: str
    cache: CacheSpec | None = None  # overrides storage.cache (the router keeps its own small emptyDir)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)

    def _volume(self, volume: dict[str, Any]) -> None:
        if all(v["name"] != volume["name"] for v in self.volumes):
            self.volumes.append(volume)

    def _claim(self, claim: str, read_only: bool) -> str:
        name = _claim_volume_name(claim)
        existing = next((v for v in self.volumes if v["name"] == name), None)
        if existing is None:
            self.volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}})
        elif not read_only:
            existing["persistentVolumeClaim"]["readOnly"] = False  # one writable use makes the volume writable
        return name

    def _cache(self) -> tuple[str, CacheSpec]:
        cache = self.cache or self.storage.cache
        if cache.claim:
            self._volume({"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim}})
        else:
            self._volume({"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": cache.size_limit}})
        return CACHE_VOLUME, cache

    def add_input(self, field_path: str, role: str, raw: str, include: Sequence[str] = ()) -> str:
        """Make the location readable in the main container; returns its folder there."""
        uri = parse_uri(raw)
        folder = pod_folder(role)
        if uri.scheme == "local":
            return uri.path
        if uri.scheme == "tiny":
            raise StorageSpecError(f"{field_path}: tiny:// models exist only in the local runtime (llmfleet up); "
                                   "use pvc://, s3:// or hf:// on Kubernetes")
        if uri.scheme == "pvc":
            volume = self._claim(uri.location, read_only=True)
            self.mounts.append({"name": volume, "mountPath": folder, "subPath": uri.path, "readOnly": True}
                               if uri.path else {"name": volume, "mountPath": folder, "readOnly": True})
            return folder
        volume, cache = self._cache()
        sub = {"subPath": cache_key(uri)} if cache.claim else {"subPath": role}
        command = ["llmfleet", "fetch", str(uri), folder]
        for pattern in include:
            command += ["--include", pattern]
        self.init_containers.append({
            "name": f"fetch-{role}",
            "image": self.image,
            "command": command,
            "env": storage_env(self.storage, uri),
            "resources": FETCH_RESOURCES,
            "volumeMounts": [{"name": volume, "mountPath": folder, **sub}],
        })
        self.mounts.append({"name": volume, "mountPath": folder, **sub, "readOnly": True})
        return folder

    def add_output(self, role: str, raw: str) -> str:
        """Make the location writable by the main container; returns the folder or the URI it writes to."""
        uri = parse_uri(raw)
        if uri.scheme == "pvc":
            folder = pod_folder(role)
            volume = self._claim(uri.location, read_only=False)
            self.mounts.append({"name": volume, "mountPath": folder, **({"subPath": uri.path} if uri.path else {})})
            return folder
        if uri.scheme == "s3":
            self.env += [e for e in storage_env(self.storage, uri) if e not in self.env]
            return str(uri)
        return uri.path
