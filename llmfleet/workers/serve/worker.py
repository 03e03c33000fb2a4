"""`python -m llmfleet.workers.serve`: one serving replica (engine process + drain proxy).

    python -m llmfleet.workers.serve --engine vllm --drain-seconds 60 -- <render_vllm_args(...)>

The engine (vLLM's OpenAI server, or the Ray Serve LLM app for `--engine ray-serve`) gets the rendered
argv with --host/--port moved to a private loopback port; the wrapper's DrainProxy listens on the
replica's --host/--port. `/health` is 200 only once the engine answers its own /health and until drain
starts. The wrapper exits with the engine's code if the engine dies (so a supervisor restarts it), and
with 0 after a SIGTERM/SIGINT drain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from llmfleet.api.contracts import (
    KV_BYTES_PER_TOKEN_METRIC,
    MODEL_SHAPE_DIM_LABEL,
    MODEL_SHAPE_METRIC,
    REPLICA_PORT,
)
from llmfleet.plan.models import shape_dims, shape_from_hf_config
from llmfleet.router.kv_tiers import HostTierUnknown, kv_bytes_per_token, load_model_config
from llmfleet.util.net import free_port
from llmfleet.workers.serve.drain import DrainProxy
from llmfleet.workers.serve.ray_metrics import RAY_METRICS_PORT_ENV, vllm_series
from llmfleet.workers.serve.vllm_args import RUNTIME_LORA_ENV, VLLM_ENTRYPOINT

log = logging.getLogger("llmfleet.serve")
RAY_ENTRYPOINT = "llmfleet.workers.serve.ray_app"
# The engine's readiness path: vLLM's /health; Ray Serve's proxy answers /v1/models once the app is deployed.
READY_PATHS = {"vllm": "/health", "ray-serve": "/v1/models"}
ENGINE_STOP_GRACE_S = 20.0


def split_listen(argv: Sequence[str]) -> tuple[list[str], str, int]:
    """Remove --host/--port (both `--x v` and `--x=v`) from an engine argv; return (rest, host, port)."""
    rest: list[str] = []
    host, port = "0.0.0.0", REPLICA_PORT
    it = iter(range(len(argv)))
    for i in it:
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in ("--host", "--port"):
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{name} needs a value")
                val = argv[i + 1]
                next(it, None)
            if name == "--host":
                host = val
            else:
                try:
                    port = int(val)
                except ValueError:
                    raise ValueError(f"--port must be an integer, got {val!r}") from None
        else:
            rest.append(a)
    return rest, host, port


def engine_command(engine: str, argv: Sequence[str], port: int) -> list[str]:
    module = VLLM_ENTRYPOINT if engine == "vllm" else RAY_ENTRYPOINT
    return [sys.executable, "-m", module, *argv, "--host", "127.0.0.1", "--port", str(port)]


def _die_with_parent() -> None:
    """Linux: the engine gets SIGTERM if the wrapper is killed outright, so no engine is orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def engine_env(argv: Sequence[str], ray_metrics_port: int | None = None) -> dict[str, str] | None:
    """The engine's environment: ours, plus runtime adapter loading when LoRA is on, plus the port of Ray's metrics
    agent for a Ray Serve engine (None: inherit as is)."""
    extra = dict(RUNTIME_LORA_ENV) if "--enable-lora" in argv else {}
    if ray_metrics_port is not None:
        extra[RAY_METRICS_PORT_ENV] = str(ray_metrics_port)
    return {**os.environ, **extra} if extra else None


def start_engine(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log.info("starting engine: %s", " ".join(cmd))
    # Own session: a terminal's Ctrl-C reaches the wrapper, which drains before stopping the engine.
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent, env=env)  # noqa: PLW1509


