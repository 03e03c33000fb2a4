"""`python -m llmfleet.router` / `llmfleet router` as a process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from llmfleet.router.config import PoolConfig, RouterConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_cli_rejects_bad_config(tmp_path) -> None:
    f = tmp_path / "router.yaml"
    f.write_text("service: x\npools: []\n")
    p = subprocess.run([sys.executable, "-m", "llmfleet.cli.main", "router", "--config", str(f)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "invalid config" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = subprocess.run([sys.executable, "-m", "llmfleet.router", "--config", str(tmp_path / "missing.yaml")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "cannot read" in p.stderr


def test_cli_serves_and_stops(tmp_path) -> None:
    fake = subprocess.Popen([sys.executable, "-m", "llmfleet.testing.fake_backend", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    router = None
    try:
        assert fake.stdout is not None
        line = fake.stdout.readline()
        backend = f"http://127.0.0.1:{line.split()[1]}"
        cfg = RouterConfig(service="x", host="127.0.0.1",
                           pools=[PoolConfig(name="primary", role="primary", served_names=["m"], endpoints=[backend])])
        f = tmp_path / "router.yaml"
        f.write_text(cfg.to_yaml())
        router = subprocess.Popen([sys.executable, "-m", "llmfleet.router", "--config", str(f), "--port", "0"],
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert router.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", router.stderr.readline())
            port = m.group(1) if m else None
        assert port is not None
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=10)
        assert r.status_code == 200 and r.headers["x-llmfleet-pool"] == "primary"
        assert "llmfleet_router_requests_total" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        router.send_signal(signal.SIGTERM)  # Kubernetes stops pods with SIGTERM: a clean exit
        assert router.wait(timeout=15) == 0
    finally:
        for p in (router, fake):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
