"""`llmfleet features generate` end to end: a real CLI process, a fake OpenAI endpoint, SIGKILL mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from llmfleet.store import db, repo
from llmfleet.testing.fake_openai import FakeOpenAI, log_record, write_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmfleet", "features", *args]


def _responses(url: str) -> list[tuple[str, str]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return [(r[0], r[1]) for r in conn.execute(select(repo.responses_t.c.tenant, repo.responses_t.c.prompt_hash))]
    finally:
        engine.dispose()


@pytest.mark.slow
def test_generate_killed_then_rerun_loses_and_duplicates_nothing(store_url: str, tmp_path: Path) -> None:
    n_head = 24
    recs = [log_record(f"popular question {i}", tenant=f"t{i % 2}") for i in range(n_head) for _ in range(3)]
    recs += [log_record(f"rare question {i}") for i in range(30)]  # below --min-frequency: never precomputed
    log = write_log(tmp_path / "requests.jsonl", recs)
    server = FakeOpenAI(delay_s=0.25).start()
    args = _cli("generate", "--log", str(log), "--url", store_url, "--model", "tiny", "--model-version", "v1",
                "--endpoint", server.url, "--min-frequency", "3", "--concurrency", "2", "--embedder", "hashing",
                "--no-progress")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        stored: list[tuple[str, str]] = []
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                stored = _responses(store_url)
            except Exception:  # noqa: BLE001 - the schema may not exist yet in the first polls
                stored = []
            if len(stored) >= 5:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"generator finished before the kill: {proc.stdout.read() if proc.stdout else ''}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    before = set(_responses(store_url))
    assert 5 <= len(before) < n_head
    requested_before = len(server.requests)
    server.requests.clear()

    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    after = _responses(store_url)
    assert len(after) == n_head and len(set(after)) == n_head  # every head prompt once
    assert before <= set(after)
    # The rerun asked only for what was missing: nothing stored before the kill was requested again.
    assert len(server.requests) == n_head - len(before)
    assert requested_before >= len(before)
    # Features were not double counted by the rerun.
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        freq = Counter(dict(conn.execute(select(repo.features_t.c.text, repo.features_t.c.frequency)).all()))
        n_emb = conn.execute(select(func.count()).select_from(repo.embeddings_t)).scalar_one()
    engine.dispose()
    assert freq["user: popular question 0"] == 3 and freq["user: rare question 0"] == 1
    assert n_emb == n_head + 30
    third = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and "responses ok 0" in third.stdout, third.stdout + third.stderr


def test_generate_cli_errors_are_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    r = subprocess.run(_cli("generate", "--log", str(tmp_path / "missing.jsonl"), "--url", url),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().startswith("error: request log") and r.stderr.count("\n") == 1
    log = write_log(tmp_path / "log.jsonl", [log_record("x")])
    r = subprocess.run(_cli("generate", "--log", str(log), "--url", "mysql://x/y"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "unsupported database" in r.stderr
    r = subprocess.run(_cli("generate", "--log", str(log), "--url", url, "--endpoint", "http://127.0.0.1:9/v1"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--endpoint needs --model" in r.stderr


def test_generate_endpoint_failures_exit_nonzero_and_lose_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    log = write_log(tmp_path / "log.jsonl", [log_record("a question") for _ in range(3)])
    with log.open("a") as f:
        f.write("this line is not JSON\n")
    server = FakeOpenAI(fail_status=400).start()
    base = _cli("generate", "--log", str(log), "--url", url, "--model", "tiny", "--model-version", "v1",
                "--endpoint", server.url, "--embedder", "none", "--no-progress")
    r = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "1 responses failed" in r.stderr and "bad 1" in r.stdout, r.stdout + r.stderr
    assert len(server.requests) == 1  # a 4xx is not retried
    server.fail_status = None
    r = subprocess.run(base, capture_output=True, text=True, timeout=60)
    server.stop()
    assert r.returncode == 0 and "responses ok 1" in r.stdout and "lines 0" in r.stdout, r.stdout + r.stderr
