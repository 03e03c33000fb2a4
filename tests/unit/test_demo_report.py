"""The demo's verdicts come from what was measured: events, samples, counters (synthetic runs here)."""

from __future__ import annotations

from pathlib import Path

from llmfleet.local.demo_report import DemoOptions, PhaseSpan, Run, Timeline, classify, event_pool, report
from llmfleet.local.demo_traffic import Sample

T0 = 1_000_000.0


def test_event_classification() -> None:
    assert classify("autoscaler: primary 2 -> 3 replicas (scale out)") == "scale_up"
    assert classify("autoscaler: primary 3 -> 2 replicas (scale in)") is None
    assert classify("removed primary-2 after 1.5s drain (clean)") == "scale_in"
    assert event_pool("removed primary-2 after 1.5s drain (clean)") == "primary"
    assert classify("promotion: draining student-0 (/m), replaced by the new model") is None
    assert classify("promotion: rolling /new out to pool student (was /old), from TrainingJob t") == "promotion_start"
    assert classify("promotion succeeded: /new serves on all 1 replicas of pool student") == "promoted"
    assert classify("promotion rolled back: pool student back to /old: TTFT p95 7000 ms exceeds") == "rolled_back"


def test_a_rollout_drain_is_not_a_scale_in() -> None:
    tl = Timeline()
    tl.observe_state(T0, {"events": [
        {"ts": T0, "message": "promotion: draining student-0 (/old), replaced by /new"},
        {"ts": T0 + 1, "message": "removed student-0 after 0.1s drain (clean)"},
        {"ts": T0 + 9, "message": "removed primary-1 after 2.0s drain (clean)"}]})
    assert tl.first_event("scale_in") == T0 + 9


def _run(tmp_path: Path, degraded: int, removed: bool = True) -> Run:
    run = Run(DemoOptions(run_dir=tmp_path))
    tl: Timeline = run.timeline
    for i, n in enumerate((2, 2, 3, 3, 2)):
        tl.observe_state(T0 + 20 * i, {"replicas": [
            {"pool": "primary", "name": f"primary-{k}", "ready": k < n, "started_at": T0} for k in range(3)]})
    tl.spans += [PhaseSpan("before spike", T0, T0 + 5), PhaseSpan("spike", T0 + 5, T0 + 60)]
    events = [(T0 + 10, "autoscaler: primary 2 -> 3 replicas (scale out)")]
    if removed:
        events.append((T0 + 80, "removed primary-2 after 0.4s drain (clean)"))
    tl.observe_state(T0 + 90, {"events": [{"ts": t, "message": m} for t, m in events]})
    run.samples = [Sample(ts=T0 + i, phase="spike" if i % 2 else "steady", tenant="t", turn=0, ok=True, ttft_ms=100.0,
                          pool="student" if i < degraded else "primary", degraded=i < degraded) for i in range(50)]
    counters = {"http://r:1": {"requests": 10.0, "hits": 90.0, "queries": 100.0}}
    run.ab = {"A: prefix-aware router": {"requests": 10, "errors": 0, "per_replica": counters, "hit_rate": 0.9},
              "B: round-robin": {"requests": 10, "errors": 0, "per_replica": counters, "hit_rate": 0.6}}
    run.train_log = [{"step": 5, "loss": 4.1, "tokensPerSecond": 900.0, "mfu": 0.1},
                     {"step": 10, "loss": 3.5, "tokensPerSecond": 1100.0, "mfu": 0.12}]
    run.promotion = {"state": "Succeeded", "message": "ok", "model": "/new"}
    return run


def test_every_expectation_met(tmp_path: Path) -> None:
    text, ok = report(_run(tmp_path, degraded=5), tmp_path)
    assert ok, text
    assert "5 of 50 responses had x-llmfleet-degraded: true (10.0%" in text
    assert "cold start 30 s to ready" in text  # scale-up event at +10 s, the third replica first seen ready at +40 s
    assert "loss 4.100 -> 3.500" in text and "90% vs round-robin 60%" in text
    assert (tmp_path / "demo-report.png").stat().st_size > 10_000


def test_a_degraded_share_over_the_cap_or_no_scale_in_is_reported(tmp_path: Path) -> None:
    text, ok = report(_run(tmp_path, degraded=20, removed=False), tmp_path)
    assert not ok
    degrade = next(ln for ln in text.splitlines() if "3 degrade" in ln)
    scale_in = next(ln for ln in text.splitlines() if "3 scale in" in ln)
    assert " NO " in degrade and " NO " in scale_in and "no drain-then-remove seen" in scale_in
