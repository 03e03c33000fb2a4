"""Local networking helpers."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on `host` right now (bind to port 0, read it back, release it).

    Another process can take it before the caller binds it; callers that start a server on it retry or fail
    clearly. Servers that can listen on port 0 themselves should do that instead.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
