"""free_port picks ports below the kernel's ephemeral range, where no bind to port 0 or outgoing connection of
another process can take them before the caller binds them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from llmfleet.util import net


def test_ports_come_from_below_the_ephemeral_range_bindable_and_distinct() -> None:
    lo, _ = net.ephemeral_range()
    ports = [net.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)  # never the same port twice in a process
    if lo - net.LOWEST_PICKED >= 1000:
        assert all(net.LOWEST_PICKED <= p < lo for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free when handed out


def test_a_port_held_by_another_socket_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    # only two candidates: the held one and one more
    monkeypatch.setattr(net, "LOWEST_PICKED", port)
    monkeypatch.setattr(net, "ephemeral_range", lambda: (port + 1000, port + 2000))
    picks = iter([port, port, port + 1])
    monkeypatch.setattr(net.random.SystemRandom, "randrange", lambda self, a, b: next(picks))
    try:
        assert net.free_port() == port + 1
    finally:
        held.close()
        net._handed_out.discard(port + 1)


def test_the_range_file_is_read_and_a_bad_one_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    monkeypatch.setattr(net, "EPHEMERAL_RANGE_FILE", f)
    assert net.ephemeral_range() == (40000, 50000)
    f.write_text("garbage")
    assert net.ephemeral_range() == net.DEFAULT_EPHEMERAL
    monkeypatch.setattr(net, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert net.ephemeral_range() == net.DEFAULT_EPHEMERAL


def test_no_room_below_the_range_lets_the_os_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "ephemeral_range", lambda: (net.LOWEST_PICKED + 10, 65000))
    port = net.free_port()
    assert port >= net.LOWEST_PICKED + 10  # from the OS's own range
