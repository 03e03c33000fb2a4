"""Measure on a GPU what the planner predicts: memory-bound decode, the cost of materialized attention,
CUDA graphs vs eager launches, the host<->device copy bandwidth. Writes benchmarks/results/roofline_measure.json.

    python benchmarks/roofline_measure.py                      # all sections on a CUDA GPU (H200 in the docs)
    python benchmarks/roofline_measure.py --only host-link     # section 4 alone, merged into the existing JSON
    python benchmarks/roofline_measure.py --only prefill       # section 5 alone, merged into the existing JSON
    python benchmarks/roofline_measure.py --only mixed         # section 6 alone, merged into the existing JSON
    python benchmarks/roofline_measure.py --tiny               # CPU smoke test of the script

1. Decode step of a Llama-3-8B-shaped stack (32 layers of bf16 q/k/v/o + SwiGLU weights, random values,
   no attention over a cache): time per step at batch 1..512, achieved HBM bandwidth (weight bytes / time)
   and TFLOP/s, next to the planner's roofline for the same batch.
2. The same step captured in a CUDA graph (one launch per step instead of ~10 per layer).
3. One attention layer (32 heads x 128, causal, batch 1) at S = 2k..32k: materialized
   (QK^T -> softmax -> PV, scores in HBM) vs torch SDPA (FlashAttention backend): time and peak memory.
4. Host<->device copies (what CPU KV-cache offloading waits on when it loads cached blocks back instead of
   recomputing the prefill): pinned and pageable host memory, 2 MiB..1 GiB, and one 64 MiB transfer
   issued as one copy vs many block-sized copies. See host_link().
5. Prefill of one sequence through the same stack with RMSNorm, GQA (32 query / 8 KV heads) and causal FlashAttention
   (SDPA), at 512..32k new tokens, with and without a cached prefix (the new tokens attend to it as well): what the
   simulator's step-cost model (`StepCostModel.build`, planner defaults) predicts for each, and the share of the
   bf16 peak the whole prefill and its attention reached. Where the planner imports (pydantic; not in the GPU image)
   those columns are added by `--only prefill-model` on the merged JSON. See prefill().
6. A prefill batched into a decode step: the section-1 stack over a decode batch (64, 256) and a prefill (128 to 8k
   tokens) in one step, against each alone: what the prefill adds to the step, next to its time alone and its
   FLOPs at the largest prefill's rate. See mixed().
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


MiB = 2**20
HOST_LINK_SIZES = (2 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB)
# One 512-token KV block of Llama-3-8B in bf16: K and V x 32 layers x 8 KV heads x 128 dims x 2 bytes x 512 tokens.
KV_BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * 512  # = 64 MiB
# The 64 MiB block moved as one copy, as 64 copies of 1 MiB, and as 1024 copies of 64 KiB (one layer's K+V
# of a 16-token vLLM block: 2 x 8 x 128 x 2 bytes x 16), the copy counts a block-wise offload would issue.
KV_CHUNKS = (KV_BLOCK_BYTES, 1 * MiB, 64 * 1024)


def _time_copies(torch, copies: Sequence[Callable[[], object]], cuda: bool, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Median seconds for one pass over `copies`: timed by CUDA events (wall clock without CUDA), and by the
    host's wall clock around the same region (it includes the Python launch cost of each copy)."""
    for _ in range(2):  # warm-up: first-touch of pages, driver staging buffers
        for fn in copies:
            fn()
    if cuda:
        torch.cuda.synchronize()
    event_s, wall_s = [], []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for fn in copies:
                fn()
            end.record()
            end.synchronize()
            wall_s.append(time.perf_counter() - t0)
            event_s.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            for fn in copies:
                fn()
            wall_s.append(time.perf_counter() - t0)
            event_s.append(wall_s[-1])
    return statistics.median(event_s), statistics.median(wall_s)


