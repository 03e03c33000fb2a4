"""Offline feature generation: request log -> prompt features -> embeddings -> precomputed responses.

Every stage is resumable. The log is read from the byte offset stored in `log_progress`, and each batch's
features are committed in the same transaction as the new offset (a crash loses the batch in flight and
nothing else; a rerun counts no line twice). Embeddings are computed for features that have none; responses
for head prompts (frequency >= min_frequency) that have no live response for the current model version.
Unique keys make a duplicate impossible even when two generators run at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from llmfleet.store import repo
from llmfleet.store.embeddings import Embedder
from llmfleet.store.metrics import store_metrics
from llmfleet.store.normalize import (
    BadRequestError,
    normalized_prompt,
    prefix_block_hashes,
    prompt_hash,
    sampling_params,
)


class GenerationError(RuntimeError):
    """A fatal problem (unreadable log, no model version); the CLI prints it on one line."""


@dataclass
class Report:
    lines: int = 0
    bad_lines: int = 0
    features: int = 0
    embedded: int = 0
    head: int = 0
    responses_done_before: int = 0
    responses_ok: int = 0
    responses_failed: int = 0
    invalidated: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


# A progress hook: (stage, advance, total or None). The CLI plugs a rich progress bar in.
ProgressFn = Callable[[str, int, int | None], None]


def _noop(stage: str, advance: int, total: int | None) -> None:
    return None


def log_source(path: Path) -> str | None:
    """Identity of a log file: sha256 of its absolute path and first line (a rotated log starts afresh)."""
    with path.open("rb") as f:
        first = f.readline()
    if not first.endswith(b"\n"):
        return None
    return hashlib.sha256(str(path.resolve()).encode() + b"\n" + first).hexdigest()


def read_batches(path: Path, offset: int, batch_lines: int) -> Iterator[tuple[int, int, list[bytes]]]:
    """(start offset, end offset, complete lines) batches from `offset`; a trailing partial line is left."""
    with path.open("rb") as f:
        f.seek(offset)
        start, lines = offset, []
        pos = offset
        for line in f:
            if not line.endswith(b"\n"):
                break  # being written right now: the next run gets it
            pos += len(line)
            lines.append(line)
            if len(lines) >= batch_lines:
                yield start, pos, lines
                start, lines = pos, []
        if lines:
            yield start, pos, lines


def aggregate(lines: list[bytes], block_size: int, report: Report) -> dict[tuple[str, str, str], repo.FeatureAgg]:
    """Fold one batch of log lines into per-(tenant, model, prompt hash) aggregates."""
    out: dict[tuple[str, str, str], repo.FeatureAgg] = {}
    for raw in lines:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if int(rec.get("status", 200)) >= 400:
                continue  # rejected requests say nothing about what the model is asked
            endpoint = rec.get("endpoint", "chat")
            text = normalized_prompt(endpoint, rec.get("prompt"), rec.get("messages"))
            tenant, model, ts = str(rec["tenant"]), str(rec["model"]), float(rec["ts"])
        except (ValueError, KeyError, TypeError, RecursionError, BadRequestError) as e:
            report.bad_lines += 1
            if len(report.errors) < 5:
                report.errors.append(f"bad log line ({type(e).__name__}: {e}): {raw[:120]!r}")
            continue
        h = prompt_hash(endpoint, text)
        key = (tenant, model, h)
        agg = out.get(key)
        if agg is None:
            request = {
                "endpoint": endpoint,
                "prompt": rec.get("prompt") if not rec.get("messages") else None,
                "messages": rec.get("messages"),
                "params": sampling_params(rec.get("params") or {}),
            }
            agg = out[key] = repo.FeatureAgg(
                tenant=tenant, model=model, prompt_hash=h, endpoint=endpoint, text=text, request=request,
                token_count=int(rec.get("input_tokens") or 0), prefix_blocks=prefix_block_hashes(text, block_size),
                first_seen=ts, last_seen=ts,
            )
        agg.frequency += 1
        agg.first_seen = min(agg.first_seen, ts)
        if ts >= agg.last_seen:
            agg.last_seen = ts
            agg.token_count = int(rec.get("input_tokens") or agg.token_count)
    return out


def ingest_log(
    engine: Engine,
    path: Path,
    *,
    batch_lines: int = 2000,
    block_size: int = 16,
    report: Report | None = None,
    progress: ProgressFn = _noop,
    after_batch: Callable[[int], None] | None = None,
) -> Report:
    """Add the log's new lines to prompt_features (resumable, idempotent)."""
    report = report or Report()
    t0 = time.perf_counter()
    try:
        source = log_source(path)
        size = path.stat().st_size
    except OSError as e:
        raise GenerationError(f"cannot read request log {path}: {e.strerror or e}") from e
    if source is None:
        return report
    # A conflict means another generator ingested the batch first: continue from where it got to.
    for attempt in range(10_000):
        offset, _ = repo.log_offset(engine, source)
        progress("features", 0, size)
        progress("features", offset, None)
        try:
            for n, (start, end, lines) in enumerate(read_batches(path, offset, batch_lines)):
                aggs = aggregate(lines, block_size, report)
                repo.ingest_batch(engine, source=source, path=str(path.resolve()), start_offset=start,
                                  end_offset=end, lines=len(lines), features=aggs.values())
                report.lines += len(lines)
                report.features += len(aggs)
                progress("features", end - start, None)
                if after_batch is not None:
                    after_batch(n)
            break
        except repo.ProgressConflictError:
            if attempt == 9_999:
                raise
    report.seconds["features"] = time.perf_counter() - t0
    return report


