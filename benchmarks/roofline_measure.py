"""Measure on a GPU what the planner predicts: memory-bound decode, the cost of materialized attention,
CUDA graphs vs eager launches. Writes benchmarks/results/roofline_measure.json.

    python benchmarks/roofline_measure.py            # on a CUDA GPU (H200 in the docs)
    python benchmarks/roofline_measure.py --tiny     # CPU smoke test of the script

1. Decode step of a Llama-3-8B-shaped stack (32 layers of bf16 q/k/v/o + SwiGLU weights, random values,
   no attention over a cache): time per step at batch 1..512, achieved HBM bandwidth (weight bytes / time)
   and TFLOP/s, next to the planner's roofline for the same batch.
2. The same step captured in a CUDA graph (one launch per step instead of ~10 per layer).
3. One attention layer (32 heads x 128, causal, batch 1) at S = 2k..32k: materialized
   (QK^T -> softmax -> PV, scores in HBM) vs torch SDPA (FlashAttention backend): time and peak memory.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch
    import torch.nn.functional as F

    try:  # the planner needs pydantic; the GPU machine's torch venv may not have it
        from llmfleet.plan.hardware import get_gpu
        from llmfleet.plan.models import get_model
        from llmfleet.plan.roofline import decode_roofline
        have_planner = True
    except ImportError:
        have_planner = False

    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/roofline_measure.json"))
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    layers, d, kv, ffn = (32, 4096, 1024, 14336) if not args.tiny else (2, 256, 64, 512)  # Llama-3-8B

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    def timeit(fn, iters: int = 20) -> float:  # type: ignore[no-untyped-def]
        for _ in range(3):
            fn()
        sync()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        return (time.perf_counter() - t) / iters

    torch.manual_seed(0)
    W = [(torch.randn(d, d + 2 * kv, device=dev, dtype=dt) * 0.01, torch.randn(d, d, device=dev, dtype=dt) * 0.01,
          torch.randn(d, 2 * ffn, device=dev, dtype=dt) * 0.01, torch.randn(ffn, d, device=dev, dtype=dt) * 0.01)
         for _ in range(layers)]
    wbytes = sum(w.numel() * w.element_size() for ws in W for w in ws)

    def step(x: torch.Tensor) -> torch.Tensor:
        for qkv, o, up, down in W:
            h = x @ qkv
            x = x + h[:, :d] @ o
            gu = x @ up
            x = x + (F.silu(gu[:, :ffn]) * gu[:, ffn:]) @ down
        return x

    decode = []
    for b in ((1, 8, 32, 64, 128, 256, 512) if not args.tiny else (1, 8)):
        x = torch.randn(b, d, device=dev, dtype=dt)
        with torch.no_grad():
            t_eager = timeit(lambda x=x: step(x))
            t_graph = None
            if dev == "cuda":
                static = x.clone()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    step(static)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step(static)
                t_graph = timeit(graph.replay)
        flops = 2.0 * b * sum(w.numel() for ws in W for w in ws)
        plan = decode_roofline(get_model("llama-3-8b"), get_gpu("H200"), b, 0) if have_planner and not args.tiny else None
        best = min(t for t in (t_eager, t_graph) if t is not None)
        decode.append({"batch": b, "eagerMs": t_eager * 1e3, "cudaGraphMs": None if t_graph is None else t_graph * 1e3,
                       "achievedTBs": wbytes / best / 1e12, "achievedTflops": flops / best / 1e12,
                       "plannerRooflineMs": None if plan is None else plan.time_s * 1e3,
                       "plannerBound": None if plan is None else plan.bound})
        print(json.dumps(decode[-1]))
    W.clear()
    attn = []
    heads, hd = (32, 128) if not args.tiny else (4, 32)
    for s_len in ((2048, 4096, 8192, 16384, 32768) if not args.tiny else (256, 512)):
        q, k, v = (torch.randn(1, heads, s_len, hd, device=dev, dtype=dt) for _ in range(3))

        def materialized(q=q, k=k, v=v, s_len=s_len) -> torch.Tensor:  # type: ignore[no-untyped-def]
            sc = (q @ k.transpose(-1, -2)) * hd ** -0.5
            causal = torch.ones(s_len, s_len, device=dev, dtype=torch.bool).triu(1)
            sc = sc.masked_fill(causal, float("-inf"))
            return torch.softmax(sc.float(), dim=-1).to(q.dtype) @ v

        def fused(q=q, k=k, v=v) -> torch.Tensor:  # type: ignore[no-untyped-def]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        row: dict[str, float | int | None] = {"seqLen": s_len}
        for name, fn in (("materialized", materialized), ("fused", fused)):
            try:
                if dev == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                with torch.no_grad():
                    row[f"{name}Ms"] = timeit(fn, iters=5) * 1e3
                if dev == "cuda":
                    row[f"{name}PeakExtraMiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            except torch.OutOfMemoryError:
                row[f"{name}Ms"] = None
                row[f"{name}PeakExtraMiB"] = None
        attn.append(row)
        print(json.dumps(row))
        del q, k, v
    out = {"benchmark": "roofline_measure", "command": "python " + " ".join(sys.argv),
           "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "torch": torch.__version__,
                       "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"},
           "weightBytes": wbytes, "decode": decode, "attention": attn}
    if not args.tiny:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
