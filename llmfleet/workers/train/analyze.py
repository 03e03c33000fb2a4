"""Where a step's time goes, from a torch.profiler Chrome trace, and a one-line diagnosis.

On a GPU trace the device timeline is the union of kernel/memcpy intervals on all streams: compute kernels,
NCCL kernels (and how much of them overlaps compute), memcpy/memset, idle gaps, and the count of tiny
kernels (< 10 µs, the launch-bound signal). On a CPU-only trace (gloo) the same questions are asked of the
top-level operators on the main thread, with gloo/c10d collectives as communication.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COMM = re.compile(r"nccl|gloo|c10d|all_gather|allgather|reduce_scatter|all_reduce|allreduce|broadcast|record_param_comms",
                  re.I)
MATMUL = re.compile(r"gemm|cublas|cutlass|sm90|sm80|nvjet|xmma|flash|fmha|attention|matmul|mm_|addmm|bmm|linear|"
                    r"triton_tem|scaled_dot", re.I)
TINY_US = 10.0


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass
class TraceSummary:
    device: str
    window_ms: float
    busy_ms: float
    compute_ms: float
    matmul_ms: float
    other_compute_ms: float
    comm_ms: float
    comm_overlapped_ms: float
    comm_exposed_ms: float
    memcpy_ms: float
    idle_ms: float
    data_ms: float
    kernels: int
    tiny_kernels: int
    top: list[tuple[str, float]] = field(default_factory=list)
    diagnosis: str = ""

    def shares(self) -> dict[str, float]:
        w = self.window_ms or 1.0
        return {"compute": self.compute_ms / w, "commExposed": self.comm_exposed_ms / w, "comm": self.comm_ms / w,
                "memcpy": self.memcpy_ms / w, "idle": self.idle_ms / w, "data": self.data_ms / w}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shares"] = self.shares()
        return d


def _events(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if p.suffix == ".gz":
        import gzip

        with gzip.open(p, "rt") as f:
            doc = json.load(f)
    else:
        doc = json.loads(p.read_text())
    events = doc.get("traceEvents", doc) if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def diagnose(s: TraceSummary) -> str:
    sh = s.shares()
    tiny_frac = s.tiny_kernels / s.kernels if s.kernels else 0.0
    if sh["data"] > 0.2:
        return f"input-bound: {sh['data']:.0%} of the window waits on data loading"
    if sh["commExposed"] > 0.25:
        return f"communication-bound: {sh['commExposed']:.0%} of the window is collectives not hidden behind compute"
    if sh["idle"] > 0.3 and tiny_frac > 0.5:
        return (f"launch-bound: device idle {sh['idle']:.0%} and {tiny_frac:.0%} of kernels are < {TINY_US:.0f} µs "
                "(try CUDA graphs / more fusion / larger batches)")
    if sh["idle"] > 0.3:
        return f"host-bound: device idle {sh['idle']:.0%} of the window (CPU overhead, sync points or input)"
    if s.compute_ms and s.other_compute_ms / s.compute_ms > 0.5:
        return (f"memory-bound: {s.other_compute_ms / s.compute_ms:.0%} of compute time is outside matmul/attention "
                "kernels (elementwise, norms, reductions: fuse them)")
    return (f"compute-bound: {sh['compute']:.0%} of the window in compute, "
            f"{s.matmul_ms / max(s.compute_ms, 1e-9):.0%} of it matmul/attention")


def analyze_trace(path: str | Path, top: int = 8) -> TraceSummary:
    events = _events(path)
    if not events:
        raise ValueError(f"{path}: no complete ('X') events: not a torch.profiler Chrome trace?")
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    data = _union([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "llmfleet.data"])
    by_name: dict[str, float] = {}
    if gpu:
        device = "gpu"
        kernels = [e for e in gpu if e.get("cat") == "kernel"]
        comm_ev = [e for e in kernels if COMM.search(str(e.get("name", "")))]
        comp_ev = [e for e in kernels if not COMM.search(str(e.get("name", "")))]
        copy_ev = [e for e in gpu if e.get("cat") != "kernel"]
        all_ev = gpu
        n_kernels = len(kernels)
        tiny = sum(1 for e in kernels if e["dur"] < TINY_US)
        mm_ev = [e for e in comp_ev if MATMUL.search(str(e.get("name", "")))]
    else:
        device = "cpu"
        ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
        main_tid = max({e.get("tid") for e in ops}, key=lambda t: sum(x["dur"] for x in ops if x.get("tid") == t))
        ops = [e for e in ops if e.get("tid") == main_tid and not str(e["name"]).startswith("ProfilerStep")]
        # Top-level operators only: those not nested in another op on the same thread.
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        top_level, end = [], -1.0
        for e in ops:
            if e["ts"] >= end:
                top_level.append(e)
                end = e["ts"] + e["dur"]
        comm_ev = [e for e in ops if COMM.search(str(e.get("name", "")))]
        comp_ev = [e for e in top_level if not COMM.search(str(e["name"])) and e["name"] != "llmfleet.data"]
        copy_ev = [e for e in top_level if "copy_" in str(e["name"]) or "to_copy" in str(e["name"])]
        all_ev = top_level + comm_ev
        mm_ev = [e for e in ops if re.search(r"aten::(mm|addmm|bmm|linear|matmul|_scaled_dot|scaled_dot)", str(e["name"]))]
        n_kernels = len(top_level)
        tiny = sum(1 for e in top_level if e["dur"] < TINY_US)
    for e in comp_ev + comm_ev:
        by_name[str(e["name"])[:80]] = by_name.get(str(e["name"])[:80], 0.0) + e["dur"]
    span_src = steps or all_ev
    lo = min(e["ts"] for e in span_src)
    hi = max(e["ts"] + e["dur"] for e in span_src)
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in all_ev])
    comp = _union([(e["ts"], e["ts"] + e["dur"]) for e in comp_ev])
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in comm_ev])
    mm = _union([(e["ts"], e["ts"] + e["dur"]) for e in mm_ev])
    copies = _union([(e["ts"], e["ts"] + e["dur"]) for e in copy_ev])
    if device == "gpu":
        overlapped, compute = _intersect(comm, comp), _length(comp)
    else:  # one host thread: a collective nested in an operator blocks it, so none of it overlaps
        overlapped, compute = 0.0, _length(comp) - _intersect(comp, comm)
    ms = 1e-3
    window = (hi - lo) * ms
    summary = TraceSummary(
        device=device, window_ms=window, busy_ms=_length(busy) * ms, compute_ms=compute * ms,
        matmul_ms=_length(mm) * ms, other_compute_ms=max(0.0, compute - _length(mm)) * ms,
        comm_ms=_length(comm) * ms, comm_overlapped_ms=overlapped * ms,
        comm_exposed_ms=(_length(comm) - overlapped) * ms, memcpy_ms=_length(copies) * ms,
        idle_ms=max(0.0, window - _length(busy) * ms), data_ms=_length(data) * ms,
        kernels=n_kernels, tiny_kernels=tiny,
        top=sorted(((k, v * ms) for k, v in by_name.items()), key=lambda kv: -kv[1])[:top],
    )
    summary.diagnosis = diagnose(summary)
    return summary


def format_summary(s: TraceSummary) -> str:
    sh = s.shares()
    lines = [
        f"device timeline: {s.device}, window {s.window_ms:.1f} ms, busy {s.busy_ms:.1f} ms",
        f"  compute      {s.compute_ms:9.1f} ms  {sh['compute']:6.1%}  (matmul/attention {s.matmul_ms:.1f} ms, "
        f"other {s.other_compute_ms:.1f} ms)",
        f"  comm         {s.comm_ms:9.1f} ms  {sh['comm']:6.1%}  (overlapped {s.comm_overlapped_ms:.1f} ms, "
        f"exposed {s.comm_exposed_ms:.1f} ms)",
        f"  memcpy/set   {s.memcpy_ms:9.1f} ms  {sh['memcpy']:6.1%}",
        f"  idle         {s.idle_ms:9.1f} ms  {sh['idle']:6.1%}",
        f"  data loading {s.data_ms:9.1f} ms  {sh['data']:6.1%}",
        f"  kernels/ops  {s.kernels} ({s.tiny_kernels} shorter than {TINY_US:.0f} µs)",
        "  top:",
        *[f"    {v:9.2f} ms  {k}" for k, v in s.top],
        f"diagnosis: {s.diagnosis}",
    ]
    return "\n".join(lines)
