"""A local run's state file and its processes, read from outside the supervisor (`llmfleet down`, `status`).

The supervisor (runtime.py) writes `state.json` in the run folder every tick; these functions read it, tell
whether its pids are still ours and stop what it lists, so the CLI needs none of the supervisor's machinery.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


def run_dir_for(name: str, base: Path | None = None) -> Path:
    return (base or Path.cwd() / ".run") / name


def read_state(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def _is_ours(pid: int, run_dir: Path) -> bool:
    """Guard against pid reuse: only signal llmfleet/vLLM processes, or a Prometheus of this run folder."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"llmfleet" in cmd or b"vllm" in cmd or (b"prometheus" in cmd and str(run_dir).encode() in cmd)


def state_pids(state: dict[str, Any]) -> list[int]:
    pids = [state.get("supervisorPid"), (state.get("router") or {}).get("pid"),
            (state.get("prometheus") or {}).get("pid")]
    pids += [r.get("pid") for r in state.get("replicas", [])]
    return [int(p) for p in pids if p]


def down(run_dir: Path, timeout_s: float = 120.0) -> list[int]:
    """Stop a running `llmfleet up` (SIGTERM to its supervisor, which drains); kill leftovers. Returns
    the pids that had to be killed."""
    state = read_state(run_dir)
    if state is None:
        raise FileNotFoundError(f"no {STATE_FILE} in {run_dir}: nothing is running there")
    sup = state.get("supervisorPid")
    if sup and pid_alive(sup) and _is_ours(sup, run_dir):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
    killed = []
    for pid in state_pids(read_state(run_dir) or state) + state_pids(state):
        if pid_alive(pid) and _is_ours(pid, run_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return sorted(set(killed))
