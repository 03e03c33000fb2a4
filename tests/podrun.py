"""Run a rendered init container on this machine as the kubelet would: its command, its env with Secret refs
resolved from a dict, its volume mounts mapped onto local folders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_init_container(
    container: dict[str, Any], secrets: dict[str, dict[str, str]], volumes: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Path]]:
    """(the finished process, mountPath -> the local folder standing in for it). `llmfleet` runs as
    `python -m llmfleet.cli` of this interpreter."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": str(volumes),
           **(extra_env or {})}
    folders = {m["mountPath"]: volumes / m["name"] / m.get("subPath", "") for m in container["volumeMounts"]}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = _local_path(e["value"], folders)
            continue
        ref = e["valueFrom"]["secretKeyRef"]
        value = secrets.get(ref["name"], {}).get(ref["key"])
        if value is None:
            assert ref.get("optional") is True, f"Secret {ref['name']} has no key {ref['key']}"
        else:
            env[e["name"]] = value
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    command = [str(folders.get(a, a)) for a in container["command"]]
    assert command[0] == "llmfleet", command
    proc = subprocess.run([sys.executable, "-m", "llmfleet.cli", *command[1:]], capture_output=True, text=True,
                          timeout=300, env=env)
    return proc, folders


def _local_path(value: str, folders: dict[str, Path]) -> str:
    """A pod path under one of the container's mounts (HOME, caches under it) -> the same path in the local
    folder standing in for that mount; any other value unchanged."""
    for mount, folder in sorted(folders.items(), key=lambda kv: -len(kv[0])):
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return str(folder / value[len(mount):].lstrip("/"))
    return value
