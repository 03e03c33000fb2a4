"""Feature-store lookups and offline generation, on SQLite and PostgreSQL.

    python benchmarks/store_lookup.py [--prompts 1000000] [--embeddings 100000] [--quick]

Populates each backend with --prompts prompt-feature rows and as many precomputed responses (bulk inserts:
executemany in one transaction on SQLite, COPY on PostgreSQL), --embeddings 384-dim embeddings of one tenant,
then measures through the production client (`FeatureStoreLookup.lookup`, LRU disabled so every lookup is a
cache miss that reaches the database):

- exact lookup latency (existing keys in random order; hits read from the database) on the fast path (on the
  event loop), broken down into the prepared query alone, the request -> key work and the rest of the client,
  with CPU time per lookup; the same through the thread path (`fast_path=False`, the old design) for
  comparison; the plan of the exact query (must be an index point lookup); and, as a control, the p99 of a
  fixed CPU-bound computation as long as a median lookup, run after every lookup: on a shared machine that
  is what preemption alone does to a tail at the same moments;
- semantic lookup latency: an exact miss, the in-memory index search and the candidate fetch. The query
  vectors are given (a table "embedder"), so this is the store's part; the time to embed the incoming prompt
  with all-MiniLM-L6-v2 is measured separately, since it depends on where the model runs;
- semantic recall@1 of the index against a brute-force scan;
- offline generation throughput: log lines -> features/s, prompts -> embeddings/s (MiniLM and the hashing
  embedder), and responses/s stored from a local fake OpenAI endpoint (the store's overhead, not a model's).

The embedding vectors of the index are synthetic (a mixture of 2,000 Gaussian clusters on the unit sphere):
embedding 100k prompts with MiniLM takes longer than the benchmark on a 2-core machine. Prints a table and the
target verdicts, and writes benchmarks/results/store_lookup.json. `--skip-generation --minilm-prompts 0`
measures the lookups only.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import REGISTRY
from store_lookup_report import machine, print_table, verdicts

from llmfleet.store import db, generation, repo
from llmfleet.store.embeddings import HashingEmbedder, l2_normalize
from llmfleet.store.fastpath import SqliteReader, compiled_sql, exact_query_plan
from llmfleet.store.lookup import FeatureStoreLookup
from llmfleet.store.normalize import normalized_prompt, params_hash, prompt_hash, split_request
from llmfleet.store.pgtemp import TempPostgres
from llmfleet.store.vector_index import VectorIndex
from llmfleet.testing.fake_openai import FakeOpenAI, log_record

ROOT = Path(__file__).resolve().parents[1]
MODEL, VERSION, DIM = "bench", "v1", 384
PARAMS = {"max_tokens": 64, "temperature": 0}
PK = params_hash(PARAMS)
N_TENANTS = 10
SEM_TENANT = "t0"


def text_of(i: int) -> str:
    return f"benchmark prompt number {i}: what is the answer to question {i * 7919 % 1000003}?"


def key_of(i: int) -> str:
    return prompt_hash("chat", f"user: {text_of(i)}")


def tenant_of(i: int) -> str:
    return f"t{i % N_TENANTS}"


def body(i: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text_of(i)}], **PARAMS}


def response_json(i: int) -> str:
    return json.dumps({"id": f"chatcmpl-{i}", "object": "chat.completion", "model": MODEL,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer {i}"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}})


def pct(xs: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p))


# --- population ------------------------------------------------------------------------------------------

def feature_rows(n: int, now: float) -> Iterator[tuple[Any, ...]]:
    req = json.dumps({"endpoint": "chat", "messages": None, "prompt": None, "params": PARAMS})
    for i in range(n):
        yield (i + 1, tenant_of(i), MODEL, key_of(i), "chat", f"user: {text_of(i)}", req, 20, "[]", now, now,
               1 + (i % 50))


def response_rows(n: int, vid: int, now: float) -> Iterator[tuple[Any, ...]]:
    params = json.dumps(PARAMS)
    for i in range(n):
        yield (tenant_of(i), key_of(i), vid, PK, params, response_json(i), now, None, None, None)


F_COLS = ("id", "tenant", "model", "prompt_hash", "endpoint", "text", "request", "token_count", "prefix_blocks",
          "first_seen", "last_seen", "frequency")
R_COLS = ("tenant", "prompt_hash", "model_version_id", "params_hash", "params", "response", "created_at",
          "ttl_seconds", "expires_at", "invalidated_at")
E_COLS = ("feature_id", "embedder", "dim", "vector", "created_at")


def synthetic_vectors(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = l2_normalize(rng.standard_normal((2000, DIM)).astype(np.float32))
    return l2_normalize(centers[rng.integers(0, 2000, n)] + 0.04 * rng.standard_normal((n, DIM)).astype(np.float32))


def embedding_feature_ids(n_emb: int) -> list[int]:
    # Features of tenant t0 are ids 1, 11, 21, ... (feature i+1 has tenant t{i % 10}).
    return [1 + N_TENANTS * j for j in range(n_emb)]


def populate(url: str, n: int, vecs: np.ndarray) -> dict[str, float]:
    db.upgrade(url)
    engine = db.make_engine(url, writer=True)
    vid = repo.set_current_version(engine, MODEL, VERSION).version_id
    engine.dispose()
    now = time.time()
    fids = embedding_feature_ids(len(vecs))
    emb_rows = ((fid, "bench-synthetic", DIM, v.astype("<f4").tobytes(), now) for fid, v in zip(fids, vecs, strict=True))
    t0 = time.perf_counter()
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-1000000")  # 1 GB page cache: random-order index inserts stay in memory
        with conn:
            conn.executemany(f"INSERT INTO prompt_features ({','.join(F_COLS)}) VALUES ({','.join('?' * len(F_COLS))})",
                             feature_rows(n, now))
            conn.executemany(f"INSERT INTO responses ({','.join(R_COLS)}) VALUES ({','.join('?' * len(R_COLS))})",
                             response_rows(n, vid, now))
            conn.executemany(f"INSERT INTO embeddings ({','.join(E_COLS)}) VALUES ({','.join('?' * len(E_COLS))})",
                             emb_rows)
        conn.execute("ANALYZE")
        conn.close()
    else:
        import psycopg

        dsn = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn) as conn:
            with conn.cursor() as cur:
                with cur.copy(f"COPY prompt_features ({','.join(F_COLS)}) FROM STDIN") as cp:
                    for row in feature_rows(n, now):
                        cp.write_row(row)
                with cur.copy(f"COPY responses ({','.join(R_COLS)}) FROM STDIN") as cp:
                    for row in response_rows(n, vid, now):
                        cp.write_row(row)
                with cur.copy(f"COPY embeddings ({','.join(E_COLS)}) FROM STDIN") as cp:
                    for row in emb_rows:
                        cp.write_row(row)
                cur.execute("SELECT setval(pg_get_serial_sequence('prompt_features', 'id'), %s)", (n,))
            conn.commit()
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE")
            # Flush what loading and VACUUM dirtied now, so the checkpointer's writes do not land in the timings.
            conn.execute("CHECKPOINT")
    return {"populate_s": time.perf_counter() - t0}


# --- lookups ---------------------------------------------------------------------------------------------

class TableEmbedder:
    """Query vectors known in advance: isolates the store's semantic path from the embedding model."""

    name = "bench-synthetic"
    dim = DIM

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


