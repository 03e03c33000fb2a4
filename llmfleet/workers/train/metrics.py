"""MFU/HFU of the running job, the Prometheus endpoint and /status, and straggler detection.

FLOPs per token and the GPU peak table live in the planner (llmfleet.plan.training, llmfleet.plan.hardware).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from llmfleet.plan.hardware import bf16_peak_tflops
from llmfleet.plan.training import flops_utilization


def peak_tflops(device_name: str | None, override: float | None = None) -> float | None:
    """Peak dense bf16 TFLOP/s per device: `override` (metrics.peakTflops), LLMFLEET_PEAK_TFLOPS, else the table."""
    if override:
        return override
    env = os.environ.get("LLMFLEET_PEAK_TFLOPS")
    if env:
        return float(env)
    return bf16_peak_tflops(device_name)


def utilization(flops_per_token: int, tokens_per_second_per_device: float, peak: float | None) -> float | None:
    """Fraction of peak (peak in TFLOP/s per device); None without a peak."""
    if not peak:
        return None
    return flops_utilization(flops_per_token, tokens_per_second_per_device, peak * 1e12)


def stragglers(step_times: list[float], factor: float, min_gap: float = 0.0) -> list[int]:
    """Ranks whose time exceeds the median of the *other* ranks by `factor` (and by at least `min_gap`
    seconds). Leaving the rank itself out keeps a slow rank from raising its own baseline (with two ranks
    the median would be the mean of both)."""
    if len(step_times) < 2:
        return []
    slow = []
    for r, t in enumerate(step_times):
        med = statistics.median(step_times[:r] + step_times[r + 1:])
        if med > 0 and t > factor * med and t - med > min_gap:
            slow.append(r)
    return slow


class TrainMetrics:
    """Prometheus gauges (prefix llmfleet_train_) in a private registry."""

    def __init__(self, rank: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        lbl = {"rank": str(rank)}

        def g(name: str, doc: str) -> Any:
            return Gauge(f"llmfleet_train_{name}", doc, ["rank"], registry=self.registry).labels(**lbl)

        self.step = g("step", "Last completed optimizer step.")
        self.loss = g("loss", "Training loss of the last step (mean over ranks).")
        self.tokens_per_second = g("tokens_per_second", "Tokens per second across all ranks.")
        self.step_seconds = g("step_seconds", "Wall time of this rank's last step.")
        self.grad_norm = g("grad_norm", "Global gradient norm before clipping.")
        self.mfu = g("mfu", "Model FLOPs utilization (0-1, PaLM appendix B).")
        self.hfu = g("hfu", "Hardware FLOPs utilization (0-1, includes recomputation).")
        self.memory_bytes = g("memory_peak_bytes", "Peak accelerator memory allocated on this rank.")
        self.lr = g("learning_rate", "Current learning rate.")
        self.stragglers = g("stragglers", "Ranks currently flagged as stragglers.")
        self.kl = g("distill_kl", "KL(teacher || student) of the last step, when distilling.")
        self.tokens = Counter("llmfleet_train_tokens", "Tokens trained on by this rank.", ["rank"],
                              registry=self.registry).labels(**lbl)
        self.checkpoints = Counter("llmfleet_train_checkpoints", "Checkpoints saved.", ["rank"],
                                   registry=self.registry).labels(**lbl)


class MetricsServer:
    """GET /metrics on every rank; GET /status (JSON) where `status` is given (rank 0)."""

    def __init__(self, metrics: TrainMetrics, port: int, status: Callable[[], dict[str, Any]] | None = None) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
                elif path == "/status" and status is not None:
                    body, ctype, code = json.dumps(status()).encode(), "application/json", 200
                elif path in ("/health", "/healthz"):
                    body, ctype, code = b'{"ok": true}', "application/json", 200
                else:
                    body, ctype, code = json.dumps({"error": f"not found: {path}"}).encode(), "application/json", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # silence per-request logs
                return

        self.httpd = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="metrics-http")
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def write_status(folder: str | Path, status: dict[str, Any]) -> None:
    """Atomically write status.json (the operator reads it)."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".status.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(status, indent=2))
    os.replace(tmp, root / "status.json")
