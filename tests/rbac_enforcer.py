"""RBAC on the Kubernetes API emulator (tests/kubeemu.py): requests bearing a given token are authorized against
a ServiceAccount's rules, as the API server's RBAC authorizer would, and answered 403 Forbidden when no rule
grants them. Every denial is recorded, so a test can fail with the exact (verb, apiGroup, resource) the code
used that the rules lack, even where the code under test swallows the 403 and retries.

    enforcer = enforce(emu, OPERATOR_RULES, token="operator")
    ...  # run the operator with ConnectionInfo(server=url, token="operator")
    enforcer.assert_clean()

A server-side apply that creates its object needs `create` as well as `patch`, as the API server checks
(api-concepts, "Patch and apply"): the enforcer asks the emulator whether the object exists.

Requests with another token (or none) are the test's own set-up and pass unchecked. Non-resource URLs (API
discovery, /version) are allowed for every authenticated user in a real cluster and pass too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock
from kmock._internal import enums, rendering

Access = tuple[str, str, str]  # (verb, apiGroup, resource or resource/subresource)
APPLY = "application/apply-patch+yaml"


def request_access(request: rendering.Request) -> Access | None:
    """The RBAC verb, API group and resource of a request (None for non-resource URLs)."""
    res = request.resource
    if res is None or not res.plural:
        return None
    method = str(getattr(request.method, "value", request.method) or "").upper()
    named = request.name is not None
    watching = request.action == enums.action.WATCH or str(request.params.get("watch", "")).lower() in ("1", "true")
    if method == "GET":
        verb = "watch" if watching else "get" if named else "list"
    elif method == "POST":
        verb = "create"
    elif method == "PATCH":
        verb = "patch"
    elif method == "PUT":
        verb = "update"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = method.lower()
    resource = f"{res.plural}/{request.subresource}" if request.subresource else res.plural
    return verb, res.group or "", resource


def granted(rules: Iterable[Mapping[str, Any]], access: Access, name: str | None = None) -> bool:
    verb, group, resource = access
    for rule in rules:
        names = rule.get("resourceNames") or []
        if (group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
                and verb in rule.get("verbs", []) and (not names or name in names)):
            return True
    return False


@dataclass
class RbacEnforcer:
    rules: list[Mapping[str, Any]]
    token: str
    exists: Callable[[rendering.Request], bool] = lambda request: True
    checked: set[Access] = field(default_factory=set)
    denied: set[Access] = field(default_factory=set)

    def __call__(self, request: rendering.Request) -> kmock.KubernetesError | None:
        auth = request.headers.get("Authorization") or request.headers.get("authorization") or ""
        if auth != f"Bearer {self.token}":
            return None
        access = request_access(request)
        if access is None:
            return None
        needed = [access]
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if access[0] == "patch" and ctype == APPLY and not self.exists(request):
            needed.append(("create", access[1], access[2]))
        missing = [a for a in needed if not granted(self.rules, a, request.name)]
        self.checked.update(needed)
        if not missing:
            return None
        self.denied.update(missing)
        verb, group, resource = missing[0]
        return kmock.KubernetesError(
            status=403, reason="Forbidden",
            message=f'{resource}{"." + group if group else ""} is forbidden: cannot {verb} (not in the rules)',
        )

    def assert_clean(self) -> None:
        assert self.checked, f"no request carried the token {self.token!r}: nothing was checked"
        assert not self.denied, (
            "requests the RBAC rules do not grant (verb, apiGroup, resource): " + repr(sorted(self.denied))
        )


def enforce(emu: Any, rules: Iterable[Mapping[str, Any]], token: str) -> RbacEnforcer:
    """Answer 403 to `token`'s requests that `rules` do not grant; the enforcer records what it saw."""
    def exists(request: rendering.Request) -> bool:
        res = request.resource
        ns = request.namespace if emu._namespaced(res) else None
        obj = emu.objects._objects.get((res, ns, str(request.name)))  # the key the emulator stores it under
        return obj is not None and not obj.deleted

    enforcer = RbacEnforcer(rules=list(rules), token=token, exists=exists)
    emu.faults.insert(0, enforcer)
    return enforcer
