"""Local networking helpers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# The kernel hands out ports in this range to every bind to port 0 and to every outgoing connection's local end
# (/proc/sys/net/ipv4/ip_local_port_range; Linux's default where the file cannot be read).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
# Below the ephemeral range, above the ports services are commonly configured on (8000, 8080, 9090, 5432, ...).
LOWEST_PICKED = 10000

_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive)."""
    try:
        lo, hi = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (lo, hi) if 0 < lo <= hi else DEFAULT_EPHEMERAL


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now, below the kernel's ephemeral range where that leaves room.

    A port from the ephemeral range (what binding port 0 returns) can be taken before the caller binds it by any
    process's outgoing connection or its own bind to port 0. `llmfleet up` gives each replica slot its ports for
    the supervisor's life, so a port taken so before the replica first starts fails every restart of it. Below
    the range only an explicit bind to the same number can take it. Ports are picked at random there, never the
    same one twice in a process; where the range leaves no room below it, the OS picks (bind to port 0). Callers
    that start a server on the port still retry or fail clearly; servers that can listen on port 0 themselves
    should do that instead.
    """
    lo, _ = ephemeral_range()
    if lo - LOWEST_PICKED >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(LOWEST_PICKED, lo)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port
