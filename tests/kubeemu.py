"""A fuller Kubernetes API emulator for kopf tests: kmock 0.8's KubernetesEmulator plus what operators need.

kmock's emulator fails on `GET /api/v1/namespaces`, sets no uid/resourceVersion/generation and cannot
create by server-side apply. `KubeEmulator` adds, for every resource request (FETCH/CREATE/UPDATE/DELETE
are served here; LIST/WATCH/discovery stay kmock's):

- the built-in resources (kmock's bundled K3s discovery) plus CRDs added with `add_crd(doc)` /
  `add_crds_from(folder)` (their `status`/`scale` subresources are honoured);
- metadata.uid, resourceVersion (global counter), generation (bumped when anything outside metadata and
  status changes), creationTimestamp; `metadata.resourceVersion` in a patch is an optimistic-concurrency
  precondition (409 on mismatch);
- Namespace objects created on first use of a namespace, so namespace listing/watching works;
- PATCH by content type: `application/apply-patch+yaml` is server-side apply (creates when absent; per
  field manager, fields a manager applied before and omits now are removed; lists are atomic),
  `application/json-patch+json` is RFC 6902, anything else is an RFC 7386 merge patch (`null` deletes);
- the `status` subresource (a main-resource patch cannot change status and vice versa) and `scale`
  (GET/PATCH `.../scale` maps to spec.replicas / status.replicas / status.selector);
- deletion: finalizers delay it (deletionTimestamp), and owner references cascade (background GC);
- no-op writes do not bump resourceVersion nor emit watch events (like a real API server);
- `GET /_kubeemu/counts`: live object counts per resource (cheap progress polling for benchmarks);
- `GET /_kubeemu/requests`: API requests served so far per HTTP method (a watch is one request; the
  `/_kubeemu/` endpoints are not counted), so benchmarks count any client's requests the same way;
- `faults`: callables `(request) -> KubernetesError | None` consulted first, to inject API errors.

Use it from pytest (async):

    import kubeemu  # tests/conftest.py puts tests/ on sys.path

    async with kubeemu.serve(crds="crds") as (emu, url):
        ...  # point kopf / clients at `url` (plain http, no auth); inspect emu.get(...), emu.list(...)

or standalone in another process: `python tests/kubeemu.py --crds crds` prints the URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import pathlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import apps, dicts, enums, parsing, rendering
from kmock._internal.k8s import KubernetesObjectConflictError
from kubeemu_objects import changed_paths, copy_json, drop_path, now, removed_paths, spec_part, without

from llmfleet.operator.promotion import apply_merge_patch  # RFC 7396, as an API server does it

NAMESPACES = kmock.resource("", "v1", "namespaces")
APPLY = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"

Fault = Callable[[rendering.Request], "kmock.KubernetesError | None"]


_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock 0.8 reads `/api/v1/namespaces[/NAME[/status]]` as a namespace prefix and crashes or mis-parses:
    treat it as the cluster-scoped `namespaces` resource."""
    parts = [p for p in path.strip("/").split("/") if p]
    if parts[:3] == ["api", "v1", "namespaces"] and (
        len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))
    ):
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) > 3 else None,
                                  parts[4] if len(parts) > 4 else None)
    return _kmock_parse_path(path)


