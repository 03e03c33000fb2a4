"""A real Prometheus server scrapes a fake router+replica (prometheus-client); the autoscaler queries it."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from llmfleet.api.contracts import MODEL_SHAPE_DIM_LABEL, MODEL_SHAPE_METRIC
from llmfleet.autoscaler.policy import PolicyConfig, PolicyState, PoolBounds, decide
from llmfleet.autoscaler.signals import PoolRef, PrometheusSignals
from llmfleet.plan.models import PRESETS, shape_dims
from llmfleet.util.net import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.prometheus,
    pytest.mark.slow,  # a real Prometheus start plus a few scrape intervals: ~30 s
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary (apt-get install prometheus)"),
]


class FakeFleet:
    """Router and vLLM series of a pool under steady load, served by prometheus-client."""

    def __init__(self) -> None:
        self.reg = CollectorRegistry()
        self.requests = Counter("llmfleet_router_requests_total", "requests", ["pool", "degraded"], registry=self.reg)
        self.ttft = Histogram("llmfleet_router_ttft_seconds", "ttft", ["pool"], registry=self.reg,
                              buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0))
        self.inp = Histogram("llmfleet_router_input_tokens", "in", ["pool"], registry=self.reg, buckets=(1024, 4096))
        self.out = Histogram("llmfleet_router_output_tokens", "out", ["pool"], registry=self.reg, buckets=(128, 512))
        self.powers = Counter("llmfleet_router_input_tokens_power_total", "sum of powers", ["pool", "power"],
                              registry=self.reg)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", registry=self.reg)
        self.running = Gauge("vllm:num_requests_running", "running", registry=self.reg)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV cache usage", registry=self.reg)
        shape = Gauge(MODEL_SHAPE_METRIC, "model shape", [MODEL_SHAPE_DIM_LABEL], registry=self.reg)
        for dim, value in shape_dims(PRESETS["llama-3-8b"]).items():  # what the serving wrapper adds
            shape.labels(dim).set(value)
        self.waiting.set(7)
        self.running.set(3)
        self.kv.set(0.25)
        self.stop = threading.Event()
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.reg)
        self.port = self.server.server_port
        self.load = threading.Thread(target=self._load, daemon=True)
        self.load.start()

    def _load(self) -> None:
        while not self.stop.wait(0.05):  # ~20 req/s
            self.requests.labels("primary", "false").inc()
            self.ttft.labels("primary").observe(0.3)
            for prompt in (1000, 3000):  # two requests per tick: mean 2,000, E[L^k] = (1000^k + 3000^k) / 2
                self.inp.labels("primary").observe(prompt)
                for k in (2, 3, 4):
                    self.powers.labels("primary", str(k)).inc(prompt ** k)
            self.out.labels("primary").observe(200)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fleet() -> Iterator[FakeFleet]:
    f = FakeFleet()
    yield f
    f.close()


@pytest.fixture(scope="module")
def prometheus(fleet: FakeFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("prom")
    cfg = d / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "- job_name: fake\n"
        f"  static_configs: [{{targets: ['127.0.0.1:{fleet.port}'],"
        " labels: {llmfleet_io_inferenceservice: chat, llmfleet_io_pool: primary}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={d / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(d / "prom.log").open("w"),
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def poll(sig: PrometheusSignals, pool: PoolRef, ok, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = (await sig.collect([pool]))[0]
        if ok(last):
            return last
        await asyncio.sleep(1.0)
    raise AssertionError(f"condition not met in {timeout} s; last signals: {last}")


async def test_signals_from_prometheus_drive_the_policy(fleet: FakeFleet, prometheus: str) -> None:
    sig = PrometheusSignals(prometheus, "chat", window="15s", stale_after_s=5.0, timeout_s=5.0)
    pool = PoolRef("primary", "primary", replicas=1, ready_replicas=1)
    s = await poll(sig, pool, lambda s: not s.stale and s.arrival_rate and s.arrival_rate > 10 and s.ttft_p95_ms and s.queue_depth)
    assert 10 < s.arrival_rate <= 25  # type: ignore[operator]
    assert s.queue_depth == 7 and s.running == 3
    assert s.kv_utilization == pytest.approx(0.25) and s.kv_full_sequences == pytest.approx(12.0)  # 3 in a quarter
    assert 250 <= s.ttft_p95_ms <= 500  # type: ignore[operator]  # inside the (0.25, 0.5] bucket
    assert s.mean_input_tokens == pytest.approx(2000, rel=0.01)
    assert s.mean_output_tokens == pytest.approx(200, rel=0.01)
    assert s.input_tokens_moments == pytest.approx(tuple((1000 ** k + 3000 ** k) / 2 for k in (2, 3, 4)), rel=0.01)
    assert s.model_shape == PRESETS["llama-3-8b"]  # the replicas' reported shape, through PromQL
    cfg = PolicyConfig(policy="slo", pools=(PoolBounds("primary", "primary", 1, 20, 1),), ttft_slo_ms=1000.0)
    d = decide(cfg, [s], PolicyState())
    assert d.pools["primary"].action == "up" and d.pools["primary"].desired > 1

    # the fleet stops reporting: the signals go stale and the policy holds (never scales down)
    fleet.close()
    s = await poll(sig, pool, lambda s: s.stale)
    d = decide(cfg, [s], PolicyState())
    assert d.pools["primary"].desired == 1 and d.pools["primary"].action == "hold"


async def test_unreachable_prometheus_is_stale() -> None:
    sig = PrometheusSignals(f"http://127.0.0.1:{free_port()}", "chat", timeout_s=1.0)
    s = (await sig.collect([PoolRef("primary", "primary", 2, 2)]))[0]
    assert s.stale and s.arrival_rate is None