def stop_engine(proc: subprocess.Popen[bytes], grace_s: float = ENGINE_STOP_GRACE_S) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("engine ignored SIGTERM for %.0fs; killing its process group", grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode if proc.returncode is not None else 0


def flag_values(argv: Sequence[str], *names: str) -> dict[str, str]:
    """The first value of each of these flags (`--flag value` or `--flag=value`)."""
    found: dict[str, str] = {}
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        if name in names:
            found.setdefault(name, val if eq else (argv[i + 1] if i + 1 < len(argv) else ""))
    return found


def served_name(argv: Sequence[str]) -> str:
    """--served-model-name (first value), else --model."""
    found = flag_values(argv, "--served-model-name", "--model")
    return found.get("--served-model-name") or found.get("--model", "")


def served_model_metrics(argv: Sequence[str]) -> bytes:
    """The wrapper's own series for /metrics (`kv_cache_metrics`, `model_shape_metrics`), from the served model's
    config.json, read once: the router's and the autoscaler's pods do not have the model folder. Empty for a model
    that is no local folder."""
    try:
        config = load_model_config(flag_values(argv, "--model").get("--model"))
    except HostTierUnknown as e:
        log.info("no %s or %s on /metrics: %s", KV_BYTES_PER_TOKEN_METRIC, MODEL_SHAPE_METRIC, e)
        return b""
    return kv_cache_metrics(argv, config) + model_shape_metrics(config)


def kv_cache_metrics(argv: Sequence[str], config: dict[str, Any]) -> bytes:
    """`llmfleet:kv_cache_bytes_per_token`, from the served model's config.json and the engine's KV dtype and tensor
    parallelism: the router needs it to size a host offload tier in blocks. Empty when it cannot be derived (an MLA
    or state-space model): the router then counts GPU blocks only."""
    f = flag_values(argv, "--kv-cache-dtype", "--dtype", "--tensor-parallel-size", "-tp")
    tp = f.get("--tensor-parallel-size") or f.get("-tp") or "1"
    try:
        per_token = kv_bytes_per_token(config, cache_dtype=f.get("--kv-cache-dtype", "auto"),
                                       model_dtype=f.get("--dtype", "auto"), tensor_parallel_size=int(tp))
    except ValueError as e:  # HostTierUnknown among them
        log.info("no %s on /metrics: %s", KV_BYTES_PER_TOKEN_METRIC, e)
        return b""
    registry = CollectorRegistry()
    Gauge(KV_BYTES_PER_TOKEN_METRIC, "KV-cache bytes per token over all tensor-parallel ranks (from the model's "
          "config.json and the engine's KV dtype)", registry=registry).set(per_token)
    return generate_latest(registry)


def model_shape_metrics(config: dict[str, Any]) -> bytes:
    """`llmfleet:model_shape{dim=...}`: the served model's planner shape from its config.json, one sample per field
    (plan.models.shape_dims). The autoscaler seeds a pool's capacity from it where the pool names no model preset.
    Empty when the planner has no shape for the model (a mixture-of-experts, MLA or state-space model, a separate
    head size)."""
    try:
        shape = shape_from_hf_config(config)
    except ValueError as e:
        log.info("no %s on /metrics: %s", MODEL_SHAPE_METRIC, e)
        return b""
    registry = CollectorRegistry()
    gauge = Gauge(MODEL_SHAPE_METRIC, "The served model's shape as the planner reads it (from its config.json), "
                  f"one sample per field in label {MODEL_SHAPE_DIM_LABEL}", [MODEL_SHAPE_DIM_LABEL], registry=registry)
    for dim, value in shape_dims(shape).items():
        gauge.labels(dim).set(value)
    return generate_latest(registry)


async def _watch_ready(proxy: DrainProxy, upstream: str, proc: subprocess.Popen[bytes], engine: str,
                       model: str) -> None:
    """Mark the proxy ready once the engine can serve (then /health passes through to its health path).

    vLLM: its /health. Ray Serve: the ingress answers before the LLM deployment has loaded the engine, so
    readiness is a one-token completion that went all the way through.
    """
    probe: tuple[str, str, dict[str, object] | None] = (
        ("GET", proxy.health_path, None) if engine == "vllm"
        else ("POST", "/v1/completions", {"model": model, "prompt": "ready?", "max_tokens": 1})
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        while proc.poll() is None and not proxy.engine_ready:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                async with s.request(probe[0], upstream + probe[1], json=probe[2]) as r:
                    if r.status == 200:
                        proxy.engine_ready = True
                        log.info("engine ready")
                        return
            await asyncio.sleep(0.5)


async def serve(engine: str, engine_argv: Sequence[str], drain_seconds: float) -> int:
    argv, host, port = split_listen(engine_argv)
    inner = free_port()
    upstream = f"http://127.0.0.1:{inner}"
    # Ray Serve: vLLM's series come from Ray's metrics agent, under Ray's names (ray_metrics.py)
    ray_metrics_port = free_port() if engine == "ray-serve" else None
    proxy = DrainProxy(upstream, health_path=READY_PATHS[engine], extra_metrics=served_model_metrics(argv),
                       metrics_url=None if ray_metrics_port is None else f"http://127.0.0.1:{ray_metrics_port}/metrics",
                       metrics_filter=None if ray_metrics_port is None else vllm_series)
    runner = web.AppRunner(proxy.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    log.info("replica listening on %s:%d (engine %s on %s)", host, port, engine, upstream)
    proc = start_engine(engine_command(engine, argv, inner), engine_env(argv, ray_metrics_port))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready_task = asyncio.create_task(_watch_ready(proxy, upstream, proc, engine, served_name(argv)))
    code = 0
    try:
        while not stop.is_set():
            if proc.poll() is not None:
                code = proc.returncode or 1
                log.error("engine exited with code %s; replica exits", proc.returncode)
                return code
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
        await proxy.drain(drain_seconds)
        return 0
    finally:
        ready_task.cancel()
        await loop.run_in_executor(None, stop_engine, proc)
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmfleet.workers.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["vllm", "ray-serve"], default="vllm")
    p.add_argument("--drain-seconds", type=float, default=60.0, help="Deadline for in-flight requests on SIGTERM.")
    p.add_argument("engine_args", nargs=argparse.REMAINDER, help="-- then the engine's arguments (render_vllm_args).")
    ns = p.parse_args(argv)
    rest = list(ns.engine_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if "--model" not in {a.split("=", 1)[0] for a in rest}:
        p.error("engine arguments must include --model (pass them after --)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s llmfleet.serve %(levelname)s %(message)s")
    try:
        return asyncio.run(serve(ns.engine, rest, ns.drain_seconds))
    except ValueError as err:
        print(f"llmfleet.workers.serve: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"llmfleet.workers.serve: cannot listen: {err}", file=sys.stderr)
        return 1
