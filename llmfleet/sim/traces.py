"""Trace files for the simulator: Mooncake and Qwen-Bailian JSONL, Azure LLM-inference and BurstGPT CSV, compressed or
not; `load_trace` tells them apart. Mooncake's `hash_ids` (512-token blocks in its releases) and Qwen-Bailian's
(16-token blocks), the size told from the records (`infer_block_size`), become prefix chains
(`llmfleet.sim.workload.chain`); Azure and BurstGPT CSVs carry no content, so their requests share nothing.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import heapq
import itertools
import json
import lzma
import math
import re
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import IO

from llmfleet.api.contracts import INPUT_TEXT_ENCODING
from llmfleet.sim.workload import (
    BlockSizeError,
    Request,
    Workload,
    WorkloadError,
    chain,
    in_arrival_order,
    merge_blocks,
    skipped_note,
    spread_clock_ties,
)

MOONCAKE_BLOCK = 512
BAILIAN_BLOCK = 16
# A hash-block trace's timestamp units, as units per second: Mooncake documents milliseconds, Qwen-Bailian seconds.
TIME_UNITS = {"ms": 1000.0, "s": 1.0}


def _lengths(where: str, prompt: object, output: object) -> tuple[int, int] | None:
    """Token counts of one record: whole numbers >= 0 (a negative, fractional or non-numeric one is an error naming
    the line, never a 1); None for an empty record. An output of 0 is a request that produced no token in the
    traced service (BurstGPT marks its failures so; a production trace's zero-output rows are cancelled or failed
    requests); a prompt of 0 no engine accepts. Such a record is not replayed and is counted
    (`Workload.skipped_empty`): one of them does not make a whole real trace unreadable, and none vanishes unseen."""
    out = []
    for what, v in (("prompt", prompt), ("output", output)):
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise WorkloadError(f"{where}: {what} length must be a number, got {v!r}")
        f = float(v)
        if not math.isfinite(f) or f != int(f) or f < 0:
            raise WorkloadError(f"{where}: {what} length must be a whole number >= 0, got {v!r}")
        out.append(int(f))
    return None if 0 in out else (out[0], out[1])


def _arrival(where: str, seconds: float) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise WorkloadError(f"{where}: timestamp must be a finite number >= 0, got {seconds!r}")
    return seconds


# Compressed traces are read as they are (the Azure 2025 multimodal trace ships as .csv.gz): by suffix, the format's
# suffix before it.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")
TRACE_SUFFIXES = (".jsonl", ".csv")


def _plain(p: Path) -> Path:
    """`p` without a compression suffix (`trace.csv.gz` -> `trace.csv`)."""
    return p.with_suffix("") if p.suffix.lower() in COMPRESSED_SUFFIXES else p


def trace_stem(p: Path) -> str:
    """A trace file's name without its format and compression suffixes: the workload's name."""
    return _plain(p).stem


def is_trace_file(p: Path) -> bool:
    """A file a trace directory's scan picks up: .jsonl or .csv, compressed or not."""
    return _plain(p).suffix.lower() in TRACE_SUFFIXES


def _open_text(p: Path, newline: str | None = None) -> IO[str]:
    """A trace file as UTF-8 text, decompressed on the fly when its suffix is .gz, .bz2 or .xz."""
    suffix = p.suffix.lower()
    if suffix == ".gz":
        return gzip.open(p, "rt", encoding=INPUT_TEXT_ENCODING, newline=newline)
    if suffix == ".bz2":
        return bz2.open(p, "rt", encoding=INPUT_TEXT_ENCODING, newline=newline)
    if suffix == ".xz":
        return lzma.open(p, "rt", encoding=INPUT_TEXT_ENCODING, newline=newline)
    return p.open(encoding=INPUT_TEXT_ENCODING, newline=newline)


@contextmanager
def _reading(p: Path, expected: str) -> Iterator[None]:
    """A trace file that cannot be opened, decompressed or decoded: WorkloadError naming the file."""
    try:
        yield
    except OSError as e:  # gzip's and bz2's bad data are OSErrors too
        raise WorkloadError(f"{p}: {e.strerror or e}") from None
    except (EOFError, lzma.LZMAError) as e:  # a compressed file cut short, bad xz data
        raise WorkloadError(f"{p}: damaged compressed file ({e})") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{p}: not a text file ({expected} expected)") from None


