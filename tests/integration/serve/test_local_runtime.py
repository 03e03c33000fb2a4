"""`llmfleet up` end to end: up -> requests through the router -> kill a replica -> it comes back -> down.

After `down` no process of the run (supervisor, router, wrappers, vLLM API servers, engine cores) is left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from openai import OpenAI

from llmfleet.local.run_state import read_state

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]
START_TIMEOUT_S = float(os.environ.get("LLMFLEET_TEST_START_TIMEOUT", "420"))


def _manifest(tmp: Path, name: str = "uptest", **spec: Any) -> Path:
    doc = {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": name},
        "spec": {
            "model": {"path": "tiny://tiny-llama", "servedName": "uptest", "maxModelLen": 512},
            "vllm": {"blockSize": 32, "enforceEager": True, "maxNumSeqs": 4},
            "replicas": 1, "minReplicas": 1, "maxReplicas": 1, "drainSeconds": 10,
            "router": {"blockSizeTokens": 32}, "autoscaling": {"policy": "static"}, **spec,
        },
    }
    path = tmp / "isvc.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _llmfleet(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmfleet.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _wait(pred: Any, timeout_s: float, what: str, run_dir: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    logs = "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in (run_dir / "logs").glob("*.log"))
    raise TimeoutError(f"timed out waiting for {what}; state={read_state(run_dir)}\n{logs}")


def _tree(pids: list[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out |= {pid, *(c.pid for c in p.children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
    return out


def _prom_up(prom: str) -> bool:
    try:
        r = httpx.get(prom + "/api/v1/query", params={"query": 'up{job="llmfleet-router"}'}, timeout=5)
    except httpx.HTTPError:
        return False
    result = r.json().get("data", {}).get("result", []) if r.status_code == 200 else []
    return any(x["value"][1] == "1" for x in result)


def _chat(url: str) -> str:
    c = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=2, timeout=120)
    r = c.chat.completions.create(model="uptest", max_tokens=4, extra_body={"ignore_eos": True},
                                  messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    return r.choices[0].message.content or ""


def test_up_kill_restart_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    manifest = _manifest(tmp_path)
    up = _llmfleet("up", "-f", str(manifest), "--run-dir", str(run_dir), "-d", "--ready-timeout", str(START_TIMEOUT_S),
                   timeout=START_TIMEOUT_S + 60)
    state = read_state(run_dir) or {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "ready:" in up.stdout
        assert _chat(state["url"])
        prom = (state.get("prometheus") or {}).get("url")
        if shutil.which("prometheus"):  # started when installed (CI installs it); it scrapes the router
            assert prom
            _wait(lambda: _prom_up(prom), 60, "Prometheus to scrape the router", run_dir)

        replica = next(r for r in state["replicas"] if r["running"])
        # a CPU pool runs vLLM's uniprocess executor: the model worker lives in the engine core, with no
        # worker process of its own busy-polling beside it; its OpenMP threads sleep when idle
        # (the serving wrapper's environment: the engine core's own is overwritten by its process title)
        wrapper = psutil.Process(replica["pid"])
        engines = sorted(p.name() for p in wrapper.children(recursive=True) if p.name().startswith("VLLM::"))
        assert engines == ["VLLM::EngineCore"], engines
        assert wrapper.environ().get("OMP_WAIT_POLICY") == "PASSIVE"
        old_pid = replica["pid"]
        os.kill(old_pid, signal.SIGKILL)  # a crash: the supervisor must notice, report and restart it

        def restarted() -> dict[str, Any] | None:
            s = read_state(run_dir) or {}
            r = next((r for r in s.get("replicas", []) if r["name"] == replica["name"]), None)
            return s if r and r["restarts"] == 1 and r["pid"] != old_pid and r["ready"] else None

        state = _wait(restarted, START_TIMEOUT_S, "the killed replica to come back", run_dir)
        assert any("crashed" in e["message"] and replica["name"] in e["message"] for e in state["events"])
        assert _chat(state["url"])
        status = _llmfleet("status", "--run-dir", str(run_dir), timeout=60)
        assert status.returncode == 0 and "primary" in status.stdout, status.stdout + status.stderr
    finally:
        state = read_state(run_dir) or state
        pids = [p for p in [state.get("supervisorPid"), (state.get("router") or {}).get("pid"),
                            *(r.get("pid") for r in state.get("replicas", []))] if p]
        everything = _tree(pids)
        down = _llmfleet("down", "--run-dir", str(run_dir), timeout=240)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "killed leftover" not in down.stdout  # the supervisor stopped everything itself
    assert len(everything) >= 4  # supervisor, router, wrapper, vLLM server (+ engine core)
    leftovers = [p for p in everything if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not leftovers, [psutil.Process(p).cmdline() for p in leftovers]
    final = json.loads((run_dir / "state.json").read_text())
    assert all(not r["running"] for r in final["replicas"])


def test_up_at_zero_replicas_holds_the_first_requests_through_the_cold_start(tmp_path: Path) -> None:
    """`llmfleet up` with the primary at `minReplicas: 0`: nothing runs until the first requests; they wait at
    the router while it wakes the autoscaler (long poll, not the 60 s interval), which starts a replica at once;
    every request succeeds after about one cold start."""
    from concurrent.futures import ThreadPoolExecutor

    manifest = _manifest(
        tmp_path, "zerotest", replicas=0, minReplicas=0,
        router={"blockSizeTokens": 32, "requestTimeoutSeconds": START_TIMEOUT_S},
        autoscaling={"policy": "slo", "intervalSeconds": 60, "scaleDownStabilizationSeconds": 600},
    )
    run_dir = tmp_path / "run"
    up = _llmfleet("up", "-f", str(manifest), "--run-dir", str(run_dir), "-d", "--ready-timeout", "120", timeout=180)
    state = read_state(run_dir) or {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert not any(r["running"] for r in state["replicas"])  # at zero: only the router runs
        time.sleep(2)  # the autoscaler's first step has run; its next periodic one is 60 s away
        t0 = time.time()
        client = OpenAI(base_url=state["url"] + "/v1", api_key="unused", max_retries=0, timeout=START_TIMEOUT_S + 30)

        def ask(_: int) -> str:  # no client retries: a 503 would fail the test
            r = client.chat.completions.create(model="uptest", max_tokens=4, extra_body={"ignore_eos": True},
                                               messages=[{"role": "user", "content": "hi"}])
            return r.choices[0].message.content or ""

        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(ask, range(3)))
        elapsed = time.time() - t0
        assert all(answers)
        state = read_state(run_dir) or {}
        scaled = [e for e in state["events"] if "autoscaler: primary 0 -> 1" in e["message"]]
        assert scaled and scaled[0]["ts"] - t0 < 10, state["events"]  # woken at once, not at the 60 s tick
        replica = next(r for r in state["replicas"] if r["running"])
        metrics = httpx.get(state["url"] + "/metrics", timeout=5).text
        assert 'status="503"' not in metrics and 'llmfleet_router_held_requests{pool="primary"} 0.0' in metrics
        ready_after = replica["started_at"] and elapsed - (replica["started_at"] - t0)
        print(f"first answers after {elapsed:.1f}s (replica started {replica['started_at'] - t0:.1f}s after the "
              f"requests; cold start and answer {ready_after:.1f}s)")
    finally:
        down = _llmfleet("down", "--run-dir", str(run_dir), timeout=240)
    assert down.returncode == 0, down.stdout + down.stderr
