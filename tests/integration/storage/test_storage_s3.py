"""s3:// against a real S3-compatible server (moto in server mode): fetch, resume, checksums, include
patterns, one fill for concurrent fetches, uploads, the `llmfleet fetch` command, and the exact init
container the operator renders run against the server."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from podrun import run_init_container
from s3server import S3Server, s3_server

from llmfleet.api import InferenceService
from llmfleet.operator.builders import build_inferenceservice
from llmfleet.operator.config import OperatorConfig
from llmfleet.storage import FetchError, fetch, upload
from llmfleet.storage.s3 import MULTIPART_BYTES

pytestmark = [pytest.mark.integration]

BUCKET = "models"
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b'{"version": "1.0"}' * 50,
    "weights/model-00001.safetensors": os.urandom(3 << 20),
    "empty.txt": b"",
}


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server() as s:
        s.client().create_bucket(Bucket=BUCKET)
        for rel, body in FILES.items():
            s.client().put_object(Bucket=BUCKET, Key=f"llama/{rel}", Body=body)
        yield s


@pytest.fixture
def s3env(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    return server


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".llmfleet-fetch")}


def test_fetch_then_a_second_fetch_moves_nothing(s3env: S3Server, tmp_path: Path) -> None:
    first = fetch(f"s3://{BUCKET}/llama", tmp_path / "m")
    assert _tree(tmp_path / "m") == FILES
    assert first.files == 4 and first.bytes_transferred == sum(map(len, FILES.values())) and first.skipped == 0
    again = fetch(f"s3://{BUCKET}/llama/", tmp_path / "m")
    assert again.bytes_transferred == 0 and again.skipped == 4


def test_resume_continues_a_partial_file(s3env: S3Server, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    dest.joinpath("weights").mkdir(parents=True)
    body = FILES["weights/model-00001.safetensors"]
    etag = hashlib.md5(body).hexdigest()
    # What an interrupted fetch leaves behind: the first megabyte in the partial file of this ETag.
    (dest / "weights" / f"model-00001.safetensors.{etag[:16]}.part").write_bytes(body[: 1 << 20])
    result = fetch(f"s3://{BUCKET}/llama", dest, include=["weights/*"])
    assert result.bytes_transferred == len(body) - (1 << 20)
    assert (dest / "weights" / "model-00001.safetensors").read_bytes() == body
    assert not list(dest.rglob("*.part"))


def test_a_corrupt_partial_file_fails_the_checksum_and_is_removed(s3env: S3Server, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    body = FILES["tokenizer.json"]
    part = dest / f"tokenizer.json.{hashlib.md5(body).hexdigest()[:16]}.part"
    part.write_bytes(b"X" * 10)
    with pytest.raises(FetchError, match="does not match the ETag"):
        fetch(f"s3://{BUCKET}/llama", dest, include=["tokenizer.json"])
    assert not part.exists() and not (dest / "tokenizer.json").exists()
    fetch(f"s3://{BUCKET}/llama", dest, include=["tokenizer.json"])  # the next run starts over and succeeds
    assert (dest / "tokenizer.json").read_bytes() == body


def test_include_patterns_and_single_objects(s3env: S3Server, tmp_path: Path) -> None:
    fetch(f"s3://{BUCKET}/llama", tmp_path / "router", include=["config.json", "tokenizer*.json"])
    assert sorted(_tree(tmp_path / "router")) == ["config.json", "tokenizer.json"]
    fetch(f"s3://{BUCKET}/llama/tokenizer.json", tmp_path / "tok")
    assert _tree(tmp_path / "tok") == {"tokenizer.json": FILES["tokenizer.json"]}
    with pytest.raises(FetchError, match="no objects at this key or under this prefix"):
        fetch(f"s3://{BUCKET}/nothing-here", tmp_path / "none")
    with pytest.raises(FetchError, match="NoSuchBucket"):
        fetch("s3://no-such-bucket/x", tmp_path / "none")


def test_concurrent_fetches_into_one_folder_fill_it_once(s3env: S3Server, tmp_path: Path) -> None:
    results: list[Any] = []

    def run() -> None:
        results.append(fetch(f"s3://{BUCKET}/llama", tmp_path / "shared"))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 3
    assert sum(r.bytes_transferred for r in results) == sum(map(len, FILES.values()))
    assert _tree(tmp_path / "shared") == FILES


def test_upload_multipart_and_fetch_back(s3env: S3Server, tmp_path: Path) -> None:
    src = tmp_path / "export"
    src.mkdir()
    big = os.urandom(MULTIPART_BYTES + (1 << 20))  # two parts: a multipart ETag ("<md5>-2")
    (src / "model.safetensors").write_bytes(big)
    (src / "config.json").write_text("{}")
    upload(src, f"s3://{BUCKET}/exports/v1")
    head = s3env.client().head_object(Bucket=BUCKET, Key="exports/v1/model.safetensors")
    assert head["ETag"].strip('"').endswith("-2")
    fetch(f"s3://{BUCKET}/exports/v1", tmp_path / "back")  # verifies the multipart ETag on the way back
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == big


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmfleet.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


def test_fetch_command_logs_progress_and_fails_in_one_line(server: S3Server, tmp_path: Path) -> None:
    ok = _cli("fetch", f"s3://{BUCKET}/llama", str(tmp_path / "m"), "--progress-every", "0.1", env=server.env)
    assert ok.returncode == 0, ok.stderr
    assert "fetched s3://models/llama: 4/4 files" in ok.stderr and "100%" in ok.stderr
    bad = _cli("fetch", f"s3://{BUCKET}/missing", str(tmp_path / "x"), env=server.env)
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0
    assert bad.stderr.startswith("llmfleet fetch: s3://models/missing: no objects")
    denied = _cli("fetch", f"s3://{BUCKET}/llama", str(tmp_path / "y"),
                  env={**server.env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert denied.returncode == 1 and "llmfleet fetch:" in denied.stderr


def test_the_rendered_init_container_fills_the_model_folder(server: S3Server, tmp_path: Path) -> None:
    """Run the operator's fetch init container as the kubelet would (tests/podrun.py); then the engine's
    --model folder, mounted read-only from the same volume, holds the model."""
    isvc = InferenceService.model_validate({
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u"},
        "spec": {"model": {"path": f"s3://{BUCKET}/llama"},
                 "storage": {"s3": {"endpoint": server.endpoint, "credentialsSecret": "s3-creds",
                                    "addressingStyle": "path"}}},
    })
    deployment = next(m for m in build_inferenceservice(isvc, OperatorConfig()) if m["metadata"]["name"] == "chat-primary")
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    secrets = {"s3-creds": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}}
    proc, folders = run_init_container(init, secrets, tmp_path / "volumes", {"AWS_DEFAULT_REGION": "us-east-1"})
    assert proc.returncode == 0, proc.stderr
    engine = pod["containers"][0]
    argv = engine["command"]
    model_dir = argv[argv.index("--model") + 1]
    engine_mount = next(m for m in engine["volumeMounts"] if m["mountPath"] == model_dir)
    assert engine_mount["readOnly"] is True
    init_mount = next(m for m in init["volumeMounts"] if m["mountPath"] == init["command"][3])  # fetch URI DEST
    assert (engine_mount["name"], engine_mount["subPath"]) == (init_mount["name"], init_mount["subPath"])
    assert _tree(folders[model_dir]) == FILES
