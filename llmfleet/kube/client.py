"""A small async Kubernetes client (aiohttp) for what the control plane does besides watching: server-side apply,
get, merge-patch and delete of children, and API discovery. Shares the operator's kopf credentials.

Time spent waiting for the API server is accumulated per task (see `api_seconds`) so reconcile timings can
exclude round trips.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from llmfleet.api.contracts import API_VERSION, FIELD_MANAGER, INFERENCESERVICE_PLURAL, TRAININGJOB_PLURAL

# (apiVersion, kind) -> (plural, namespaced) for every kind the operator touches.
RESOURCES: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Service"): ("services", True),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "Pod"): ("pods", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    ("v1", "Namespace"): ("namespaces", False),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("batch/v1", "CronJob"): ("cronjobs", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networkpolicies", True),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): ("podgroups", True),
    ("monitoring.coreos.com/v1", "PodMonitor"): ("podmonitors", True),
    (API_VERSION, "InferenceService"): (INFERENCESERVICE_PLURAL, True),
    (API_VERSION, "TrainingJob"): (TRAININGJOB_PLURAL, True),
}

_API_SECONDS: contextvars.ContextVar[ApiTimer | None] = contextvars.ContextVar("api_seconds", default=None)


class ApiTimer:
    """Wall time during which at least one API request of a reconcile is in flight (concurrent requests
    overlap: summing their durations would exceed the reconcile's own wall time)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._inflight = 0
        self._since = 0.0

    def enter(self) -> None:
        if self._inflight == 0:
            self._since = time.perf_counter()
        self._inflight += 1

    def leave(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self.seconds += time.perf_counter() - self._since


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"HTTP {status} {reason}: {message}")

    @property
    def transient(self) -> bool:
        return self.status in (409, 429) or self.status >= 500


def start_api_timer() -> ApiTimer:
    """Start accumulating API wait time in this task (and the tasks it gathers)."""
    timer = ApiTimer()
    _API_SECONDS.set(timer)
    return timer


def path_for(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    try:
        plural, namespaced = RESOURCES[(api_version, kind)]
    except KeyError:
        raise ValueError(f"unknown kind {api_version}/{kind}") from None
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced:
        base += f"/namespaces/{namespace or 'default'}"
    base += f"/{plural}"
    return f"{base}/{name}" if name else base


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if not info.server.startswith("https"):
        return False
    if info.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        cadata = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        ctx = ssl.create_default_context(cafile=os.fsdecode(info.ca_path) if info.ca_path else None, cadata=cadata)
    if info.certificate_path and info.private_key_path:
        ctx.load_cert_chain(os.fsdecode(info.certificate_path), os.fsdecode(info.private_key_path))
    return ctx


@dataclass
class KubeClient:
    """One aiohttp session to the API server."""

    server: str
    headers: Mapping[str, str]
    ssl_context: ssl.SSLContext | bool = False
    timeout_seconds: float = 30.0
    # Requests in flight at once; the rest wait here (not in the HTTP pool, where the timeout would run).
    max_inflight: int = 32
    # Called with each object a server-side apply returned (the operator remembers its own writes).
    on_applied: Callable[[dict[str, Any]], None] | None = None
    _session: aiohttp.ClientSession | None = None
    _slots: asyncio.Semaphore | None = None

    @classmethod
    def from_connection_info(cls, info: kopf.ConnectionInfo) -> KubeClient:
        return cls(server=info.server.rstrip("/"), headers=info.as_http_headers(), ssl_context=_ssl_context(info))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
                headers=dict(self.headers),
                connector=aiohttp.TCPConnector(ssl=self.ssl_context, limit=self.max_inflight),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request; returns the decoded JSON, None for 404 on GET; raises ApiError otherwise."""
        timer = _API_SECONDS.get()
        if timer is not None:
            timer.enter()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_inflight)
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Content-Type": content_type} if data is not None else None
        try:
            async with self._slots:
                for attempt in (1, 2):
                    try:
                        async with self._client().request(
                            method, self.server + path, data=data, headers=headers, params=params
                        ) as resp:
                            text = await resp.text()
                            status = resp.status
                        break
                    except aiohttp.ServerDisconnectedError:
                        # A pooled keep-alive connection the server had closed: every verb used here is
                        # idempotent, so one immediate retry on a fresh connection is safe.
                        if attempt == 2:
                            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise ApiError(503, "Unreachable", f"{method} {path}: {err!r}") from err
        finally:
            if timer is not None:
                timer.leave()
        if status == 404 and method == "GET":
            return None
        if status >= 300:
            reason, message = "Error", text[:500]
            try:
                payload = json.loads(text)
                reason = str(payload.get("reason", reason))
                message = str(payload.get("message", message))
            except (ValueError, AttributeError):
                pass
            raise ApiError(status, reason, f"{method} {path}: {message}")
        return json.loads(text) if text else None

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with the operator's field manager (force: the operator owns what it renders)."""
        meta = manifest["metadata"]
        path = path_for(manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
        result: dict[str, Any] = await self.request(
            "PATCH",
            path,
            body=manifest,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        if self.on_applied is not None and isinstance(result, dict):
            self.on_applied(result)
        return result

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self.request("GET", path_for(api_version, kind, namespace, name))
        return result

    async def merge_patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        path = path_for(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        result: dict[str, Any] = await self.request(
            "PATCH", path, body=patch,
            content_type="application/merge-patch+json",
        )
        return result

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete (background propagation); False when it was already gone."""
        try:
            await self.request(
                "DELETE", path_for(api_version, kind, namespace, name),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            )
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    async def has_kind(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `group_version` (discovery; False on any error)."""
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        try:
            found = await self.request("GET", base)
        except ApiError:
            return False
        if not isinstance(found, dict):
            return False
        return any(r.get("name") == plural for r in found.get("resources", []))

    async def list(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Objects of a kind in a namespace carrying all `labels` (also filtered here, for simple servers)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        found = await self.request("GET", path_for(api_version, kind, namespace), params={"labelSelector": selector})
        items = found.get("items", []) if isinstance(found, dict) else []
        return [
            i for i in items
            if all((i.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in labels.items())
        ]