def lookup_key(i: int) -> tuple[str, str, str]:
    """(normalized text, prompt hash, params hash): what `lookup()` computes from the request body."""
    _, messages, params = split_request("chat", body(i))
    text = normalized_prompt("chat", None, messages)
    return text, prompt_hash("chat", text), params_hash(params)


async def timed_lookups(store: FeatureStoreLookup, keys: Sequence[int],
                        control_iterations: int = 0) -> tuple[list[float], float, int, list[float]]:
    """Per-lookup wall times, CPU seconds per lookup (all threads of the process), hits; with
    `control_iterations`, each lookup is followed by a fixed CPU-bound computation of that many iterations,
    timed the same way (the control: what preemption alone does to a tail at the same moments)."""
    lat, hits, control = [], 0, []
    cpu = 0.0
    for i in keys:
        c0 = time.process_time()
        t0 = time.perf_counter()
        hit = await store.lookup(tenant_of(i), "chat", body(i))
        lat.append(time.perf_counter() - t0)
        cpu += time.process_time() - c0
        hits += hit is not None
        if control_iterations:
            t0 = time.perf_counter()
            fixed_work(control_iterations)
            control.append(time.perf_counter() - t0)
    return lat, cpu / len(keys), hits, control


def fixed_work(iterations: int) -> None:
    h = b"x"
    for _ in range(iterations):
        h = hashlib.sha256(h).digest()


