"""`llmfleet up/down/status/model` input errors: one line, non-zero exit, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.local.dashboard import Collector, quantile

runner = CliRunner()


def _write(tmp: Path, spec: dict[str, object], kind: str = "InferenceService") -> Path:
    p = tmp / "m.yaml"
    p.write_text(yaml.safe_dump({"apiVersion": "llmfleet.io/v1alpha1", "kind": kind, "metadata": {"name": "x"},
                                 "spec": spec}))
    return p


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"model": {"path": "/m"}, "vllm": {"blockSize": 16}}, "blockSize 16 cannot run on CPU"),
        ({"model": {"path": "/m"}, "vllm": {"blockSize": 32, "extraArgs": ["--port", "1"]}}, "extraArgs sets --port"),
        ({"model": {"path": "tiny://nope"}, "vllm": {"blockSize": 32}}, "unknown tiny model 'tiny://nope'"),
        ({"model": {}}, "spec.model.path"),
        ({"model": {"path": "/nonexistent/model"}}, "model path '/nonexistent/model' of pool primary does not exist"),
        ({"model": {"path": "pvc://models/llama"}}, "pvc:// claims exist only on Kubernetes"),
        ({"model": {"path": "s3://B/x"}}, "bucket name"),
    ],
)
def test_up_rejects_bad_spec(tmp_path: Path, spec: dict[str, object], needle: str) -> None:
    res = runner.invoke(app, ["up", "-f", str(_write(tmp_path, spec)), "--run-dir", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert needle in res.output
    assert not (tmp_path / "run" / "state.json").exists()


def test_up_rejects_trainingjob_and_missing_file(tmp_path: Path) -> None:
    res = runner.invoke(app, ["up", "-f", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "missing.yaml" in res.output
    job = _write(tmp_path, {"model": {}}, kind="TrainingJob")
    res = runner.invoke(app, ["up", "-f", str(job)])
    assert res.exit_code == 2


def test_down_and_status_without_run(tmp_path: Path) -> None:
    res = runner.invoke(app, ["down", "--run-dir", str(tmp_path)])
    assert res.exit_code == 1 and "nothing is running" in res.output
    res = runner.invoke(app, ["status", "--run-dir", str(tmp_path)])
    assert res.exit_code == 1


def test_example_manifest_is_valid_for_the_local_runtime() -> None:
    from llmfleet.api import InferenceService, load_manifest
    from llmfleet.workers.serve.vllm_args import render_vllm_args

    isvc = load_manifest(Path(__file__).parents[2] / "examples" / "local" / "inferenceservice.yaml")
    assert isinstance(isvc, InferenceService)
    assert [p.name for p in isvc.pools()] == ["primary", "student"]
    for pool in isvc.pools():
        render_vllm_args(isvc, pool)
    assert isvc.spec.router.block_size_tokens == isvc.spec.vllm.block_size


def test_quantile_and_collector_window() -> None:
    assert quantile(0.5, {0.1: 0, 0.2: 10, float("inf"): 10}) == pytest.approx(0.15)
    assert quantile(0.5, {}) is None
    m1 = ("vllm:request_success_total 10\nvllm:prefix_cache_hits_total 100\nvllm:prefix_cache_queries_total 200\n"
          'vllm:time_to_first_token_seconds_bucket{le="0.1"} 0\nvllm:time_to_first_token_seconds_bucket{le="+Inf"} 0\n')
    m2 = ("vllm:request_success_total 20\nvllm:prefix_cache_hits_total 190\nvllm:prefix_cache_queries_total 300\n"
          'vllm:time_to_first_token_seconds_bucket{le="0.1"} 10\nvllm:time_to_first_token_seconds_bucket{le="+Inf"} 10\n')
    c = Collector()
    c.update([m1], None, now=100.0)
    w = c.update([m2], None, now=105.0)
    assert w.qps == pytest.approx(2.0)
    assert w.hit_rate == pytest.approx(0.9)
    assert w.ttft_p50_ms == pytest.approx(50.0)
