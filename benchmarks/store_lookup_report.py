"""The store-lookup benchmark's machine record, printed table and target verdicts (benchmarks/store_lookup.py writes
the JSON they read)."""

from __future__ import annotations

import os
import platform
import sqlite3
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "cpu": cpu, "memory_gib": round(mem, 1), "sqlite": sqlite3.sqlite_version,
            "load_average_1m_at_end": round(os.getloadavg()[0], 1)}


def print_table(doc: dict[str, Any]) -> None:
    res = doc["results"]
    backends = [b for b in ("sqlite", "postgresql") if b in res]
    rows = [
        ("populate (s)", "populate_s", "{:.0f}"),
        ("exact lookup p50 (ms)", "exact_p50_ms", "{:.3f}"),
        ("exact lookup p90 (ms)", "exact_p90_ms", "{:.3f}"),
        ("exact lookup p99 (ms) [target <= 1]", "exact_p99_ms", "{:.3f}"),
        ("  CPU per lookup (us)", "exact_cpu_us", "{:.0f}"),
        ("  prepared query alone p50 (ms)", "exact_db_p50_ms", "{:.3f}"),
        ("  prepared query alone p90 (ms)", "exact_db_p90_ms", "{:.3f}"),
        ("  prepared query alone p99 (ms)", "exact_db_p99_ms", "{:.3f}"),
        ("  control: SELECT 1 round trip p50 (ms)", "exact_select1_p50_ms", "{:.3f}"),
        ("  control: SELECT 1 round trip p99 (ms)", "exact_select1_p99_ms", "{:.3f}"),
        ("  request -> key p50 (ms)", "exact_key_p50_ms", "{:.3f}"),
        ("  request -> key p99 (ms)", "exact_key_p99_ms", "{:.3f}"),
        ("  rest of the client, p50 (ms)", "exact_overhead_p50_ms", "{:.3f}"),
        ("  handed to the thread pool (lookups)", "exact_fallbacks", "{:.0f}"),
        ("  full GC collections during them", "exact_gc_full_collections", "{:.0f}"),
        ("  control: fixed CPU work, interleaved, p50 (ms)", "exact_floor_p50_ms", "{:.3f}"),
        ("  control: fixed CPU work, interleaved, p99 (ms)", "exact_floor_p99_ms", "{:.3f}"),
        ("exact lookup, absent key p99 (ms)", "exact_absent_p99_ms", "{:.3f}"),
        ("exact, thread path (before) p50 (ms)", "exact_thread_p50_ms", "{:.3f}"),
        ("exact, thread path (before) p99 (ms)", "exact_thread_p99_ms", "{:.3f}"),
        ("  its CPU per lookup (us)", "exact_thread_cpu_us", "{:.0f}"),
        ("  its worker-thread part p99 (ms)", "exact_thread_db_p99_ms", "{:.3f}"),
        ("semantic lookup p50 (ms)", "semantic_p50_ms", "{:.3f}"),
        ("semantic lookup p90 (ms)", "semantic_p90_ms", "{:.3f}"),
        ("semantic lookup p99 (ms) [target <= 10]", "semantic_p99_ms", "{:.3f}"),
        ("  index search p50 (ms)", "index_search_p50_ms", "{:.3f}"),
        ("  index search p99 (ms)", "index_search_p99_ms", "{:.3f}"),
        ("  semantic recall@1", "semantic_recall_at_1", "{:.3f}"),
        ("  index build from DB (s)", "index_build_s", "{:.1f}"),
        ("features (log lines/s)", "features_lines_per_s", "{:.0f}"),
        ("embeddings, hashing (prompts/s)", "hashing_embeddings_per_s", "{:.0f}"),
        ("embeddings, MiniLM (prompts/s)", "minilm_embeddings_per_s", "{:.0f}"),
        ("responses stored (prompts/s)", "responses_per_s", "{:.0f}"),
    ]
    sizes = doc["sizes"]
    m = doc["machine"]
    print(f"\n{m['cpus']} x {m['cpu']}, load average {m['load_average_1m_at_start']} -> {m['load_average_1m_at_end']}"
          + (" (CONTENDED: other processes competed for the CPUs; tails are not the store's)"
             if m.get("contended") else ""))
    print(f"feature store: {sizes['prompt_rows']:,} prompt rows, {sizes['response_rows']:,} responses, "
          f"{sizes['embeddings']:,} embeddings, {sizes['queries']:,} queries")
    print(f"{'':44}" + "".join(f"{b:>14}" for b in backends))
    for label, key, fmt in rows:
        print(f"{label:44}" + "".join(f"{fmt.format(res[b][key]) if key in res[b] else '-':>14}" for b in backends))
    for b in backends:
        if "exact_plan" in res[b]:
            print(f"{b} plan of the exact query: {res[b]['exact_plan']}")
    bf, ml = res.get("brute_force", {}), res.get("minilm", {})
    if bf:
        print(f"brute-force scan of all embeddings, p99: {bf['brute_force_search_p99_ms']:.2f} ms")
    if ml:
        print(f"MiniLM embedding of one incoming prompt: p50 {ml['minilm_query_p50_ms']:.1f} ms, "
              f"p99 {ml['minilm_query_p99_ms']:.1f} ms (load {ml['minilm_load_s']:.1f} s)")

    for line in verdicts(doc):
        print(line)


def uses_index(backend: str, plan: str) -> bool:
    if backend == "sqlite":
        return "USING INDEX sqlite_autoindex_responses" in plan or "USING INDEX uq_responses_key" in plan
    return "Index Scan using uq_responses_key" in plan


def verdicts(doc: dict[str, Any]) -> list[str]:
    res, targets = doc["results"], doc["targets"]
    out = []
    for b in ("sqlite", "postgresql"):
        if b not in res:
            continue
        r = res[b]
        for what, key, target in (("exact p99", "exact_p99_ms", targets["exact_p99_ms"]),
                                  ("semantic p99", "semantic_p99_ms", targets["semantic_p99_ms"])):
            if key in r:
                ok = "MET" if r[key] <= target else "NOT MET"
                note = ""
                if key == "exact_p99_ms" and "exact_floor_p99_ms" in r:
                    note = (f" (control: a fixed {r['exact_floor_p50_ms'] * 1e3:.0f} us computation run after "
                            f"each lookup had p99 {r['exact_floor_p99_ms']:.3f} ms")
                    if "exact_select1_p99_ms" in r:
                        note += f"; a SELECT 1 round trip had p99 {r['exact_select1_p99_ms']:.3f} ms"
                    note += ")"
                out.append(f"target {b:10} {what:13} {r[key]:7.3f} ms <= {target:g} ms: {ok}{note}")
        if "exact_plan" in r:
            out.append(f"target {b:10} exact query uses the uq_responses_key index: "
                       f"{'yes' if uses_index(b, r['exact_plan']) else 'NO'}")
    return out
