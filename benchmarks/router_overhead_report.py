"""The router-overhead benchmark's printed results: the latency and throughput table, the target verdicts and the
head-to-head rounds (benchmarks/router_overhead.py writes the JSON they read)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def table(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [f"| router | mode | p50 / p99 ms @ {a['light_rate']:g} req/s | added p50 / p99 ms | "
             f"p50 / p99 ms @ {a['rate']:g} req/s | added p50 / p99 ms | achieved req/s | "
             f"max req/s (c={a['concurrency']}) | router CPU µs/req | 1 core req/s (from CPU) | "
             f"run-queue wait ms/s @ {a['rate']:g} |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for name, row in res["routers"].items():
        for mode, r in row.items():
            if mode not in ("stream", "nonstream"):
                continue
            li, o, c = r["light"], r["open"], r["closed"]
            lines.append(
                f"| {name} | {mode} | {li['p50_ms']:.2f} / {li['p99_ms']:.2f} | "
                f"{li.get('added_p50_ms', nan):.2f} / {li.get('added_p99_ms', nan):.2f} | "
                f"{o['p50_ms']:.2f} / {o['p99_ms']:.2f} | {o.get('added_p50_ms', nan):.2f} / "
                f"{o.get('added_p99_ms', nan):.2f} | {o['achieved_rps']:.0f} | {c['max_rps']:.0f} | "
                f"{c.get('router_cpu_us_per_request', nan):.0f} | {c.get('one_core_rps_from_cpu') or nan:.0f} | "
                f"{o.get('router_run_queue_wait_ms_per_s', nan):.0f} |")
    for name, why in res["skipped"].items():
        lines.append(f"| {name} | - | skipped: {why} | | | | | | | | |")
    ov = res["routers"].get("llmfleet", {}).get("router_overhead_before_upstream_us")
    if ov:
        lines += ["", "llmfleet router's own time from request arrival to upstream send (its histogram): "
                  + ", ".join(f"{k} {v:.0f} µs" for k, v in ov.items() if v is not None)]
    rd = res.get("route_decision")
    if rd:
        sc = ", ".join(f"{k} {v:g}" for k, v in rd.get("scorers", {}).items())
        lines += ["", f"| route decision (8k-token prompt, 100k blocks indexed, 8 replicas; scorers {sc}) | µs |",
                  "|---|---|",
                  f"| hash 512 blocks (p50) | {rd['hash_p50_us']:.1f} |",
                  f"| match + scorers + pick (p50) | {rd['match_and_pick_p50_us']:.1f} |",
                  f"| decision total p50 / p99 | {rd['decision_p50_us']:.1f} / {rd['decision_p99_us']:.1f} |",
                  f"| decision total, fastest of {rd.get('iters', 2000)} (hash + match/pick) | "
                  f"{rd['decision_min_us']:.1f} ({rd['hash_min_us']:.1f} + {rd['match_and_pick_min_us']:.1f}) |",
                  f"| index update after routing (p50, off the decision) | {rd['index_update_p50_us']:.1f} |",
                  f"| tokenize 8k tokens (tiny BPE, before the decision) | {rd['tokenize_8k_us']:.0f} |"]
        if "tokenize_next_turn_us" in rd:
            lines.append(f"| tokenize them + 100 more, the previous 8k's ids kept (PromptTokenizer) | "
                         f"{rd['tokenize_next_turn_us']:.0f} |")
    return "\n".join(lines)


def head_to_head_lines(h: dict[str, Any]) -> str:
    """Medians of the head-to-head rounds, and llmfleet's per-round ratios to each peer."""
    lines = [f"head-to-head: {h['rounds']} rounds x {h['duration_s']:g} s, {h['concurrency']} connections, closed loop"]
    for name, modes in h["routers"].items():
        lines.append(f"  {name:14s} " + ", ".join(f"{m} {v['rps_median']:,.0f} req/s {v['cpu_us_median']:.0f} us/req"
                                                  for m, v in modes.items()))
    for peer, modes in h["llmfleet_vs"].items():
        for m, v in modes.items():
            if v["rps_ratio_median"] is None or v["cpu_ratio_median"] is None:
                continue
            lines.append(f"  llmfleet / {peer} {m}: req/s x{v['rps_ratio_median']:.2f} (rounds "
                         + " ".join(f"{x:.2f}" for x in v["rps_ratio_per_round"]) + f"), CPU x{v['cpu_ratio_median']:.2f}"
                         " (rounds " + " ".join(f"{x:.2f}" for x in v["cpu_ratio_per_round"]) + ")")
    return "\n".join(lines)


def verdicts(res: dict[str, Any]) -> str:
    """One line per target: the measured values and PASS / FAIL / not measured."""
    t, rate = res["targets_met"], res["args"]["rate"]
    ll = res["routers"].get("llmfleet", {})

    def word(v: bool | None) -> str:
        return "not measured" if v is None else "PASS" if v else "FAIL"

    def per_mode(fmt: str) -> str:
        out = []
        for m in ("nonstream", "stream"):
            if m in ll:  # missing values (no direct baseline) print as nan
                values = defaultdict(lambda: float("nan"), {**ll[m]["open"], **ll[m]["closed"]})
                out.append(f"{m} {fmt.format_map(values)}")
        return ", ".join(out)

    load = res["machine"]["loadavg_1m_at_start"], res["machine"]["loadavg_1m_at_end"]
    waits = [ll[m]["open"].get("router_run_queue_wait_ms_per_s", 0.0) for m in ("nonstream", "stream") if m in ll]
    busy = max(load) > 1.5 or max(waits, default=0.0) > 50
    lines = [f"targets, llmfleet router; 1-min load average {load[0]:.1f} at start, {load[1]:.1f} at end; "
             f"router waited for its core {max(waits, default=0.0):.0f} ms per s at {rate:g} req/s"
             + (" -- the machine was busy: wall-clock numbers are not trustworthy" if busy else "")]
    if ll:
        why = ("" if t.get("added_latency_measurable") else " (the direct baseline did not keep up with the rate)"
               if "direct" in res["routers"] else " (no direct baseline in this run)")
        lines += [
            f"  added latency p50 <= 0.5 ms @ {rate:g} req/s: {word(t['added_p50_le_0.5ms'])}{why}: "
            + per_mode("{added_p50_ms:+.2f} ms"),
            f"  added latency p99 <= 2 ms @ {rate:g} req/s:   {word(t['added_p99_le_2ms'])}{why}: "
            + per_mode("{added_p99_ms:+.2f} ms"),
            f"  >= 2,000 req/s on one core (closed loop):     {word(t['ge_2000_rps'])}: " + per_mode("{max_rps:.0f} req/s"),
            f"  >= 2,000 req/s on one core (from CPU time):   {word(t['ge_2000_rps_from_cpu_time'])}: "
            + per_mode("{router_cpu_us_per_request:.0f} µs/req = {one_core_rps_from_cpu:.0f} req/s"),
        ]
    rd = res["route_decision"]
    lines += [f"  route decision <= 50 µs (p50):                {word(t['decision_le_50us'])}: "
              f"{rd['decision_p50_us']:.1f} µs (fastest {rd['decision_min_us']:.1f} µs)"]
    return "\n".join(lines)
