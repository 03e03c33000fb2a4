"""The one Kubernetes client of llmfleet: lightkube's async client, used by the operator, the autoscaler's
actuator and the router's discovery (kopf keeps its own watch streams).

Objects go in and come out as plain dicts (the builders render dicts; no typed model round trip). A kind's
plural and scope come from lightkube's models for built-in kinds and from `CUSTOM_RESOURCES` for CRDs.
Errors are `ApiError` (a non-2xx answer, or 503 "Unreachable" when no answer came).

Server-side apply, the operator's bulk verb, is sent as a prepared httpx2 request (URL parsed once per object,
body encoded by msgspec) through the client lightkube builds from the same configuration (its authentication)
and the same transport (its connections): lightkube's generic request path (building and parsing the URL three
times, then decoding the answer) cost about as much client CPU per apply as the HTTP exchange itself.

Time spent waiting for the API server is accumulated per task (see `start_api_timer`) so reconcile timings
can exclude round trips.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import functools
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx2
import lightkube
import msgspec
from lightkube import operators
from lightkube.config.client_adapter import AsyncClient as HttpxClient
from lightkube.config.client_adapter import ConnectionParams, verify_cluster
from lightkube.config.models import User
from lightkube.core.resource import ApiInfo, NamespacedResource, ResourceDef, api_info
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericGlobalStatus,
    GenericNamespacedResource,
    GenericNamespacedStatus,
)
from lightkube.types import CascadeType, PatchType

from llmfleet.api.contracts import API_VERSION, FIELD_MANAGER, INFERENCESERVICE_PLURAL, TRAININGJOB_PLURAL
from llmfleet.kube.applied import AppliedCache, ObjectKey
from llmfleet.kube.transport import AiohttpTransport

if TYPE_CHECKING:
    import kopf

# (apiVersion, kind) -> plural of the namespaced CRDs llmfleet reads or writes: its own, and the optional
# third-party ones the builders emit when served (Volcano/scheduler-plugins PodGroup, Prometheus PodMonitor).
CUSTOM_RESOURCES: dict[tuple[str, str], str] = {
    (API_VERSION, "InferenceService"): INFERENCESERVICE_PLURAL,
    (API_VERSION, "TrainingJob"): TRAININGJOB_PLURAL,
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "podgroups",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
}
ALL_VERBS = ["delete", "deletecollection", "get", "global_list", "global_watch", "list", "patch", "post", "put",
             "watch"]
CRD = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")

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
    """A non-2xx answer from the API server (status 503, reason Unreachable: no answer)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"HTTP {status} {reason}: {message}")

    @property
    def transient(self) -> bool:
        return self.status in (409, 429) or self.status >= 500


class NoClusterConfig(Exception):
    """Neither an in-cluster service account nor a readable kubeconfig."""


def start_api_timer() -> ApiTimer:
    """Start accumulating API wait time in this task (and the tasks it gathers)."""
    timer = ApiTimer()
    _API_SECONDS.set(timer)
    return timer


