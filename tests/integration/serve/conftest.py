"""Shared helpers for the serving integration tests: tiny models and a replica process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.api import InferenceService
from llmfleet.local.tinymodel import PRIMARY, build_tiny
from llmfleet.util.net import free_port

START_TIMEOUT_S = float(os.environ.get("LLMFLEET_TEST_START_TIMEOUT", "420"))


def tiny_service(model_path: str, **vllm: Any) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "tiny"},
        "spec": {"model": {"path": model_path, "maxModelLen": 512},
                 "vllm": {"blockSize": 32, "enforceEager": True, "maxNumSeqs": 8, **vllm}, "drainSeconds": 60},
    })


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"replica exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"replica not healthy after {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def tiny_primary() -> Path:
    return build_tiny(PRIMARY)


@pytest.fixture(scope="module")
def replica(tiny_primary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One `python -m llmfleet.workers.serve` replica on the tiny model, shared by a test module."""
    from llmfleet.workers.serve.vllm_args import serve_command

    isvc = tiny_service(str(tiny_primary))
    port = free_port()
    cmd = serve_command(isvc, isvc.pools()[0], port=port, host="127.0.0.1", python=sys.executable,
                        kv_events_port=free_port())  # the default port would collide on a shared host
    log = tmp_path_factory.mktemp("replica") / "replica.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield {"url": url, "proc": proc, "log": log, "model": "tiny", "isvc": isvc}
    finally:
        stop(proc)