def embed_features(
    engine: Engine,
    embedder: Embedder,
    *,
    model: str | None = None,
    batch_size: int = 256,
    report: Report | None = None,
    progress: ProgressFn = _noop,
) -> Report:
    """Embed every feature that has no embedding under this embedder yet."""
    report = report or Report()
    t0 = time.perf_counter()
    after = 0
    progress("embeddings", 0, None)
    while True:
        todo = repo.features_without_embedding(engine, embedder.name, after_id=after, limit=batch_size, model=model)
        if not todo:
            break
        vecs = embedder.embed([t for _, t in todo])
        report.embedded += repo.save_embeddings(engine, embedder.name, [i for i, _ in todo], vecs)
        after = todo[-1][0]
        progress("embeddings", len(todo), None)
    report.seconds["embeddings"] = time.perf_counter() - t0
    return report


def _api_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


async def precompute_responses(
    engine: Engine,
    *,
    model: str,
    version_id: int,
    endpoint_url: str,
    served_model: str | None = None,
    min_frequency: int = 3,
    concurrency: int = 8,
    ttl_seconds: float | None = 7 * 86400,
    api_key: str | None = None,
    request_timeout_s: float = 120.0,
    max_prompts: int | None = None,
    retries: int = 2,
    report: Report | None = None,
    progress: ProgressFn = _noop,
) -> Report:
    """Ask the endpoint for the head prompts' responses that are missing; store each as soon as it arrives."""
    import httpx

    report = report or Report()
    t0 = time.perf_counter()
    metrics = store_metrics().generated
    head = await asyncio.to_thread(repo.head_prompts, engine, model, min_frequency, max_prompts)
    done = await asyncio.to_thread(repo.valid_response_keys, engine, version_id)
    todo = [h for h in head if (h.tenant, h.prompt_hash, h.params_hash) not in done]
    report.head = len(head)
    report.responses_done_before = len(head) - len(todo)
    progress("responses", 0, len(todo))
    base = _api_base(endpoint_url)
    sem = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def one(client: httpx.AsyncClient, h: repo.HeadPrompt) -> None:
        req = h.request
        params = dict(req.get("params") or {})
        body: dict[str, Any] = {**params, "model": served_model or model, "stream": False}
        if h.endpoint == "chat":
            body["messages"] = req.get("messages")
            path = "/chat/completions"
        else:
            body["prompt"] = req.get("prompt")
            path = "/completions"
        async with sem:
            for attempt in range(retries + 1):
                try:
                    r = await client.post(base + path, json=body, headers=headers)
                except httpx.HTTPError as e:
                    err = f"{type(e).__name__}: {e}"
                else:
                    if r.status_code == 200:
                        try:
                            text = json.dumps(r.json(), separators=(",", ":"))
                        except ValueError:
                            err = "endpoint returned invalid JSON"
                        else:
                            await asyncio.to_thread(
                                repo.save_response, engine, tenant=h.tenant, prompt_hash=h.prompt_hash,
                                version_id=version_id, params=params, params_hash=h.params_hash, response=text,
                                ttl_seconds=ttl_seconds,
                            )
                            report.responses_ok += 1
                            metrics.labels("responses", "ok").inc()
                            progress("responses", 1, None)
                            return
                    else:
                        err = f"HTTP {r.status_code}: {r.text[:200]}"
                        if r.status_code < 500 and r.status_code != 429:
                            break  # the request itself is bad: retrying will not help
                if attempt < retries:
                    await asyncio.sleep(0.5 * 2**attempt)
        report.responses_failed += 1
        metrics.labels("responses", "failed").inc()
        if len(report.errors) < 5:
            report.errors.append(f"prompt {h.prompt_hash[:12]} ({h.tenant}): {err}")
        progress("responses", 1, None)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=request_timeout_s, limits=limits) as client:
        await asyncio.gather(*(one(client, h) for h in todo))
    report.seconds["responses"] = time.perf_counter() - t0
    return report