def _split(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


@functools.cache
def resource(api_version: str, kind: str, subresource: str | None = None) -> type[Any]:
    """The dict-valued lightkube resource class of a kind (or of its `status`/`scale` subresource)."""
    if (api_version, kind) in CUSTOM_RESOURCES:
        group, version = _split(api_version)
        info = ApiInfo(resource=ResourceDef(group, version, kind), plural=CUSTOM_RESOURCES[(api_version, kind)],
                       verbs=ALL_VERBS)
        namespaced = True
    else:
        try:
            typed = resource_registry.load(api_version, kind)
        except lightkube.LoadResourceError:
            raise ValueError(f"unknown kind {api_version}/{kind}") from None
        info, namespaced = api_info(typed), issubclass(typed, NamespacedResource)
    if subresource is None:
        base: type[Any] = GenericNamespacedResource if namespaced else GenericGlobalResource
    else:
        base = GenericNamespacedStatus if namespaced else GenericGlobalStatus
        info = ApiInfo(resource=info.resource, parent=info.resource, plural=info.plural, verbs=["get", "patch", "put"],
                       action=subresource)
    return type(kind, (base,), {"_api_info": info})


def plural_of(api_version: str, kind: str) -> tuple[str, bool]:
    """(plural, namespaced) of a kind, e.g. ("deployments", True) for apps/v1 Deployment."""
    res = resource(api_version, kind)
    return api_info(res).plural, issubclass(res, NamespacedResource)


@functools.lru_cache(maxsize=16384)
def _apply_url(server: str, api_version: str, kind: str, namespace: str | None, name: str) -> httpx2.URL:
    """The server-side apply URL of one object, parsed once (the operator applies the same objects over and over)."""
    res = resource(api_version, kind)
    root = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    scope = f"/namespaces/{urllib.parse.quote(namespace, safe='')}" if namespace is not None else ""
    query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
    return httpx2.URL(f"{server}{root}{scope}/{api_info(res).plural}/{urllib.parse.quote(name, safe='')}?{query}")


def label_selector(text: str) -> dict[str, Any]:
    """An equality-based label selector (`a=b,c!=d,e,!f`) as lightkube's `labels` argument."""
    out: dict[str, Any] = {}
    for term in (t.strip() for t in text.split(",")):
        if not term:
            continue
        if "(" in term or " " in term:
            raise ValueError(f"label selector {text!r}: only equality terms (a=b, a!=b, a, !a) are supported")
        if "!=" in term:
            key, value = term.split("!=", 1)
            out[key] = operators.not_equal(value)
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            out[key] = value
        elif term.startswith("!"):
            out[term[1:]] = operators.not_exists()
        else:
            out[term] = None  # exists
    return out


def _single(config: lightkube.KubeConfig) -> lightkube.SingleConfig:
    single = config.get()
    if single is None:
        raise NoClusterConfig("the kubeconfig has no current context")
    return single


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _config_from_connection(info: kopf.ConnectionInfo) -> lightkube.SingleConfig:
    """kopf's login result (service account or kubeconfig) as a lightkube configuration."""
    cluster: dict[str, Any] = {"server": info.server.rstrip("/")}
    if info.insecure:
        cluster["insecure-skip-tls-verify"] = True
    if info.ca_path:
        cluster["certificate-authority"] = os.fsdecode(info.ca_path)
    elif info.ca_data:
        cluster["certificate-authority-data"] = _b64(info.ca_data)
    user: dict[str, Any] = {}
    if info.token:
        user["token"] = info.token
    elif info.username and info.password:
        user.update(username=info.username, password=info.password)
    if info.certificate_path and info.private_key_path:
        user.update({"client-certificate": os.fsdecode(info.certificate_path),
                     "client-key": os.fsdecode(info.private_key_path)})
    elif info.certificate_data and info.private_key_data:
        user.update({"client-certificate-data": _b64(info.certificate_data),
                     "client-key-data": _b64(info.private_key_data)})
    return _single(lightkube.KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "llmfleet",
        "clusters": [{"name": "llmfleet", "cluster": cluster}],
        "users": [{"name": "llmfleet", "user": user}],
        "contexts": [{"name": "llmfleet", "context": {"cluster": "llmfleet", "user": "llmfleet",
                                                      "namespace": info.default_namespace or "default"}}],
    }))


def _error(err: httpx2.HTTPError, what: str) -> ApiError:
    if isinstance(err, httpx2.HTTPStatusError):
        reason, message = "Error", err.response.text[:500]
        try:
            payload = json.loads(err.response.text)
            reason = str(payload.get("reason") or reason)
            message = str(payload.get("message") or message)
        except (ValueError, AttributeError):
            pass
        return ApiError(err.response.status_code, reason, f"{what}: {message}")
    return ApiError(503, "Unreachable", f"{what}: {err!r}")


