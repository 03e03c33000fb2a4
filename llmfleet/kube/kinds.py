"""Custom kinds that `KubeClient` learns at run time, beside the ones `client.CUSTOM_RESOURCES` names.

`client.resource` falls back to lightkube's registry of generic resources; registering a kind there once makes
`get`, `list` and the patches work for it, with its scope (cluster-wide or namespaced).
"""

from __future__ import annotations

from lightkube.generic_resource import (
    create_global_resource,
    create_namespaced_resource,
    get_generic_resource,
)


def register_custom_kind(api_version: str, kind: str, plural: str, *, namespaced: bool) -> None:
    """Make a CRD's kind known to KubeClient (idempotent)."""
    if get_generic_resource(api_version, kind) is not None:  # type: ignore[no-untyped-call]
        return
    group, _, version = api_version.rpartition("/")
    if namespaced:
        create_namespaced_resource(group, version, kind, plural)
    else:
        create_global_resource(group, version, kind, plural)
