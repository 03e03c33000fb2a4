"""engine: ray-serve — the same argv as a Ray Serve LLM app behind the serving wrapper (runs when ray is installed)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from openai import OpenAI

from llmfleet.autoscaler.signals import agreed_shape, shape_samples
from llmfleet.plan.models import shape_from_hf_config
from llmfleet.router.kv_events import batch_events
from llmfleet.router.replicas import parse_vllm_metrics
from llmfleet.util.net import free_port
from llmfleet.util.prom_text import parse_samples
from tests.polling import poll

from .conftest import stop, tiny_service, wait_healthy

# find_spec on top-level names does not import them: importing ray here would install ray's JSON log
# formatter on the root logger of the whole pytest process (the replica runs ray in its own process).
if importlib.util.find_spec("ray") is None or importlib.util.find_spec("pyarrow") is None:
    pytest.skip("ray[serve] (+ pyarrow) not installed: pip install -e '.[ray]'", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def test_ray_serve_replica_serves_and_drains(tiny_primary: Path, tmp_path: Path) -> None:
    from llmfleet.workers.serve.vllm_args import serve_command

    isvc = tiny_service(str(tiny_primary)).model_copy(deep=True)
    isvc.spec.engine = "ray-serve"
    assert isvc.publishes_kv_events(isvc.pools()[0])  # on by default, as for engine vllm
    port, events_port = free_port(), free_port()
    cmd = serve_command(isvc, isvc.pools()[0], port=port, host="127.0.0.1", python=sys.executable,
                        kv_events_port=events_port)  # the default port would collide on a shared host
    assert cmd[cmd.index("--engine") + 1] == "ray-serve"
    # the router's subscription to the replica's KV-cache events, connected before the engine binds (ZMQ retries)
    events = zmq.Context.instance().socket(zmq.SUB)
    events.connect(f"tcp://127.0.0.1:{events_port}")
    events.setsockopt(zmq.SUBSCRIBE, b"")
    events.setsockopt(zmq.RCVTIMEO, 1000)
    # RAY_ADDRESS naming a cluster that is not there: the replica still starts its own Ray instance
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "RAY_ADDRESS": f"127.0.0.1:{free_port()}"}
    log = tmp_path / "ray.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        c = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        msgs: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, extra_body={"ignore_eos": True})
        assert r.usage is not None and r.usage.completion_tokens == 4

        def stored_blocks() -> int | None:
            with contextlib.suppress(zmq.Again):
                batch = msgspec.msgpack.decode(events.recv_multipart()[-1])
                return sum(1 for e in batch_events(batch) if e.get("type") == "BlockStored") or None
            return None

        # vLLM's engine inside Ray Serve publishes the blocks it cached for the request, as the router reads them
        assert poll("a BlockStored event from the ray-serve replica", stored_blocks, timeout=30, interval=0)
        # /metrics: vLLM's series from Ray's metrics agent under vLLM's names, which the router and the autoscaler
        # read for both engines, and the wrapper's own gauges (the served model's shape)
        prompt_tokens = r.usage.prompt_tokens

        def scraped() -> tuple[dict[str, float], str] | None:
            text = httpx.get(url + "/metrics", timeout=10).text
            load = parse_vllm_metrics(text)
            return (load, text) if load.get("prefix_queries", 0) >= prompt_tokens else None

        load, text = poll("Ray's export of vLLM's prefix-cache queries on /metrics", scraped, timeout=60, interval=1)
        assert {"running", "waiting", "kv_usage", "cache_capacity_blocks"} <= load.keys() and "ray_" not in text
        assert any(name == "vllm:time_to_first_token_seconds_count" for name, _ in parse_samples(text))
        config = json.loads((tiny_primary / "config.json").read_text())
        assert agreed_shape([shape_samples(parse_samples(text))]) == shape_from_hf_config(config)
        stream = iter(c.completions.create(model="tiny", prompt="def f():", max_tokens=60, stream=True,
                                           extra_body={"ignore_eos": True}))
        next(stream)
        proc.send_signal(signal.SIGTERM)
        rest = list(stream)
        assert rest[-1].choices[0].finish_reason == "length"
        assert proc.wait(timeout=120) == 0
    finally:
        events.close(linger=0)
        stop(proc)
