"""JSON-object helpers of the Kubernetes emulator (tests/kubeemu.py): timestamps, copies, the paths two objects differ
at (server-side apply's ownership, generation bumps)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any


def now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def copy_json(value: Any) -> Any:
    """Deep copy of JSON data (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(value))


def removed_paths(old: Any, new: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Dict paths present in `old` but absent in `new` (lists are atomic: never descended)."""
    if not isinstance(old, Mapping):
        return []
    out = []
    for key, value in old.items():
        if not isinstance(new, Mapping) or key not in new:
            out.append((*prefix, key))
        else:
            out += removed_paths(value, new[key], (*prefix, key))
    return out


def changed_paths(old: Any, new: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Leaf paths whose value differs between two objects (lists are atomic leaves)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for key in set(old) | set(new):
            out += changed_paths(old.get(key), new.get(key), (*prefix, key))
        return out
    return [] if old == new else [prefix]


def drop_path(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = obj
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)


def without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return without(obj, "metadata", "status", "apiVersion", "kind")