def iterations_lasting(seconds: float) -> int:
    """How many fixed_work iterations take `seconds` of CPU on this machine (calibrated on CPU time)."""
    c0 = time.process_time()
    fixed_work(20_000)
    return max(1, round(seconds / ((time.process_time() - c0) / 20_000)))


def fallback_count() -> float:
    """Fast-path lookups handed to the thread pool so far (SQLite: a lock or the on-loop budget spent)."""
    return sum(REGISTRY.get_sample_value("llmfleet_store_fast_path_fallbacks_total", {"reason": r}) or 0.0
               for r in ("budget", "locked"))


async def bench_exact(url: str, n: int, queries: int) -> dict[str, Any]:
    """Exact lookups through `lookup()` (fast path, then the thread path for comparison), and their parts."""
    out: dict[str, Any] = {}
    rng = random.Random(1)
    for prefix, fast in (("exact", True), ("exact_thread", False)):
        store = FeatureStoreLookup(url, MODEL, semantic=False, cache_size=0, timeout_ms=1000, fast_path=fast)
        # Connect, resolve the version, warm caches; the control computation lasts a median lookup.
        warm, _, _, _ = await timed_lookups(store, rng.sample(range(n), 200))
        control_iterations = iterations_lasting(pct(warm, 50)) if fast else 0
        fallbacks, gc_before = fallback_count(), gc.get_stats()[2]["collections"]
        lat, cpu, hits, control = await timed_lookups(store, [rng.randrange(n) for _ in range(queries)],
                                                      control_iterations)
        out.update({f"{prefix}_p50_ms": pct(lat, 50) * 1e3, f"{prefix}_p90_ms": pct(lat, 90) * 1e3,
                    f"{prefix}_p99_ms": pct(lat, 99) * 1e3, f"{prefix}_hit_rate": hits / queries,
                    f"{prefix}_cpu_us": cpu * 1e6})
        if fast:
            out["exact_fallbacks"] = fallback_count() - fallbacks
            out["exact_gc_full_collections"] = gc.get_stats()[2]["collections"] - gc_before
            out["exact_floor_p50_ms"], out["exact_floor_p99_ms"] = pct(control, 50) * 1e3, pct(control, 99) * 1e3
        if fast:
            # The parts of a fast-path lookup: the prepared query alone (as lookup() awaits it), and the
            # request -> key work (split, normalize, hash). The rest is the client's overhead.
            reader = store.exact.get_reader()
            if isinstance(reader, SqliteReader):
                reader.on_loop_budget_s = 1.0  # measure the query, never hand it to the thread path
            backend = store.exact.backend or ""
            sql = compiled_sql(backend, "exact")
            vid = store.runtime.version[0] if store.runtime.version else 0
            db_lat, key_lat = [], []
            for i in (rng.randrange(n) for _ in range(queries)):
                t0 = time.perf_counter()
                _, phash, pk = lookup_key(i)
                t1 = time.perf_counter()
                row = await reader.fetch_one(sql, {"vid": vid, "tenant": tenant_of(i), "phash": phash, "pk": pk,
                                                   "now": time.time()}, time.monotonic() + 1.0)
                t2 = time.perf_counter()
                if row is None:
                    raise RuntimeError(f"benchmark key {i} not found by the raw exact query")
                key_lat.append(t1 - t0)
                db_lat.append(t2 - t1)
            out.update({"exact_db_p50_ms": pct(db_lat, 50) * 1e3, "exact_db_p90_ms": pct(db_lat, 90) * 1e3,
                        "exact_db_p99_ms": pct(db_lat, 99) * 1e3, "exact_key_p50_ms": pct(key_lat, 50) * 1e3,
                        "exact_key_p99_ms": pct(key_lat, 99) * 1e3,
                        "exact_overhead_p50_ms": (pct(lat, 50) - pct(db_lat, 50) - pct(key_lat, 50)) * 1e3})
            out["exact_plan"] = await query_plan(url, vid)
            if backend == "postgresql":
                # Control for the server side: the round trip of a trivial prepared query on the same
                # connection pool, interleaved with exact queries (what any PostgreSQL query's tail is now).
                rt_lat = []
                for i in (rng.randrange(n) for _ in range(queries)):
                    await reader.fetch_one(sql, {"vid": vid, "tenant": tenant_of(i), "phash": key_of(i), "pk": PK,
                                                 "now": time.time()}, time.monotonic() + 1.0)
                    t0 = time.perf_counter()
                    await reader.fetch_one("SELECT 1", {}, time.monotonic() + 1.0)
                    rt_lat.append(time.perf_counter() - t0)
                out["exact_select1_p50_ms"], out["exact_select1_p99_ms"] = pct(rt_lat, 50) * 1e3, pct(rt_lat, 99) * 1e3
            miss_lat = []
            for j in range(queries // 4):
                t0 = time.perf_counter()
                await store.lookup("t1", "chat", {"messages": [{"role": "user", "content": f"unknown prompt {j}"}],
                                                  **PARAMS})
                miss_lat.append(time.perf_counter() - t0)
            out["exact_absent_p99_ms"] = pct(miss_lat, 99) * 1e3
        else:
            # The thread path's database part alone (what runs in the worker: SQLAlchemy Core + driver).
            sync_lat = []
            for i in (rng.randrange(n) for _ in range(queries)):
                text, phash, pk = lookup_key(i)
                t0 = time.perf_counter()
                store.exact.lookup_db(tenant_of(i), text, phash, pk)
                sync_lat.append(time.perf_counter() - t0)
            out["exact_thread_db_p99_ms"] = pct(sync_lat, 99) * 1e3
        await store.close()
    return out


async def query_plan(url: str, vid: int) -> str:
    """The plan of the fast path's exact query (must be an index point lookup)."""
    return await exact_query_plan(url, {"vid": vid, "tenant": tenant_of(0), "phash": key_of(0), "pk": PK,
                                        "now": time.time()})


async def bench_semantic(url: str, vecs: np.ndarray, queries: int) -> dict[str, float]:
    rng = np.random.default_rng(2)
    picks = rng.integers(0, len(vecs), queries)
    qv = l2_normalize(vecs[picks] + 0.01 * rng.standard_normal((queries, DIM)).astype(np.float32))
    table = {f"user: paraphrase {k}": qv[k] for k in range(queries)}
    store = FeatureStoreLookup(url, MODEL, embedder=TableEmbedder(table), cache_size=0, semantic_threshold=0.9,
                               timeout_ms=1000, index_refresh_s=3600)
    t0 = time.perf_counter()
    await store.warmup()
    build_s = time.perf_counter() - t0
    index = store.semantic.indexes[SEM_TENANT]
    fids = embedding_feature_ids(len(vecs))
    truth = np.argmax(qv @ vecs.T, axis=1) if len(vecs) <= 200_000 else picks
    lat, correct, hits = [], 0, 0
    for k in range(queries):
        t0 = time.perf_counter()
        hit = await store.lookup(SEM_TENANT, "chat", {"messages": [{"role": "user", "content": f"paraphrase {k}"}],
                                                      **PARAMS})
        lat.append(time.perf_counter() - t0)
        hits += hit is not None
        if hit is not None and hit.prompt_hash == key_of(fids[truth[k]] - 1):
            correct += 1
    search = []
    for k in range(min(queries, 500)):
        t0 = time.perf_counter()
        index.search(qv[k], k=8, threshold=0.9)
        search.append(time.perf_counter() - t0)
    await store.close()
    return {"semantic_p50_ms": pct(lat, 50) * 1e3, "semantic_p90_ms": pct(lat, 90) * 1e3,
            "semantic_p99_ms": pct(lat, 99) * 1e3, "index_search_p50_ms": pct(search, 50) * 1e3,
            "semantic_hit_rate": hits / queries, "semantic_recall_at_1": correct / queries,
            "index_search_p99_ms": pct(search, 99) * 1e3, "index_build_s": build_s, "index_ivf": float(index.is_ivf)}


def bench_brute_force(vecs: np.ndarray) -> dict[str, float]:
    idx = VectorIndex(DIM, ivf_min=10**9)
    idx.add(np.arange(len(vecs)), vecs)
    lat = []
    for k in range(100):
        t0 = time.perf_counter()
        idx.search(vecs[k], k=8)
        lat.append(time.perf_counter() - t0)
    return {"brute_force_search_p99_ms": pct(lat, 99) * 1e3}


def bench_minilm(n_prompts: int) -> dict[str, float]:
    from llmfleet.store.embeddings import MiniLMEmbedder

    e = MiniLMEmbedder()
    t0 = time.perf_counter()
    e.load()
    load_s = time.perf_counter() - t0
    lat = []
    for k in range(50):
        t0 = time.perf_counter()
        e.embed([f"a single incoming prompt to embed, number {k}"])
        lat.append(time.perf_counter() - t0)
    return {"minilm_load_s": load_s, "minilm_query_p50_ms": pct(lat, 50) * 1e3,
            "minilm_query_p99_ms": pct(lat, 99) * 1e3}


# --- offline generation ----------------------------------------------------------------------------------

async def bench_generation(url: str, folder: Path, lines: int, distinct: int, minilm_prompts: int) -> dict[str, float]:
    db.upgrade(url)
    rng = np.random.default_rng(3)
    ranks = np.minimum(rng.zipf(1.2, lines), distinct) - 1  # a heavy head, a long tail
    log = folder / f"gen-{hashlib.sha1(url.encode()).hexdigest()[:6]}.jsonl"
    with log.open("w") as f:
        for k, r in enumerate(ranks):
            f.write(json.dumps(log_record(f"generated prompt {int(r)} about topic {int(r) % 97}", tenant=f"t{r % 3}",
                                          model="gen", ts=float(k))) + "\n")
    engine = db.make_engine(url, writer=True)
    rep = generation.ingest_log(engine, log, batch_lines=2000)
    out = {"gen_log_lines": float(rep.lines), "gen_features": float(rep.features),
           "features_lines_per_s": rep.lines / rep.seconds["features"]}
    rep = generation.embed_features(engine, HashingEmbedder(256), model="gen", batch_size=256)
    out["hashing_embeddings_per_s"] = rep.embedded / rep.seconds["embeddings"]
    out["gen_distinct_prompts"] = float(rep.embedded)
    if minilm_prompts:
        from llmfleet.store.embeddings import MiniLMEmbedder

        e = MiniLMEmbedder()
        e.load()
        t0 = time.perf_counter()
        todo = repo.features_without_embedding(engine, e.name, limit=minilm_prompts, model="gen")
        vecs = e.embed([t for _, t in todo])
        repo.save_embeddings(engine, e.name, [i for i, _ in todo], vecs)
        out["minilm_embeddings_per_s"] = len(todo) / (time.perf_counter() - t0)
    v = repo.set_current_version(engine, "gen", "v1")
    server = FakeOpenAI().start()
    rep = await generation.precompute_responses(engine, model="gen", version_id=v.version_id,
                                                endpoint_url=server.url, min_frequency=2, concurrency=16)
    server.stop()
    out["responses_stored"] = float(rep.responses_ok)
    out["responses_per_s"] = rep.responses_ok / rep.seconds["responses"]
    engine.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=1_000_000)
    ap.add_argument("--embeddings", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=5000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--gen-lines", type=int, default=50_000)
    ap.add_argument("--gen-distinct", type=int, default=20_000)
    ap.add_argument("--minilm-prompts", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="100k prompts, 10k embeddings, 1k queries")
    ap.add_argument("--skip-generation", action="store_true", help="lookups only (while iterating)")
    ap.add_argument("--note", default="", help="free text stored in the results (e.g. what else ran)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "store_lookup.json"))
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.embeddings, args.queries = 100_000, 10_000, 1000
        args.gen_lines, args.gen_distinct, args.minilm_prompts = 10_000, 5000, 200
    if args.embeddings * N_TENANTS > args.prompts:
        ap.error(f"--embeddings must be <= --prompts / {N_TENANTS} (they are the prompts of one tenant)")
    vecs = synthetic_vectors(args.embeddings)
    load_start = round(os.getloadavg()[0], 1)
    results: dict[str, Any] = {"brute_force": bench_brute_force(vecs)}
    if args.minilm_prompts:
        results["minilm"] = bench_minilm(args.minilm_prompts)
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        folder = Path(tmp)
        for backend in args.backends.split(","):
            pg = None
            if backend == "sqlite":
                url, gen_url = f"sqlite:///{folder / 'bench.db'}", f"sqlite:///{folder / 'gen.db'}"
                version = sqlite3.sqlite_version
            else:
                pg = TempPostgres(fsync=True, extra_conf={"shared_buffers": "'512MB'"}).start()
                url, gen_url = pg.create_database("bench"), pg.create_database("gen")
                version = str(pg.bin.parent.name)
            try:
                print(f"[{backend}] populating {args.prompts} prompts + responses, {args.embeddings} embeddings",
                      file=sys.stderr, flush=True)
                r: dict[str, Any] = {"version": version, **populate(url, args.prompts, vecs)}
                print(f"[{backend}] populated in {r['populate_s']:.0f}s; lookups", file=sys.stderr, flush=True)
                r.update(asyncio.run(bench_exact(url, args.prompts, args.queries)))
                r.update(asyncio.run(bench_semantic(url, vecs, args.queries)))
                if not args.skip_generation:
                    print(f"[{backend}] generation", file=sys.stderr, flush=True)
                    r.update(asyncio.run(bench_generation(gen_url, folder, args.gen_lines, args.gen_distinct,
                                                          args.minilm_prompts)))
                results[backend] = r
            finally:
                if pg is not None:
                    pg.cleanup()
    doc = {
        "benchmark": "store_lookup",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {**machine(), "load_average_1m_at_start": load_start},
        "note": args.note,
        "sizes": {"prompt_rows": args.prompts, "response_rows": args.prompts, "embeddings": args.embeddings,
                  "queries": args.queries, "gen_log_lines": args.gen_lines, "gen_distinct_max": args.gen_distinct},
        "targets": {"exact_p99_ms": 1.0, "semantic_p99_ms": 10.0},
        "results": results,
    }
    m = doc["machine"]
    # Other processes on the box (load average above half the CPUs) stretch every tail: say so in the file.
    m["contended"] = max(m["load_average_1m_at_start"], m["load_average_1m_at_end"]) > 0.5 * (m["cpus"] or 1)
    doc["verdicts"] = verdicts(doc)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc)




if __name__ == "__main__":
    main()
