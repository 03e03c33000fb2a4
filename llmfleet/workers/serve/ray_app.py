"""`engine: ray-serve`: a Ray Serve LLM application built from the same vLLM argv.

    python -m llmfleet.workers.serve.ray_app <render_vllm_args(...)>   (started by the serving wrapper)

The argv is parsed with vLLM's own parser, so every knob means the same thing as on the vLLM path; the
engine arguments that differ from vLLM's defaults become `LLMConfig.engine_kwargs`. One Ray Serve replica
per process with Ray's autoscaling off: llmfleet's autoscaler owns the number of pods/processes. Ray Serve's
HTTP proxy listens on --host/--port (the wrapper's private port) and serves the OpenAI API under /v1. Ray's
metrics agent listens on the port the wrapper gives in LLMFLEET_RAY_METRICS_PORT; the wrapper serves vLLM's
series from it on the replica's /metrics (ray_metrics.py).

Needs `pip install 'ray[serve]' pyarrow` (ray.serve.llm); `ray[llm]` itself would pull a GPU vLLM build.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from llmfleet.workers.serve.ray_metrics import RAY_METRICS_PORT_ENV, RAY_METRICS_REPORT_INTERVAL_MS
from llmfleet.workers.serve.worker import split_listen


def llm_config_kwargs(argv: Sequence[str]) -> dict[str, Any]:
    """vLLM argv -> keyword arguments of ray.serve.llm.LLMConfig (imports vllm; not for the operator)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(list(argv))  # type: ignore[no-untyped-call]
    args = AsyncEngineArgs.from_cli_args(ns)
    default = AsyncEngineArgs(model=args.model)
    engine_kwargs = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(AsyncEngineArgs)
        if f.name not in ("model", "served_model_name") and getattr(args, f.name) != getattr(default, f.name)
    }
    for k, v in list(engine_kwargs.items()):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            engine_kwargs[k] = dataclasses.asdict(v)
    served = (args.served_model_name or [args.model])[0] if isinstance(args.served_model_name, list) else (
        args.served_model_name or args.model)
    return {
        "model_loading_config": {"model_id": served, "model_source": args.model},
        "engine_kwargs": engine_kwargs,
        "accelerator_config": {"kind": "gpu" if _has_gpu() else "cpu"},
        # Fixed size, no Ray autoscaling: llmfleet's autoscaler scales pods (or local processes).
        "deployment_config": {"num_replicas": 1, "max_ongoing_requests": 1024},
    }


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def main(argv: Sequence[str] | None = None) -> int:
    rest, host, port = split_listen(list(sys.argv[1:] if argv is None else argv))
    import ray
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    cfg = LLMConfig(**llm_config_kwargs(rest))
    # Logical CPUs are scheduling tokens: the ingress and the LLM server each ask for one, and a 2-core
    # machine would otherwise leave the ingress unscheduled. Real CPU use is the engine's, as on the vLLM path.
    # address="local": each replica is its own Ray instance (the autoscaler scales replicas, not Ray), also when
    # RAY_ADDRESS in the environment names another cluster, which ray.init would otherwise join (and refuse
    # num_cpus there).
    metrics_port = os.environ.get(RAY_METRICS_PORT_ENV)
    ray.init(address="local", num_cpus=max(8, os.cpu_count() or 1), include_dashboard=False, log_to_driver=True,
             _metrics_export_port=int(metrics_port) if metrics_port else None,
             _system_config={"metrics_report_interval_ms": RAY_METRICS_REPORT_INTERVAL_MS})
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_openai_app({"llm_configs": [cfg]}), name="llmfleet", route_prefix="/", blocking=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