@contextmanager
def _record(where: str, problem: str) -> Iterator[None]:
    """A record with a missing or malformed value: WorkloadError naming the line."""
    try:
        yield
    except WorkloadError:
        raise
    except KeyError as e:
        raise WorkloadError(f"{where}: {problem} (no {e})") from None
    except (TypeError, ValueError, OverflowError) as e:
        raise WorkloadError(f"{where}: {problem} ({e})") from None


PRUNE_MIN = 4096  # records `_Cut` holds before it first drops those outside the window


class _Cut:
    """Which records of a trace to keep: those within `seconds` of the earliest, and of those the `requests` earliest
    (file order among equal times), as `Workload.head` would cut the whole trace, whatever the order of the file.
    Only the kept requests are held, so a week-long trace's first hour takes an hour's memory: a record more than
    `seconds` after the earliest seen so far can never be in the window (the earliest only gets earlier), and a
    bounded heap holds the earliest `requests`."""

    def __init__(self, seconds: float | None, requests: int | None) -> None:
        self.seconds, self.requests = seconds, requests
        self.earliest = math.inf
        self._kept: list[Request] = []
        self._prune_at = PRUNE_MIN  # `_kept` length at which records the earliest has moved away from are dropped
        self._latest_first: list[tuple[float, int, Request]] = []  # a heap of (-arrival, -file order, request)
        self._seen = 0
        self._skipped_at: list[float] = []  # arrivals of empty records (`_lengths`), not replayed

    def add(self, r: Request) -> None:
        self._seen += 1
        self.earliest = min(self.earliest, r.arrival)
        if not self.within(r.arrival):
            return
        if self.requests is None:
            self._kept.append(r)
            if self.seconds is not None and len(self._kept) >= self._prune_at:  # a file out of time order
                self._kept = [k for k in self._kept if self.within(k.arrival)]
                self._prune_at = max(2 * len(self._kept), PRUNE_MIN)  # amortized: each record is copied O(1) times
            return
        heapq.heappush(self._latest_first, (-r.arrival, -self._seen, r))
        if len(self._latest_first) > self.requests:
            heapq.heappop(self._latest_first)  # the latest of them (the last in the file among equal times)

    def skip(self, t: float) -> None:
        """A record not replayed (`_lengths`), arriving at `t`: kept by `workload` where it lies in the window."""
        self._skipped_at.append(t)

    def workload(self, p: Path, reqs: list[Request], block_size: int) -> Workload:
        """The requests `kept()` returned (perhaps edited), requests sharing a stamp of a coarse clock spread over its
        tick (`spread_clock_ties`), in arrival order from 0, with the arrivals of the skipped
        records within their window on the same clock (after the last request, with a request limit, the file was
        never read that far); a WorkloadError naming how many were skipped when no request is left."""
        last = max((r.arrival for r in reqs), default=-math.inf) if self.requests is not None else math.inf
        skipped = [t for t in self._skipped_at if self.within(t) and t <= last]
        if not reqs:
            raise WorkloadError(f"{p}: no requests" + skipped_note(len(skipped)))
        spread_clock_ties(reqs)
        t0 = min(r.arrival for r in reqs)
        return Workload(trace_stem(p), in_arrival_order(reqs, from_zero=True), block_size,
                        tuple(sorted(max(t - t0, 0.0) for t in skipped)))  # (the first stamp's spread may pass one)

    def within(self, t: float) -> bool:
        """Whether a time lies in the window (after the whole file: against the earliest request)."""
        return self.seconds is None or t - self.earliest <= self.seconds

    def kept(self) -> list[Request]:
        reqs = self._kept if self.requests is None else [  # in file order: equal times keep it
            r for _, _, r in sorted(self._latest_first, key=lambda x: -x[1])]
        return [r for r in reqs if self.within(r.arrival)]


# Block sizes a hash-block trace may use (the engines' page sizes, vLLM's 16 to Mooncake's 512, and room either way).
BLOCK_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
# Records read ahead to tell a trace's block size (`infer_block_size`): enough for any trace's mix of prompt lengths,
# few enough to hold in memory however long the trace.
INFER_RECORDS = 2000