# Module-level fix (idempotent, affects kmock's request parsing in this process only).
parsing.parse_path = _parse_path


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with the behaviours an operator relies on (see the module docstring)."""

    faults: list[Fault] = attrs.field(factory=list)
    history_limit: int | None = None  # keep at most N versions per object (None: all, as kmock does)
    _rv: int = attrs.field(default=0, init=False)
    _applied: dict[tuple[Any, str], dict[str, Any]] = attrs.field(factory=dict, init=False)
    requests_served: dict[str, int] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()

    # ---- set-up -------------------------------------------------------------------------------------------
    def add_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve a CustomResourceDefinition's resource (all versions), and store the CRD object itself."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            subs = set((version.get("subresources") or {}).keys())
            self.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular", names["kind"].lower()),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                shortnames=names.get("shortNames", []),
                categories=names.get("categories", []),
                verbs=["get", "list", "watch", "create", "update", "patch", "delete"],
                subresources=subs,
            )
        crds = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        self._store_new(crds, None, dict(copy.deepcopy(crd)))

    def add_crds_from(self, folder: str | pathlib.Path) -> None:
        for path in sorted(pathlib.Path(folder).glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    self.add_crd(doc)

    def _get_resources(self) -> list[Any]:
        # kmock also scans every stored object here (O(objects) per discovery request); every resource an
        # object can be stored under is declared in this emulator, so the declared ones suffice.
        return list(self.resources)

    # ---- inspection helpers for tests --------------------------------------------------------------------
    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        res = kmock.resource(resource)
        obj = self.objects._objects.get((res, namespace, name))
        return None if obj is None or obj.deleted else copy.deepcopy(obj.raw)

    def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        res = kmock.resource(resource)
        return [
            copy.deepcopy(obj.raw)
            for (r, ns, _), obj in self.objects.items()
            if r == res and not obj.deleted and (namespace is None or ns == namespace)
        ]

    def counts(self) -> dict[str, int]:
        """Live objects per resource, keyed `group/version/plural` (`v1/plural` for the core group)."""
        out: dict[str, int] = {}
        for (r, _, _), obj in self.objects.items():
            if not obj.deleted:
                key = f"{r.group}/{r.version}/{r.plural}" if r.group else f"{r.version}/{r.plural}"
                out[key] = out.get(key, 0) + 1
        return out

    async def put(self, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create an object directly (as `kubectl create` would), with metadata filled in and a watch event."""
        res = kmock.resource(resource)
        meta = body.setdefault("metadata", {})
        async with self._lock:
            obj, events = self._create(res, meta.get("namespace") if self._namespaced(res) else None, body)
        await self._publish(events)
        return obj

    async def patch(self, resource: str, namespace: str | None, name: str, patch: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        """Merge-patch an object directly (e.g. to set a child's status as a controller would)."""
        res = kmock.resource(resource)
        async with self._lock:
            obj, events = self._update(res, namespace, name, subresource, patch, "merge", None)
        await self._publish(events)
        return obj

    async def remove(self, resource: str, namespace: str | None, name: str) -> None:
        """Delete an object directly (cascading to its dependents)."""
        res = kmock.resource(resource)
        async with self._lock:
            _, events = self._delete(res, namespace, name)
        await self._publish(events)

    # ---- request handling ---------------------------------------------------------------------------------
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        for fault in self.faults:
            if (err := fault(request)) is not None:
                raise err
        if request.url.path == "/_kubeemu/counts":  # live object counts per resource (benchmarks poll this)
            return aiohttp.web.json_response(self.counts())
        if request.url.path == "/_kubeemu/requests":
            return aiohttp.web.json_response(self.requests_served)
        method = request.method.value
        self.requests_served[method] = self.requests_served.get(method, 0) + 1
        res = request.resource
        action = request.action
        if res is not None and action == enums.action.LIST and request.name is None and res in self.resources:
            return aiohttp.web.json_response(self._list(res, request.namespace, request.params.get("labelSelector")))
        if res is None or action not in (enums.action.FETCH, enums.action.CREATE, enums.action.UPDATE,
                                         enums.action.DELETE):
            return await super()._handle(request)
        if res not in self.resources and not any(r == res for r, _, _ in self.objects):
            raise kmock.KubernetesResourceNotFoundError()
        ns = request.namespace if self._namespaced(res) else None
        status = 200
        events: list[tuple[Any, dict[str, Any]]] = []
        async with self._lock:
            if action == enums.action.FETCH:
                obj = self._fetch(res, ns, str(request.name), request.subresource)
            elif action == enums.action.CREATE:
                body = self._body(request)
                ns = ns or (body.get("metadata") or {}).get("namespace") if self._namespaced(res) else None
                obj, events = self._create(res, ns, body)
                status = 201
            elif action == enums.action.UPDATE:
                ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
                mode = "apply" if ctype == APPLY else "json" if ctype == JSON_PATCH else "merge"
                manager = request.params.get("fieldManager") or "unknown"
                obj, events = self._update(res, ns, str(request.name), request.subresource, self._body(request),
                                           mode, manager)
            else:
                obj, events = self._delete(res, ns, str(request.name))
        await self._publish(events)
        return aiohttp.web.json_response(obj, status=status)

    def _list(self, res: Any, ns: str | None, selector: str | None) -> dict[str, Any]:
        """LIST with equality-based label selectors (`a=b,c=d`, `a!=b`, `a`), as kubectl and clients send."""
        wanted: list[tuple[str, str | None, bool]] = []
        for term in (selector or "").split(","):
            term = term.strip()
            if not term:
                continue
            if "!=" in term:
                k, v = term.split("!=", 1)
                wanted.append((k.strip(), v.strip(), False))
            elif "=" in term:
                k, v = term.replace("==", "=").split("=", 1)
                wanted.append((k.strip(), v.strip(), True))
            else:
                wanted.append((term, None, True))
        items = []
        for (r, n_s, _), obj in self.objects.items():
            if r != res or obj.deleted or (ns is not None and n_s != ns):
                continue
            raw = obj.raw
            labels = (raw.get("metadata") or {}).get("labels") or {}
            if all((labels.get(k) == v if v is not None else k in labels) == eq for k, v, eq in wanted):
                items.append(raw)
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _body(self, request: rendering.Request) -> Any:
        if request.data is not None and not isinstance(request.data, dict | list):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="unreadable body")
        if request.data is not None:
            return request.data
        try:
            data = yaml.safe_load(request.text or "null")
        except yaml.YAMLError as err:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(err)) from None
        if data is None:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="empty body")
        return data

    def _namespaced(self, res: Any) -> bool:
        try:
            return self.resources[res].namespaced is not False
        except KeyError:
            return True

    def _subresources(self, res: Any) -> set[str]:
        try:
            return set(self.resources[res].subresources)
        except KeyError:
            return set()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _publish(self, events: list[tuple[Any, dict[str, Any]]]) -> None:
        for res, event in events:
            await self._buses[res].put(event)

    def _live(self, res: Any, ns: str | None, name: str) -> Any:
        obj = self.objects._objects.get((res, ns, name))
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError(
                reason="NotFound", message=f"{res.plural} {name!r} not found", details={"name": name}
            )
        return obj

    def _fetch(self, res: Any, ns: str | None, name: str, sub: str | None) -> dict[str, Any]:
        raw: dict[str, Any] = self._live(res, ns, name).raw
        if sub == "scale":
            return self._scale(raw)
        return raw

    @staticmethod
    def _scale(raw: Mapping[str, Any]) -> dict[str, Any]:
        st = raw.get("status") or {}
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: raw["metadata"][k] for k in ("name", "namespace", "resourceVersion") if k in raw["metadata"]},
            "spec": {"replicas": (raw.get("spec") or {}).get("replicas", 0)},
            "status": {"replicas": st.get("replicas", 0), "selector": st.get("selector", "")},
        }

    def _ensure_namespace(self, ns: str | None, events: list[tuple[Any, dict[str, Any]]]) -> None:
        if ns is None:
            return
        existing = self.objects._objects.get((NAMESPACES, None, ns))
        if existing is not None and not existing.deleted:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "status": {"phase": "Active"}}
        events += self._store_new(NAMESPACES, None, body)

    def _store_new(self, res: Any, ns: str | None, body: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
        meta = body.setdefault("metadata", {})
        if ns is not None:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_rv()
        meta["generation"] = 1
        meta.setdefault("creationTimestamp", now())
        key = (res, ns, meta["name"])
        if key in self.objects._objects:
            self.objects._objects[key].create(body)
        else:
            self.objects._objects[key] = kmock.Object(body)
        return [(res, {"type": "ADDED", "object": body})]

    def _create(self, res: Any, ns: str | None, body: Any) -> tuple[dict[str, Any], list[tuple[Any, dict[str, Any]]]]:
        if not isinstance(body, Mapping):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="the body must be an object")
        body = copy_json(dict(body))
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise kmock.KubernetesError(status=422, reason="Invalid", message="metadata.name is required")
        existing = self.objects._objects.get((res, ns, meta["name"]))
        if existing is not None and not existing.deleted:
            raise KubernetesObjectConflictError(reason="AlreadyExists", message=f"{meta['name']} already exists")
        events: list[tuple[Any, dict[str, Any]]] = []
        self._ensure_namespace(ns, events)
        events += self._store_new(res, ns, body)
        return body, events

    def _update(
        self, res: Any, ns: str | None, name: str, sub: str | None, patch: Any, mode: str, manager: str | None
    ) -> tuple[dict[str, Any], list[tuple[Any, dict[str, Any]]]]:
        key = (res, ns, name)
        obj = self.objects._objects.get(key)
        if obj is None or obj.deleted:
            if mode != "apply":
                raise kmock.KubernetesObjectNotFoundError(reason="NotFound", message=f"{name!r} not found")
            created, events = self._create(res, ns, {**patch, "metadata": {**patch.get("metadata", {}), "name": name}})
            self._applied[(key, str(manager))] = copy_json(patch)
            return created, events
        old = obj.raw
        if mode == "json":
            try:
                new = dict(dicts.json_patch_dict(old, patch))
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as err:
                # As a real API server: a failed `test` op (kopf's resourceVersion precondition) is a 422.
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(err)) from None
        else:
            if not isinstance(patch, Mapping):
                raise kmock.KubernetesError(status=400, reason="BadRequest", message="the patch must be an object")
            want_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if want_rv is not None and mode != "apply" and str(want_rv) != old["metadata"].get("resourceVersion"):
                raise kmock.KubernetesError(status=409, reason="Conflict",
                                            message="the object has been modified; please apply your changes to "
                                                    "the latest version and try again")
            if sub == "scale":
                patch = {"spec": {"replicas": (patch.get("spec") or {}).get("replicas")}}
            elif sub == "status":
                patch = {"status": patch.get("status")} if "status" in patch else {}
            elif "status" in self._subresources(res):
                patch = without(patch, "status")
            if mode == "apply":
                base = copy_json(old)
                prev = self._applied.get((key, str(manager)))
                if prev is not None:
                    for path in removed_paths(without(prev, "apiVersion", "kind"), patch):
                        if path[:1] != ("metadata",) or path[1:2] in (("labels",), ("annotations",)):
                            drop_path(base, path)
                new = apply_merge_patch(base, without(patch, "apiVersion", "kind"))
                self._applied[(key, str(manager))] = copy_json(patch)
            else:
                new = apply_merge_patch(old, patch)
        if mode != "apply":
            # A plain write takes ownership of what it changed away from the appliers (as managedFields do):
            # their next apply without those fields leaves them as they are.
            changed = changed_paths(spec_part(old), spec_part(new))
            for (k, _mgr), applied in self._applied.items():
                if k == key:
                    for path in changed:
                        drop_path(applied, path)
        # Server-managed fields are not writable. (A fresh metadata dict: `new` may share it with `old`.)
        new["metadata"] = dict(new.get("metadata") or {})
        for field in ("uid", "creationTimestamp", "name", "namespace"):
            if field in old["metadata"]:
                new.setdefault("metadata", {})[field] = old["metadata"][field]
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        new["metadata"]["generation"] = old["metadata"].get("generation", 1)
        if new == old:
            return old, []
        if spec_part(new) != spec_part(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        obj.history.append(new)
        if self.history_limit is not None and len(obj.history) > self.history_limit:
            del obj.history[: len(obj.history) - self.history_limit]
        events: list[tuple[Any, dict[str, Any]]] = [(res, {"type": "MODIFIED", "object": new})]
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            _, more = self._delete(res, ns, name)
            events += more
        result = self._scale(new) if sub == "scale" else new
        return result, events

    def _delete(self, res: Any, ns: str | None, name: str) -> tuple[dict[str, Any], list[tuple[Any, dict[str, Any]]]]:
        obj = self._live(res, ns, name)
        raw = obj.raw
        meta = raw["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return raw, []
            new = {**raw, "metadata": {**raw["metadata"], "deletionTimestamp": now()}}
            new["metadata"]["resourceVersion"] = self._next_rv()
            obj.history.append(new)
            return new, [(res, {"type": "MODIFIED", "object": new})]
        obj.delete()
        for (k, mgr) in [k for k in self._applied if k[0] == (res, ns, name)]:
            self._applied.pop((k, mgr), None)
        events: list[tuple[Any, dict[str, Any]]] = [(res, {"type": "DELETED", "object": raw})]
        # Garbage collection: dependents whose owner references point at the deleted uid.
        uid = meta.get("uid")
        dependents = [
            (r, n_s, n) for (r, n_s, n), o in self.objects.items()
            if not o.deleted and any(ref.get("uid") == uid for ref in (o.raw.get("metadata") or {}).get("ownerReferences") or [])
        ]
        for r, n_s, n in dependents:
            with contextlib.suppress(kmock.KubernetesError):
                events += self._delete(r, n_s, n)[1]
        return raw, events


@contextlib.asynccontextmanager
async def serve(
    crds: str | pathlib.Path | Iterable[Mapping[str, Any]] | None = None, **kwargs: Any
) -> AsyncIterator[tuple[KubeEmulator, str]]:
    """Start an emulator on a free localhost port; yields (emulator, base URL)."""
    emu = KubeEmulator(**kwargs)
    if isinstance(crds, str | pathlib.Path):
        emu.add_crds_from(crds)
    elif crds is not None:
        for crd in crds:
            emu.add_crd(crd)
    async with emu, apps.Server(emu) as server:
        yield emu, str(server.url).rstrip("/")


def kubeconfig(url: str, token: str = "kubeemu") -> dict[str, Any]:
    """A kubeconfig document pointing at the emulator (its bearer token only matters to tests/rbac_enforcer.py)."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "kubeemu",
        "clusters": [{"name": "kubeemu", "cluster": {"server": url}}],
        "users": [{"name": "kubeemu", "user": {"token": token}}],
        "contexts": [{"name": "kubeemu", "context": {"cluster": "kubeemu", "user": "kubeemu", "namespace": "default"}}],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the Kubernetes API emulator until interrupted.")
    parser.add_argument("--crds", help="folder of CRD YAML files to serve")
    parser.add_argument("--history-limit", type=int, default=2, help="versions kept per object")
    args = parser.parse_args()

    async def _run() -> None:
        async with serve(args.crds, history_limit=args.history_limit) as (_, url):
            print(json.dumps({"url": url}), flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run())


if __name__ == "__main__":
    main()
