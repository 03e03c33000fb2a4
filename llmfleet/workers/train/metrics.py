"""FLOPs accounting (MFU/HFU), the Prometheus endpoint and /status, and straggler detection.

FLOPs per token follow PaLM (Chowdhery et al. 2022), appendix B: 6N + 12·L·H·Q·T, where N counts the
parameters that do matrix work (all but the input embedding lookup), L layers, H heads, Q head dim,
T sequence length. HFU adds the forward recomputed by activation checkpointing: 2·N_block + 4·H·Q·T
per token for every checkpointed block.
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

from llmfleet.workers.train.model import ModelArgs

# Dense bf16 peak TFLOP/s per GPU (vendor datasheets, without sparsity); matched by substring of the
# device name, first match wins. Override with metrics.peakTflops or LLMFLEET_PEAK_TFLOPS.
GPU_PEAK_TFLOPS: list[tuple[str, float]] = [
    ("H200", 989.0), ("H100", 989.0), ("H800", 989.0), ("GH200", 989.0), ("B200", 2250.0), ("B100", 1750.0),
    ("A100", 312.0), ("A800", 312.0), ("A10G", 70.0), ("A10", 125.0), ("L40S", 362.0), ("L40", 181.0),
    ("L4", 121.0), ("V100", 125.0), ("T4", 65.0), ("MI300X", 1307.0), ("MI250", 362.0),
]


def peak_tflops(device_name: str | None, override: float | None = None) -> float | None:
    if override:
        return override
    env = os.environ.get("LLMFLEET_PEAK_TFLOPS")
    if env:
        return float(env)
    if not device_name:
        return None
    name = device_name.upper()
    for key, value in GPU_PEAK_TFLOPS:
        if key in name:
            return value
    return None


def matmul_params(args: ModelArgs) -> int:
    """N of PaLM's 6N: every parameter except the input embedding table (a lookup, not a matmul)."""
    n = args.num_params()
    return n if args.tie_embeddings else n - args.vocab * args.hidden


def block_params(args: ModelArgs) -> int:
    d, q = args.hidden, args.head_dim
    return d * args.heads * q * 2 + d * args.kv_heads * q * 2 + 3 * d * args.ffn + 2 * d


def attention_flops_per_token(args: ModelArgs) -> int:
    """12·L·H·Q·T (forward + backward of QK^T and AV, counted as full S x S as PaLM does)."""
    t = min(args.seq_len, args.sliding_window) if args.sliding_window else args.seq_len
    return 12 * args.layers * args.heads * args.head_dim * t


def model_flops_per_token(args: ModelArgs) -> int:
    return 6 * matmul_params(args) + attention_flops_per_token(args)


def recomputed_blocks(layers: int, activation_checkpointing: str) -> int:
    if activation_checkpointing == "full":
        return layers
    if activation_checkpointing == "selective":
        return (layers + 1) // 2  # blocks 0, 2, 4, ...
    return 0


def hardware_flops_per_token(args: ModelArgs, activation_checkpointing: str) -> int:
    """Model FLOPs plus one extra forward of each checkpointed block."""
    t = min(args.seq_len, args.sliding_window) if args.sliding_window else args.seq_len
    per_block_fwd = 2 * block_params(args) + 4 * args.heads * args.head_dim * t
    return model_flops_per_token(args) + recomputed_blocks(args.layers, activation_checkpointing) * per_block_fwd


def utilization(flops_per_token: int, tokens_per_second_per_device: float, peak: float | None) -> float | None:
    """Fraction of peak (peak in TFLOP/s per device)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_second_per_device / (peak * 1e12)


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