def infer_block_size(lengths: list[tuple[int, int]], default: int) -> int:
    """The block size, in tokens, that (prompt tokens, hash ids) pairs of a trace's records were cut with: the one of
    BLOCK_SIZES for which a record's ids are its prompt's blocks (whole, or with the partial last block) for most
    records, if at least 90 % of the records with two or more ids agree; else `default` (the format's documented
    size, also preferred among equals). A trace in Mooncake's schema cut into other blocks than Mooncake's 512 tokens
    is otherwise read at the wrong granularity, silently: 64-token ids taken as 512-token ones make every prompt
    8x its blocks, cut to the first eighth."""
    telling = [(i, n) for i, n in lengths if n >= 2]  # one id fits every size above the prompt's length
    if not telling:
        return default
    fits = {b: sum(1 for i, n in telling if n in (i // b, -(-i // b))) for b in BLOCK_SIZES}
    best = max(fits.values())
    if best < 0.9 * len(telling):
        return default
    return default if fits.get(default) == best else next(b for b in BLOCK_SIZES if fits[b] == best)


def infer_time_unit(timestamps: list[float], default: str) -> str:
    """The unit of a hash-block trace's timestamps: seconds where the median gap between consecutive distinct ones is
    under 1 (read as milliseconds they would be more than 1,000 arrivals a second, at sub-millisecond stamps: no
    trace of prompts thousands of tokens long), else `default`, the format's documented unit. Mooncake's schema is
    also written by conversions that keep seconds (time.time() floats); read as milliseconds such a trace replays
    1,000x compressed, silently. Whole-number stamps never move off the default (their gaps are >= 1), nor does a
    seconds trace slower than about one arrival a second: name its unit (`load_trace(time_unit=...)`)."""
    gaps = [b - a for a, b in itertools.pairwise(sorted(timestamps)) if b > a]
    return "s" if gaps and statistics.median(gaps) < 1 else default


class TimeUnitError(WorkloadError):
    """A timestamp unit that is unknown or given for a trace whose timestamps have their own (the option is wrong
    for every run, not the file)."""


def _check_time_unit(p: Path, time_unit: str | None) -> None:
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise TimeUnitError(f"{p}: unknown time unit {time_unit!r}; known: {', '.join(TIME_UNITS)}")


_Record = tuple[str, float, int, int, list[int], int, int, str | None]


def _hash_block_records(p: Path, kind: str, sessions: bool) -> Iterator[_Record]:
    """(file:line, timestamp, input_length, output_length, hash_ids, chat_id, parent_chat_id, session_id) of each
    record, checked; chat ids 0 unless `sessions`."""
    with _reading(p, f"{kind} JSONL"), _open_text(p) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p}:{n}"
            with _record(where, f"not a {kind} record"):
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise WorkloadError(f"{where}: not a JSON object")
                inp, out = _lengths(where, d["input_length"], d["output_length"]) or (0, 0)  # (0, 0): skipped
                ts = d["timestamp"]
                if isinstance(ts, bool) or not isinstance(ts, int | float):
                    raise WorkloadError(f"{where}: timestamp must be a number, got {ts!r}")
                ids = d.get("hash_ids") or []
                # one C-level pass (a 16-token-block trace has ~100 ids per 1,600 prompt tokens); a bool is no id
                if not isinstance(ids, list) or not set(map(type, ids)) <= {int}:
                    raise WorkloadError(f"{where}: hash_ids must be a list of integers")
                chat = parent = 0
                if sessions:
                    chat, parent = d["chat_id"], d["parent_chat_id"]
                    if not (isinstance(chat, int) and isinstance(parent, int)) or isinstance(chat, bool) \
                            or isinstance(parent, bool):
                        raise WorkloadError(f"{where}: chat_id and parent_chat_id must be integers")
                session = d.get("session_id")
                if session is not None and (isinstance(session, bool) or not isinstance(session, str | int)):
                    raise WorkloadError(f"{where}: session_id must be a string or an integer, got {session!r}")
                yield where, float(ts), inp, out, ids, chat, parent, None if session is None else str(session)


def _hash_block_jsonl(p: Path, kind: str, block_size: int | None, default_block: int, time_unit: str | None,
                      default_unit: str, sessions: bool, cut: _Cut, kv_block_size: int | None = None) -> Workload:
    """A JSONL trace of `timestamp`, `input_length`, `output_length` and `hash_ids` (one id per block of the prompt,
    equal ids at the same position meaning a shared prefix). The block size is `block_size`, or with None the one
    the first INFER_RECORDS records were cut with (`infer_block_size`, falling back to `default_block`); the
    timestamps' unit `time_unit` (TIME_UNITS), or with None the one those records tell (`infer_time_unit`, falling
    back to `default_unit`). Arrivals start at 0: the first request (a slice of a longer trace, epoch stamps) is
    replayed at once, not after the idle time before it. `sessions`: the records also carry `chat_id` and
    `parent_chat_id` (-1 for a conversation's first turn), and each request's session (`Request.session`) is its
    conversation's (`_conversations`); otherwise a record's `session_id`, where it has one, is its session.
    `kv_block_size`: where larger than the trace's blocks, they are merged into blocks of that size as they are read
    (`Workload.reblocked`, without ever holding the finer keys)."""
    _check_time_unit(p, time_unit)
    records = _hash_block_records(p, kind, sessions)
    ahead: list[_Record] = []
    if block_size is None or time_unit is None:
        ahead = list(islice(records, INFER_RECORDS))
    if block_size is None:
        block_size = infer_block_size([(r[2], len(r[4])) for r in ahead if r[3]], default_block)  # not empty ones
    if time_unit is None:
        time_unit = infer_time_unit([r[1] for r in ahead], default_unit)
    units_per_s = TIME_UNITS[time_unit]
    k = 1  # trace blocks per simulated block
    if kv_block_size is not None and kv_block_size > block_size:
        if kv_block_size % block_size:
            raise BlockSizeError(trace_stem(p), kv_block_size, block_size)
        k = kv_block_size // block_size
    parent_of: dict[int, int] = {}
    for where, ts, inp, out, ids, chat, parent, session in itertools.chain(ahead, records):
        if sessions:
            parent_of[chat] = parent  # a skipped turn still links its conversation
        if out == 0:  # an empty record (`_lengths`)
            cut.skip(_arrival(where, ts / units_per_s))
            continue
        keys = chain(ids[: inp // block_size])
        # the chat id rides in `rid` until the requests are numbered in arrival order
        cut.add(Request(chat, _arrival(where, ts / units_per_s), inp, out, keys[k - 1::k] if k > 1 else keys,
                        session=session))
    reqs = cut.kept()
    if sessions:
        for r, conversation in zip(reqs, _conversations([r.rid for r in reqs], parent_of), strict=True):
            r.session = conversation
    return cut.workload(p, reqs, block_size * k)


def _conversations(chats: list[int], parent_of: dict[int, int]) -> list[str]:
    """Each chat's conversation, `chat-<id of its first turn>`: parents followed up to a first turn (parent -1) or to
    a parent the file lacks (a sampled trace: then the missing parent's id), in whatever order the records came;
    a cycle of parents ends where it closes."""
    root: dict[int, int] = {}
    for chat in chats:
        path, c = [], chat
        while c not in root:
            parent = parent_of.get(c, -1)
            if c in path or parent < 0 or parent not in parent_of:
                root[c] = c if c in path or parent < 0 else parent
                break
            path.append(c)
            c = parent
        for c2 in path:
            root[c2] = root[c]
    return [f"chat-{root[c]}" for c in chats]


def load_mooncake(path: str | Path, block_size: int | None = None, *, seconds: float | None = None,
                  requests: int | None = None, kv_block_size: int | None = None,
                  time_unit: str | None = None) -> Workload:
    """Mooncake JSONL (kvcache-ai/Mooncake FAST'25 traces): timestamp (ms), input_length, output_length, hash_ids
    (512-token blocks in Mooncake's releases; `block_size` None: told from the records, `infer_block_size`), and
    where a record has one, session_id. `seconds`, `requests`: only the first that many (`_Cut`), for every
    loader; `kv_block_size`: blocks merged into that size where larger (`load_trace`); `time_unit` "ms" or "s",
    None: milliseconds unless the records tell seconds (`infer_time_unit`)."""
    return _hash_block_jsonl(Path(path), "Mooncake", block_size, MOONCAKE_BLOCK, time_unit, "ms", sessions=False,
                             cut=_Cut(seconds, requests), kv_block_size=kv_block_size)


def load_bailian(path: str | Path, block_size: int | None = None, *, seconds: float | None = None,
                 requests: int | None = None, kv_block_size: int | None = None,
                 time_unit: str | None = None) -> Workload:
    """Qwen-Bailian JSONL (alibaba-edu/qwen-bailian-usagetraces-anon: the to-C, to-B, thinking and coder traces):
    chat_id, parent_chat_id (-1 for a conversation's first turn), timestamp (seconds), input_length,
    output_length, type, turn, hash_ids (16-token blocks; `block_size` None: told from the records). Requests of one
    conversation share a session; `time_unit`: as for `load_mooncake`, seconds where None."""
    return _hash_block_jsonl(Path(path), "Qwen-Bailian", block_size, BAILIAN_BLOCK, time_unit, "s", sessions=True,
                             cut=_Cut(seconds, requests), kv_block_size=kv_block_size)


_FRACTION = re.compile(r"\.(\d+)")


def _parse_ts(s: str) -> float:
    """Seconds of an Azure TIMESTAMP: 2023's `2023-11-16 18:17:03.9799600` or 2024's
    `2024-05-10 00:00:00.009930+00:00`. A time without a zone is UTC, so no machine's DST puts a gap in a trace."""
    # 7 fractional digits in 2023's release; datetime takes at most 6
    t = datetime.fromisoformat(_FRACTION.sub(lambda m: "." + m.group(1)[:6], s.strip(), count=1))
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _csv_rows(p: Path, expected: str, columns: tuple[str, ...]) -> Iterator[tuple[str, dict[str, str | None]]]:
    """(file:line, row) for each data row of a CSV trace that has `columns`; a WorkloadError naming the file for
    one that cannot be read, lacks a column or is not CSV."""
    try:
        with _reading(p, expected), _open_text(p, newline="") as f:
            rd = csv.DictReader(f)
            missing = set(columns) - set(rd.fieldnames or [])
            if missing:
                raise WorkloadError(f"{p}: missing columns {', '.join(sorted(missing))}")
            for n, row in enumerate(rd, 2):
                yield f"{p}:{n}", row
    except csv.Error as e:
        raise WorkloadError(f"{p}: not a CSV file ({e})") from None


def load_azure(path: str | Path, block_size: int = 16, *, seconds: float | None = None,
               requests: int | None = None) -> Workload:
    """Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens (no content: no sharing). A row
    with 0 ContextTokens or GeneratedTokens is not replayed and is counted (`_lengths`)."""
    p = Path(path)
    cut = _Cut(seconds, requests)
    for where, row in _csv_rows(p, "Azure CSV", AZURE_COLUMNS):
        with _record(where, "bad row"):
            ts = row["TIMESTAMP"]
            if not isinstance(ts, str):
                raise WorkloadError(f"{where}: no TIMESTAMP")
            lengths = _lengths(where, row["ContextTokens"], row["GeneratedTokens"])
            if lengths is None:
                cut.skip(_parse_ts(ts))
                continue
            cut.add(Request(0, _parse_ts(ts), *lengths))
    return cut.workload(p, cut.kept(), block_size)


BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def load_burstgpt(path: str | Path, block_size: int = 16, *, seconds: float | None = None,
                  requests: int | None = None) -> Workload:
    """BurstGPT CSV (HPMLL/BurstGPT: Timestamp in seconds, Model, Request tokens, Response tokens, Total tokens,
    Log Type; no content: no sharing).

    The release marks requests that failed in the original service with `Response tokens` 0: they are not
    replayed and are counted (`_lengths`). Any other bad row is an error naming its line."""
    p = Path(path)
    cut = _Cut(seconds, requests)
    for where, row in _csv_rows(p, "BurstGPT CSV", BURSTGPT_COLUMNS):
        with _record(where, "bad row"):
            ts = row["Timestamp"]
            if ts is None:
                raise WorkloadError(f"{where}: no Timestamp")
            lengths = _lengths(where, row["Request tokens"], row["Response tokens"])
            if lengths is None:
                cut.skip(_arrival(where, float(ts)))
                continue
            cut.add(Request(0, _arrival(where, float(ts)), *lengths))
    return cut.workload(p, cut.kept(), block_size)


TRACE_FORMATS = ("mooncake", "bailian", "azure", "burstgpt")


def _csv_kind(p: Path) -> str:
    """Which CSV trace `p` is, by its header row: BurstGPT's columns, else Azure's (whose loader names what is
    missing)."""
    with _reading(p, "CSV trace"), _open_text(p, newline="") as f:
        header = f.readline()
    return "burstgpt" if all(c in header for c in BURSTGPT_COLUMNS) else "azure"


def _jsonl_kind(p: Path) -> str:
    """Which JSONL trace `p` is, by its first record: Qwen-Bailian's when it has `parent_chat_id` (its timestamps
    are seconds and its blocks 16 tokens, read as Mooncake's they would be 1,000x too close and 32x too long),
    else Mooncake's (whose loader names what is wrong with a record)."""
    with _reading(p, "JSONL trace"), _open_text(p) as f:
        first = next((line for line in f if line.strip()), "")
    try:
        d = json.loads(first)
    except ValueError:
        return "mooncake"
    return "bailian" if isinstance(d, dict) and "parent_chat_id" in d else "mooncake"


def load_trace(path: str | Path, fmt: str = "auto", *, seconds: float | None = None,
               requests: int | None = None, kv_block_size: int | None = None,
               time_unit: str | None = None) -> Workload:
    """Any trace format the simulator knows: `fmt` "mooncake" or "bailian" (JSONL), "azure" or "burstgpt" (CSV), or
    "auto": a .csv is BurstGPT when its header has BurstGPT's columns, else Azure; anything else is Qwen-Bailian
    when its first record has `parent_chat_id`, else Mooncake. A .gz, .bz2 or .xz file is read decompressed, its
    format told by the suffix before (`trace.csv.gz` is a CSV). `seconds`, `requests`: only the requests within that
    many seconds of the first, or the first that many (both: whichever is fewer), holding only those in memory
    (`_Cut`). `kv_block_size`: a trace whose blocks are smaller is simulated on engines with blocks of that many
    tokens (`merge_blocks`; a hash-block trace's are merged as they are read, so its finer keys are never all held;
    a size its blocks do not divide is a BlockSizeError). `time_unit`: a JSONL trace's timestamp unit, "ms" or "s"
    (TIME_UNITS), where the format's documented one and `infer_time_unit` get it wrong; CSV traces carry dates
    (Azure) or seconds (BurstGPT) and take none."""
    p = Path(path)
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise WorkloadError(f"{p}: seconds to read must be a finite number > 0, got {seconds:g}")
    if requests is not None and requests < 1:
        raise WorkloadError(f"{p}: requests to read must be >= 1, got {requests}")
    if kv_block_size is not None and (isinstance(kv_block_size, bool) or kv_block_size < 1):
        raise WorkloadError(f"{p}: KV block size must be >= 1, got {kv_block_size!r}")
    if fmt not in ("auto", *TRACE_FORMATS):
        raise WorkloadError(f"unknown trace format {fmt!r}; known: auto, {', '.join(TRACE_FORMATS)}")
    _check_time_unit(p, time_unit)
    kind = fmt if fmt != "auto" else (_csv_kind(p) if _plain(p).suffix.lower() == ".csv" else _jsonl_kind(p))
    if kind in ("mooncake", "bailian"):
        hash_loader = load_mooncake if kind == "mooncake" else load_bailian
        return hash_loader(p, seconds=seconds, requests=requests, kv_block_size=kv_block_size, time_unit=time_unit)
    if time_unit is not None:
        raise TimeUnitError(f"{p}: a time unit is for JSONL traces; this {kind} CSV's timestamps are "
                            f"{'dates' if kind == 'azure' else 'seconds'}")
    csv_loader = load_azure if kind == "azure" else load_burstgpt
    return merge_blocks(csv_loader(p, seconds=seconds, requests=requests), kv_block_size)