@dataclass
class KubeClient:
    """One lightkube client (one connection pool) to the API server."""

    config: lightkube.SingleConfig
    timeout_seconds: float = 30.0
    # Requests in flight at once; the rest wait here (not in the HTTP pool, where the timeout would run).
    max_inflight: int = 32
    # Called with each object a server-side apply returned (the operator remembers its own writes).
    on_applied: Callable[[dict[str, Any]], None] | None = None
    # Skip an apply identical to the last successful one of the object for this long (0: never skip); the
    # caller must `forget()` an object it sees changed by someone else (llmfleet/kube/applied.py).
    unchanged_apply_ttl_seconds: float = 0.0
    # Requests sent so far (an apply skipped as unchanged is not one; benchmarks report both).
    requests: int = 0
    _applied: AppliedCache | None = field(default=None, repr=False)
    _client: lightkube.AsyncClient | None = field(default=None, repr=False)
    _transport: AiohttpTransport | None = field(default=None, repr=False)
    _apply_client: httpx2.AsyncClient | None = field(default=None, repr=False)
    _slots: asyncio.Semaphore | None = field(default=None, repr=False)

    @classmethod
    def from_connection_info(cls, info: kopf.ConnectionInfo) -> KubeClient:
        """Share the credentials kopf logged in with."""
        return cls(_config_from_connection(info))

    @classmethod
    def from_env(cls) -> KubeClient:
        """In-cluster service account, else the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
        try:
            return cls(_single(lightkube.KubeConfig.from_env()))
        except (lightkube.ConfigError, OSError, ValueError, KeyError) as err:
            raise NoClusterConfig(f"no Kubernetes client configuration: {err}") from err

    @classmethod
    def for_server(cls, server: str, token: str | None = None) -> KubeClient:
        """A client of `server` (plain http in tests; https verifies with the system CAs)."""
        user = {"token": token} if token else {}
        return cls(_single(lightkube.KubeConfig.from_dict({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": server.rstrip("/")}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        })))

    def _connections(self) -> AiohttpTransport:
        if self._transport is None:
            tls = (verify_cluster(self.config.cluster, self.config.user or User(), self.config.abs_file)
                   if self.config.cluster.server.startswith("https") else False)
            self._transport = AiohttpTransport(tls, max_connections=self.max_inflight,
                                               timeout_seconds=self.timeout_seconds)
        return self._transport

    def _lightkube(self) -> lightkube.AsyncClient:
        if self._client is None:
            self._client = lightkube.AsyncClient(self.config, timeout=httpx2.Timeout(self.timeout_seconds),
                                                 field_manager=FIELD_MANAGER, transport=self._connections())
        return self._client

    def _applier(self) -> httpx2.AsyncClient:
        """lightkube's httpx2 client for this configuration (base URL, authentication), on the shared transport."""
        if self._apply_client is None:
            # ConnectionParams annotates a sync transport; lightkube.AsyncClient hands it async ones too.
            params = ConnectionParams(timeout=httpx2.Timeout(self.timeout_seconds),
                                      transport=self._connections())  # type: ignore[arg-type]
            self._apply_client = HttpxClient(self.config, params)
        return self._apply_client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._apply_client is not None:
            await self._apply_client.aclose()
            self._apply_client = None
        if self._transport is not None:  # closed by either client already; a new call opens a new one
            await self._transport.aclose()
            self._transport = None

    async def _call(self, what: str, call: Callable[[lightkube.AsyncClient], Any]) -> Any:
        """Run one lightkube call with the in-flight limit and the API timer; errors become ApiError."""
        timer = _API_SECONDS.get()
        if timer is not None:
            timer.enter()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_inflight)
        try:
            async with self._slots:
                self.requests += 1
                return await call(self._lightkube())
        except httpx2.HTTPError as err:
            raise _error(err, what) from err
        finally:
            if timer is not None:
                timer.leave()

    def applied_cache(self) -> AppliedCache:
        if self._applied is None:
            self._applied = AppliedCache(self.unchanged_apply_ttl_seconds)
        return self._applied

    def forget(self, kind: str, namespace: str | None, name: str) -> None:
        """The object changed (or went) outside this client: its next apply is sent even if unchanged."""
        if self._applied is not None:
            self._applied.forget((kind, namespace or "", name))

    async def apply(self, manifest: Mapping[str, Any], generation: object = None) -> dict[str, Any]:
        """Server-side apply with the operator's field manager (force: the operator owns what it renders).

        With `unchanged_apply_ttl_seconds` set, an apply byte-identical to the last successful one of the object
        with the same owner `generation` is not sent; the answer of that one is returned (applied.py)."""
        meta = manifest["metadata"]
        res = resource(manifest["apiVersion"], manifest["kind"])
        ns = (meta.get("namespace") or "default") if issubclass(res, NamespacedResource) else None
        key: ObjectKey = (manifest["kind"], ns or "", meta["name"])
        cache = self.applied_cache()
        body = b""
        if cache.ttl_seconds > 0:
            body = cache.body(manifest)
            if (cached := cache.lookup(key, body, generation)) is not None:
                return cached
            cache.forget(key)  # also while in flight: a failed apply must not leave the old entry trusted
        url = _apply_url(self.config.cluster.server.rstrip("/"), manifest["apiVersion"], manifest["kind"], ns,
                         meta["name"])
        result: dict[str, Any] = await self._call(f"apply {manifest['kind']} {meta['name']}",
                                                  lambda _: self._send_apply(url, manifest))
        if body:
            cache.store(key, body, generation, result)
        if self.on_applied is not None:
            self.on_applied(result)
        return result

    async def _send_apply(self, url: httpx2.URL, manifest: Mapping[str, Any]) -> dict[str, Any]:
        request = httpx2.Request("PATCH", url, content=msgspec.json.encode(manifest),
                                 headers={"Content-Type": PatchType.APPLY.value})
        response = await self._applier().send(request)
        response.raise_for_status()
        try:
            result: object = msgspec.json.decode(response.content)
        except msgspec.DecodeError as err:
            raise httpx2.DecodingError(f"apply answered no JSON: {err}", request=request) from err
        if not isinstance(result, dict):
            raise httpx2.DecodingError(f"apply answered {type(result).__name__}, not an object", request=request)
        return result

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object (409 AlreadyExists if it does)."""
        meta = dict(manifest["metadata"])
        res = resource(manifest["apiVersion"], manifest["kind"])
        if issubclass(res, NamespacedResource):
            meta["namespace"] = meta.get("namespace") or "default"
        return dict(await self._call(f"create {manifest['kind']} {meta.get('name') or meta.get('generateName')}",
                                     lambda c: c.create(res({**manifest, "metadata": meta}))))

    def _ns(self, res: type[Any], namespace: str | None) -> str | None:
        return (namespace or "default") if issubclass(res, NamespacedResource) else None

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        res = resource(api_version, kind)
        try:
            return dict(await self._call(f"get {kind} {name}",
                                         lambda c: c.get(res, name, namespace=self._ns(res, namespace))))
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    async def _patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: Any,
                     patch_type: PatchType, subresource: str | None) -> dict[str, Any]:
        res = resource(api_version, kind, subresource)
        self.forget(kind, self._ns(res, namespace), name)  # a skipped apply would return the unpatched object
        return dict(await self._call(
            f"patch {kind} {name}" + (f"/{subresource}" if subresource else ""),
            lambda c: c.patch(res, name, patch, namespace=self._ns(res, namespace), patch_type=patch_type),
        ))

    async def merge_patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """RFC 7386 merge patch (`None` deletes a key) of the object or of its `status` subresource."""
        return await self._patch(api_version, kind, namespace, name, patch, PatchType.MERGE, subresource)

    async def json_patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, ops: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """RFC 6902 JSON patch (its `test` ops make it fail with 422 when the object changed meanwhile)."""
        return await self._patch(api_version, kind, namespace, name, ops, PatchType.JSON, None)

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete (background propagation); False when it was already gone."""
        res = resource(api_version, kind)
        self.forget(kind, self._ns(res, namespace), name)
        try:
            await self._call(f"delete {kind} {name}", lambda c: c.delete(
                res, name, namespace=self._ns(res, namespace), cascade=CascadeType.BACKGROUND))
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    async def list(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str] | None = None, *,
        selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Objects of a kind in a namespace carrying all `labels`, or matching an equality-based `selector`."""
        res = resource(api_version, kind)
        wanted: dict[str, Any] = {**(label_selector(selector) if selector else {}), **(labels or {})}

        async def collect(c: lightkube.AsyncClient) -> list[dict[str, Any]]:
            return [dict(o) async for o in c.list(res, namespace=self._ns(res, namespace), labels=wanted or None)]

        items: list[dict[str, Any]] = await self._call(f"list {kind}", collect)
        if not labels:
            return items
        # Also filtered here, for API servers that ignore the selector.
        return [i for i in items
                if all((i.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in labels.items())]

    async def crd_served(self, group_version: str, plural: str) -> bool:
        """Whether a CustomResourceDefinition serves `plural` in `group_version` (404: not installed).

        Reads the CRD object (the operator may read CRDs cluster-wide), not API discovery."""
        group, version = _split(group_version)
        crd = await self.get(*CRD, None, f"{plural}.{group}")
        if crd is None:
            return False
        return any(v.get("name") == version and v.get("served", True) for v in (crd.get("spec") or {}).get("versions") or [])