def _pcie_link() -> dict[str, str]:
    """The GPU's PCIe link as nvidia-smi reports it (read after the copies: an idle link may train down)."""
    query = "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    try:
        res = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError) as e:  # no nvidia-smi, a field this driver lacks, a hang
        return {"error": f"{type(e).__name__}: {e}"}
    return dict(zip(query.split(","), (v.strip() for v in res.stdout.splitlines()[0].split(",")), strict=False))


def host_link(torch, tiny: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Section 4: host<->device copy bandwidth, the link CPU KV-cache offloading loads blocks back over.

    For each host memory kind (pinned: torch.empty(pin_memory=True) with non_blocking copies, the DMA path an
    offloading engine uses; pageable: plain torch.empty with blocking copies, which the driver stages through
    its own pinned buffer) and each size, the median over repeats of a CUDA-event-timed run of back-to-back
    copies (enough copies that one timing covers >= 64 MiB). Every copy's result is checked against its
    source (random bytes; the destination is poisoned first). GB/s are 1e9 bytes/s. Without CUDA (--tiny on a
    CPU machine) the pageable rows time CPU->CPU copies so the code path runs; the pinned rows are skipped.
    """
    cuda = torch.cuda.is_available() and not tiny
    dev = "cuda" if cuda else "cpu"
    sizes = HOST_LINK_SIZES if not tiny else (64 * 1024, 1 * MiB)
    repeats = 9 if not tiny else 3
    cap = max(sizes)
    gen = torch.Generator(device=dev).manual_seed(0)
    dev_src = torch.randint(0, 256, (cap,), dtype=torch.uint8, device=dev, generator=gen)
    dev_dst = torch.empty(cap, dtype=torch.uint8, device=dev)
    kinds = ("pinned", "pageable") if cuda else ("pageable",)
    rows: list[dict[str, Any]] = []
    host: dict[str, tuple[Any, Any]] = {}
    for kind in kinds:
        pinned = kind == "pinned"
        h_src = torch.empty(cap, dtype=torch.uint8, pin_memory=pinned)
        h_src.copy_(dev_src)
        h_dst = torch.empty(cap, dtype=torch.uint8, pin_memory=pinned)
        host[kind] = (h_src, h_dst)
        for n in sizes:
            inner = max(1, (64 * MiB) // n)
            for direction, dst, src, check in (("h2d", dev_dst, h_src, dev_src), ("d2h", h_dst, dev_src, h_src)):
                dst[:n].fill_(0)

                def copy(dst=dst, src=src, n=n, pinned=pinned) -> object:  # type: ignore[no-untyped-def]
                    return dst[:n].copy_(src[:n], non_blocking=pinned)

                ev, wall = _time_copies(torch, [copy] * inner, cuda, repeats)
                if cuda:
                    torch.cuda.synchronize()
                if not torch.equal(dst[:n], check[:n]):
                    raise RuntimeError(f"{kind} {direction} copy of {n} bytes does not match its source")
                rows.append({"memory": kind, "direction": direction, "bytes": n, "copiesPerTiming": inner,
                             "ms": ev * 1e3 / inner, "gbs": n * inner / ev / 1e9, "wallGbs": n * inner / wall / 1e9})
                print(json.dumps(rows[-1]))
    chunked = _chunked_copies(torch, host["pinned" if cuda else "pageable"], dev_src, dev_dst, cuda, tiny, repeats)
    link = _pcie_link() if cuda else {}
    del dev_src, dev_dst, host
    return {"command": "python " + " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "torch": torch.__version__,
                        "device": torch.cuda.get_device_name() if cuda else "cpu", "pcieLink": link},
            "repeats": repeats, "kvBlockBytes": KV_BLOCK_BYTES, "sizes": rows, "chunked": chunked}


def _chunked_copies(torch, host, dev_src, dev_dst, cuda: bool, tiny: bool, repeats: int) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """One 64 MiB KV block moved as one copy vs as many block-sized copies to/from scattered device slots (a
    paged cache's blocks are not contiguous). Event time is the GPU's view (DMA plus per-copy gaps); wall time
    adds Python's per-call cost, which an engine issuing the copies from C++ mostly avoids. A CUDA graph of
    the copies, where capture works, removes the launch cost altogether."""
    h_src, h_dst = host
    total = KV_BLOCK_BYTES if not tiny else 1 * MiB
    gen = torch.Generator().manual_seed(1)
    out: list[dict[str, Any]] = []
    for chunk in (KV_CHUNKS if not tiny else (total, 64 * 1024)):
        count = total // chunk
        slots = torch.randperm(dev_dst.numel() // chunk, generator=gen)[:count].tolist()
        pairs = {"h2d": [(dev_dst[s * chunk:(s + 1) * chunk], h_src[i * chunk:(i + 1) * chunk]) for i, s in enumerate(slots)],
                 "d2h": [(h_dst[i * chunk:(i + 1) * chunk], dev_src[s * chunk:(s + 1) * chunk]) for i, s in enumerate(slots)]}
        for direction, pv in pairs.items():
            for d, _ in pv:
                d.fill_(0)
            copies = [lambda d=d, s=s: d.copy_(s, non_blocking=cuda) for d, s in pv]
            ev, wall = _time_copies(torch, copies, cuda, repeats)
            if cuda:
                torch.cuda.synchronize()
            if not all(torch.equal(d.cpu(), s.cpu()) for d, s in pv):
                raise RuntimeError(f"chunked {direction} copy ({count} x {chunk} bytes) does not match its source")
            row: dict[str, Any] = {"direction": direction, "totalBytes": total, "chunkBytes": chunk, "copies": count,
                   "ms": ev * 1e3, "gbs": total / ev / 1e9, "wallGbs": total / wall / 1e9, "graphGbs": None}
            if cuda and count > 1:
                row["graphGbs"] = _graph_gbs(torch, copies, total, repeats)
            out.append(row)
            print(json.dumps(row))
    return out


def _graph_gbs(torch, copies: Sequence[Callable[[], object]], total: int, repeats: int) -> float | str:  # type: ignore[no-untyped-def]
    """GB/s of the copies captured in one CUDA graph and replayed (no per-copy launch from Python), or why
    capture failed (pinned-memory copies need the host allocator's capture support)."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for fn in copies:
                fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in copies:
                fn()
        ev, _ = _time_copies(torch, [graph.replay], True, repeats)
    except RuntimeError as e:  # capture refused: report it, the other numbers stand
        torch.cuda.synchronize()
        return f"capture failed: {type(e).__name__}: {str(e)[:200]}"
    return total / ev / 1e9


def main() -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--only", choices=("roofline", "host-link", "prefill", "prefill-model", "mixed"),
                    help="run sections 1-3 (roofline), section 4 (host-link), section 5 (prefill) or section 6 "
                         "(mixed) alone and merge "
                         "the result into --merge-into, keeping the sections not run; prefill-model: add the step-cost "
                         "model's predictions and fit to the stored prefill timings (no GPU)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/roofline_measure.json"))
    ap.add_argument("--merge-into", default=str(ROOT / "benchmarks/results/roofline_measure.json"),
                    help="with --only: the existing results to add to (default: the committed JSON)")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    if args.only and Path(args.merge_into).exists():
        out = json.loads(Path(args.merge_into).read_text())
    if args.only in (None, "roofline"):
        out.update(roofline(torch, args.tiny))
    if args.only in (None, "host-link"):
        out["benchmark"] = "roofline_measure"
        out["hostLink"] = host_link(torch, args.tiny)
    if args.only in (None, "prefill"):
        out["benchmark"] = "roofline_measure"
        out["prefill"] = prefill(torch, args.tiny)
    if args.only in (None, "mixed"):
        out["benchmark"] = "roofline_measure"
        out["mixed"] = mixed(torch, args.tiny)
    if "prefill" in out and out["prefill"].get("device") != "cpu":
        try:
            out["prefill"].update(prefill_model(out["prefill"]["rows"]))
        except ImportError:
            print("planner not importable here (pydantic): run --only prefill-model where it is")
    if not args.tiny:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
    return 0


def _llama_stack(torch, tiny: bool) -> SimpleNamespace:  # type: ignore[no-untyped-def]
    """A Llama-3-8B-shaped stack of bf16 matmul weights (q/k/v/o + SwiGLU, random values, no attention over a
    cache) and one step through it over a batch of token rows; sections 1 and 6 time it."""
    import torch.nn.functional as F

    dev = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    layers, d, kv, ffn = (32, 4096, 1024, 14336) if not tiny else (2, 256, 64, 512)  # Llama-3-8B

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

    def step(x: torch.Tensor) -> torch.Tensor:
        for qkv, o, up, down in W:
            h = x @ qkv
            x = x + h[:, :d] @ o
            gu = x @ up
            x = x + (F.silu(gu[:, :ffn]) * gu[:, ffn:]) @ down
        return x

    return SimpleNamespace(dev=dev, dt=dt, d=d, W=W, step=step, sync=sync, timeit=timeit,
                           params=sum(w.numel() for ws in W for w in ws))


def roofline(torch, tiny: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Sections 1-3: decode step eager and CUDA graph, materialized vs fused attention."""
    import torch.nn.functional as F

    try:  # the planner needs pydantic; the GPU machine's torch venv may not have it
        from llmfleet.plan.hardware import get_gpu
        from llmfleet.plan.models import get_model
        from llmfleet.plan.roofline import decode_roofline
        have_planner = True
    except ImportError:
        have_planner = False

    stack = _llama_stack(torch, tiny)
    dev, dt, d, W, step, timeit = stack.dev, stack.dt, stack.d, stack.W, stack.step, stack.timeit
    wbytes = sum(w.numel() * w.element_size() for ws in W for w in ws)

    decode = []
    for b in ((1, 8, 32, 64, 128, 256, 512) if not tiny else (1, 8)):
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
        plan = decode_roofline(get_model("llama-3-8b"), get_gpu("H200"), b, 0) if have_planner and not tiny else None
        best = min(t for t in (t_eager, t_graph) if t is not None)
        decode.append({"batch": b, "eagerMs": t_eager * 1e3, "cudaGraphMs": None if t_graph is None else t_graph * 1e3,
                       "achievedTBs": wbytes / best / 1e12, "achievedTflops": flops / best / 1e12,
                       "plannerRooflineMs": None if plan is None else plan.time_s * 1e3,
                       "plannerBound": None if plan is None else plan.bound})
        print(json.dumps(decode[-1]))
    W.clear()
    attn = []
    heads, hd = (32, 128) if not tiny else (4, 32)
    for s_len in ((2048, 4096, 8192, 16384, 32768) if not tiny else (256, 512)):
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
    return {"benchmark": "roofline_measure", "command": "python " + " ".join(sys.argv),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "torch": torch.__version__,
                        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"},
            "weightBytes": wbytes, "decode": decode, "attention": attn}



# Section 6: decode batches a replica runs at a chat-like and a full batch, and prefills from a chat turn's new
# tokens to a long prompt's chunk.
MIXED_DECODE = (64, 256)
MIXED_PREFILL = (128, 512, 2048, 8192)


def mixed(torch, tiny: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Section 6: a prefill batched into a decode step. One step of the section-1 stack over a decode batch's token
    rows and a prefill's together (continuous batching), against each alone: the time the prefill adds to the step
    next to its time alone and to its FLOPs at the rate the GPU reaches on the largest prefill (compute only). The
    autoscaler prices a batched prefill at its FLOPs and lets decodes slow it only by theirs (docs/autoscaler.md,
    step 3); this is what a GPU does. Attention is left out (the stack has none), so this is the linear part."""
    stack = _llama_stack(torch, tiny)
    decode_sizes, prefill_sizes = (MIXED_DECODE, MIXED_PREFILL) if not tiny else ((8,), (16, 64))
    with torch.no_grad():
        rows_of = {n: torch.randn(n, stack.d, device=stack.dev, dtype=stack.dt)
                   for n in (*decode_sizes, *prefill_sizes)}
        alone = {n: stack.timeit(lambda x=x: stack.step(x)) for n, x in rows_of.items()}
        biggest = max(prefill_sizes)
        rate = 2.0 * biggest * stack.params / alone[biggest]  # FLOP/s the GPU reaches on the largest prefill
        rows = []
        for b in decode_sizes:
            for n in prefill_sizes:
                both = torch.cat([rows_of[b], rows_of[n]])
                t = stack.timeit(lambda x=both: stack.step(x))
                flops_s = 2.0 * n * stack.params / rate
                rows.append({"decodeBatch": b, "prefillTokens": n, "decodeAloneMs": alone[b] * 1e3,
                             "prefillAloneMs": alone[n] * 1e3, "mixedMs": t * 1e3,
                             "prefillAddsMs": (t - alone[b]) * 1e3, "prefillFlopsMs": flops_s * 1e3,
                             "addsOverAlone": (t - alone[b]) / alone[n], "addsOverFlops": (t - alone[b]) / flops_s})
                print(json.dumps(rows[-1]))
    return {"command": "python " + " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if stack.dev == "cuda" else "cpu", "torch": torch.__version__,
            "largestPrefillTflops": rate / 1e12, "rows": rows}


# (new tokens, cached prefix tokens): prompts from a chat turn to Mooncake's long ones (mean 15k), and turns that
# reuse a cached prefix as a multi-turn session or a shared system prompt does.
PREFILL_POINTS = ((512, 0), (1024, 0), (2048, 0), (4096, 0), (8192, 0), (16384, 0), (32768, 0),
                  (512, 4096), (512, 16384), (2048, 8192), (2048, 30720), (8192, 8192), (8192, 24576))


def prefill(torch, tiny: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Section 5: one sequence's prefill through a Llama-3-8B-shaped stack (eager, bf16, random weights): per layer
    RMSNorm, q/k/v, causal GQA attention over the cached prefix and the new tokens (SDPA), o, RMSNorm, SwiGLU.
    The cached prefix's K/V (the same for every layer: only the time matters) is concatenated in front of the new
    tokens', as a paged engine reads it; the attention's queries are aligned to the end (lower-right causal)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    dev = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    layers, heads, kv_heads, hd, ffn = (32, 32, 8, 128, 14336) if not tiny else (2, 4, 2, 32, 512)
    d, kv = heads * hd, kv_heads * hd
    points = PREFILL_POINTS if not tiny else ((64, 0), (128, 0), (64, 128))
    torch.manual_seed(0)
    W = [(torch.randn(d, d + 2 * kv, device=dev, dtype=dt) * 0.01, torch.randn(d, d, device=dev, dtype=dt) * 0.01,
          torch.randn(d, 2 * ffn, device=dev, dtype=dt) * 0.01, torch.randn(ffn, d, device=dev, dtype=dt) * 0.01)
         for _ in range(layers)]

    def attend(q, k, v, cached: int):  # type: ignore[no-untyped-def]
        # GQA without copying K/V to every query head (a copy costs 0.3 ms a layer at 16k cached tokens); a cached
        # prefix needs the lower-right causal mask (SDPA runs it on the FlashAttention-2 backend as well)
        if cached == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                              enable_gqa=True)

    def forward(x, past_k, past_v, cached: int):  # type: ignore[no-untyped-def]
        t = x.shape[0]
        for qkv_w, o_w, up_w, down_w in W:
            qkv = F.rms_norm(x, (d,)) @ qkv_w
            q = qkv[:, :d].view(t, heads, hd).transpose(0, 1)[None]
            k = qkv[:, d:d + kv].view(t, kv_heads, hd).transpose(0, 1)[None]
            v = qkv[:, d + kv:].view(t, kv_heads, hd).transpose(0, 1)[None]
            if cached:
                k, v = torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)
            a = attend(q, k, v, cached)
            x = x + a[0].transpose(0, 1).reshape(t, d) @ o_w
            gu = F.rms_norm(x, (d,)) @ up_w
            x = x + (F.silu(gu[:, :ffn]) * gu[:, ffn:]) @ down_w
        return x

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    rows = []
    with torch.no_grad():
        # both attention paths against a repeated-heads reference: the new tokens of a 96-token sequence whose first
        # 32 are cached see what the last 64 queries of the whole causal sequence see
        q, k, v = (torch.randn(1, h, 96, hd, device=dev, dtype=dt) for h in (heads, kv_heads, kv_heads))
        rep = heads // kv_heads
        ref = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
        for got, want in ((attend(q, k, v, 0), ref), (attend(q[:, :, 32:], k, v, 32), ref[:, :, 32:])):
            if not torch.allclose(got, want, atol=2e-2, rtol=2e-2):
                raise RuntimeError("GQA attention differs from the repeated-heads reference")
        for new, cached in points:
            x = torch.randn(new, d, device=dev, dtype=dt)
            past_k = torch.randn(1, kv_heads, cached, hd, device=dev, dtype=dt)
            past_v = torch.randn(1, kv_heads, cached, hd, device=dev, dtype=dt)
            iters = 3 if new * (new + cached) > 2**28 else 10
            for _ in range(2):
                forward(x, past_k, past_v, cached)
            times = []
            for _ in range(iters):
                sync()
                t0 = time.perf_counter()
                forward(x, past_k, past_v, cached)
                sync()
                times.append(time.perf_counter() - t0)
            sec = statistics.median(times)
            # the attention alone, every layer's call on tensors of the same shapes (what the rest is matmuls of)
            q = torch.randn(1, heads, new, hd, device=dev, dtype=dt)
            k, v = (torch.randn(1, kv_heads, cached + new, hd, device=dev, dtype=dt) for _ in range(2))
            sync()
            t0 = time.perf_counter()
            for _ in range(iters * layers):
                attend(q, k, v, cached)
            sync()
            attn = (time.perf_counter() - t0) / iters
            rows.append({"tokens": new, "cachedPrefix": cached, "ms": sec * 1e3, "tokensPerS": new / sec,
                         "attentionMs": attn * 1e3, "iterations": iters})
            del q, k, v
            print(json.dumps(rows[-1]))
            del x, past_k, past_v
    W.clear()
    return {"command": "python " + " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
            "layers": layers, "rows": rows}


def prefill_model(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulator's step-cost model for Llama-3-8B on H200 (planner defaults: one compute efficiency, 0.6, for
    every FLOP; bandwidth 0.8; 3 ms a step) next to each measured prefill, the share of the bf16 peak the whole
    prefill reached, and the attention's alone (timed apart: its launches do not overlap other work there, so at a
    few hundred tokens it reads low). The measured stack has no embedding or LM head (the model counts the head's FLOPs for every token:
    2 x 525M of the 2 x 7.5G per token)."""
    from llmfleet.plan.hardware import get_gpu
    from llmfleet.plan.models import get_model
    from llmfleet.plan.roofline import StepCostModel

    model = StepCostModel.build(get_model("llama-3-8b"), get_gpu("H200"))
    head = 2.0 * 128256 * 4096  # the LM head's FLOPs per token (vocabulary x hidden), not in the measured stack
    for r in rows:
        attended = r["tokens"] * r["cachedPrefix"] + r["tokens"] * (r["tokens"] + 1) / 2
        r["modelMs"] = model.prefill_time(r["tokens"], r["cachedPrefix"]) * 1e3
        r["measuredOverModel"] = r["ms"] / r["modelMs"]
        r["attentionEff"] = model.attn_flops_per_ctx * attended / (r["attentionMs"] / 1e3) / model.peak_flops
        # the whole step's FLOPs (the model's, less the head) over its measured time: one efficiency, as the model has
        r["stepEff"] = (((model.flops_per_token - head) * r["tokens"] + model.attn_flops_per_ctx * attended)
                        / (r["ms"] / 1e3) / model.peak_flops)
    return {"model": {"computeEff": model.compute_eff, "bandwidthEff": model.bandwidth_eff,
                      "overheadMs": model.overhead_s * 1e3, "peakTflops": model.peak_flops / 1e12}}


if __name__ == "__main__":
    raise SystemExit(main())
