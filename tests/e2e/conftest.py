"""Fixtures of the kind-based e2e suite (driven by e2e/run.sh).

The suite runs only when LLMFLEET_E2E=1 (run.sh sets it) *and* a cluster with the llmfleet CRDs answers:
it never touches whatever cluster the current kube context points at by accident. Everywhere else
(`make test` on a dev machine or CI without Docker) every test skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from polling import poll

from llmfleet.util.net import free_port

ROOT = Path(__file__).resolve().parents[2]


def _cluster_skip_reason() -> str | None:
    if os.environ.get("LLMFLEET_E2E") != "1":
        return "e2e needs a kind cluster: run `make e2e` (e2e/run.sh sets LLMFLEET_E2E=1)"
    if shutil.which("kubectl") is None:
        return "kubectl is not installed"
    try:
        probe = subprocess.run(["kubectl", "get", "crd", "inferenceservices.llmfleet.io", "--request-timeout=5s",
                                "-o", "name"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no Kubernetes cluster reachable: kubectl timed out"
    if probe.returncode:
        return f"no cluster with llmfleet installed (kubectl get crd: {probe.stderr.strip()[:200]}); run e2e/run.sh"
    return None


_SKIP = _cluster_skip_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _SKIP is None:
        return
    marker = pytest.mark.skip(reason=_SKIP)
    for item in items:
        if "tests/e2e/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(marker)


@pytest.fixture(scope="session")
def run_id() -> str:
    """Shared by the separate pytest calls of one e2e/run.sh run, so phases find each other's namespace."""
    return os.environ.get("LLMFLEET_E2E_RUN_ID") or uuid.uuid4().hex[:6]


@pytest.fixture()
def port_forward() -> Iterator[Callable[[str, str, int], str]]:
    """port_forward(namespace, service, port) -> base URL on localhost; the kubectl processes end with the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(namespace: str, service: str, port: int) -> str:
        local = free_port()
        proc = subprocess.Popen(
            ["kubectl", "-n", namespace, "port-forward", f"svc/{service}", f"{local}:{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)

        def listening() -> bool:
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex(("127.0.0.1", local)) == 0

        poll(f"port-forward to {namespace}/{service}", listening, timeout=30, interval=0.5)
        return f"http://127.0.0.1:{local}"

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
