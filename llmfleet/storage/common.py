"""Pieces shared by the S3 and Hub transfers: errors, results, the record of complete files, progress lines."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.api.storage import StorageUri

log = logging.getLogger("llmfleet.storage")

# Written into the destination folder: which files are complete (and their remote checksums), so a second
# fetch skips them without reading them again, and whether the whole location arrived.
RECORD_FILE = ".llmfleet-fetch.json"
LOCK_FILE = ".llmfleet-fetch.lock"
PARTIAL_SUFFIX = ".part"


def is_bookkeeping(path: Path) -> bool:
    """The record and lock files fetch keeps in a destination: never copied or uploaded as content."""
    return path.name.startswith((RECORD_FILE, LOCK_FILE))


class FetchError(RuntimeError):
    """A location that cannot be copied: missing, unreachable, unauthorized, or a checksum that does not match."""


@dataclass
class FetchResult:
    """What one fetch or upload did."""

    uri: str
    dest: str
    files: int = 0
    bytes_total: int = 0
    bytes_transferred: int = 0
    skipped: int = 0
    seconds: float = 0.0


@dataclass
class RemoteFile:
    """One file of a location: its path relative to the location, size and checksum tag (ETag, blob id)."""

    rel: str
    size: int
    tag: str
    extra: dict[str, Any] = field(default_factory=dict)


class Progress:
    """Logs `done/total` at most every `every_s` seconds and once at the end."""

    def __init__(self, label: str, files: int, total: int, every_s: float = 5.0) -> None:
        self.label, self.files, self.total, self.every_s = label, files, total, every_s
        self.done_files = 0
        self.done = 0
        self.moved = 0
        self.start = time.monotonic()
        self._last = self.start

    def add(self, n: int, moved: bool = True) -> None:
        self.done += n
        if moved:
            self.moved += n
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.report()

    def file_done(self) -> None:
        self.done_files += 1

    def report(self, final: bool = False) -> None:
        elapsed = max(1e-6, time.monotonic() - self.start)
        pct = 100.0 * self.done / self.total if self.total else 100.0
        log.info(
            "%s %s: %d/%d files, %s / %s (%.0f%%), %s/s",
            "fetched" if final else "fetching", self.label, self.done_files, self.files, _size(self.done),
            _size(self.total), pct, _size(self.moved / elapsed),
        )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def selected(files: Sequence[RemoteFile], include: Sequence[str] | None) -> list[RemoteFile]:
    """The files whose relative path matches one of `include` (fnmatch patterns), or all of them."""
    if not include:
        return list(files)
    return [f for f in files if any(fnmatch.fnmatch(f.rel, pat) for pat in include)]


class Record:
    """The destination's record of complete files: rel -> {size, tag}."""

    def __init__(self, dest: Path, uri: str) -> None:
        self.path = dest / RECORD_FILE
        self.uri = uri
        self.files: dict[str, dict[str, Any]] = {}
        self.complete = False
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("uri") == uri and isinstance(data.get("files"), dict):
            self.files = data["files"]
            self.complete = bool(data.get("complete"))

    def has(self, dest: Path, f: RemoteFile) -> bool:
        """The file is recorded with the same size and tag, and the local copy still has that size."""
        rec = self.files.get(f.rel)
        if not rec or rec.get("size") != f.size or rec.get("tag") != f.tag:
            return False
        local = dest / f.rel
        return local.is_file() and local.stat().st_size == f.size

    def add(self, f: RemoteFile) -> None:
        self.files[f.rel] = {"size": f.size, "tag": f.tag}
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"uri": self.uri, "complete": self.complete, "files": self.files}, indent=1))
        os.replace(tmp, self.path)


def target_file(dest: Path, rel: str) -> Path:
    """dest/rel, refusing names that would land outside dest (keys like '../x')."""
    target = (dest / rel).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise FetchError(f"refusing {rel!r}: it would be written outside {dest}")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def cache_key(uri: StorageUri) -> str:
    """The location's own folder name inside a shared cache: a readable name + a hash of the full URI."""
    digest = hashlib.sha256(str(uri).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", uri.name).strip("-.")[:40] or "loc"
    return f"{name}-{digest}"


def fetch_files(
    uri: str,
    dest: Path,
    files: Sequence[RemoteFile],
    download: Callable[[RemoteFile, Path, Progress], int],
    progress_label: str,
    complete: bool,
    progress_every_s: float,
) -> FetchResult:
    """Fetch each file not yet recorded complete in `dest` with `download(file, target, progress)` (which
    returns the bytes it moved and raises FetchError on a bad checksum); record each as it completes."""
    record = Record(dest, uri)
    progress = Progress(progress_label, len(files), sum(f.size for f in files), progress_every_s)
    result = FetchResult(uri=uri, dest=str(dest), files=len(files), bytes_total=progress.total)
    for f in files:
        if record.has(dest, f):
            result.skipped += 1
            progress.add(f.size, moved=False)
        else:
            result.bytes_transferred += download(f, target_file(dest, f.rel), progress)
            record.add(f)
        progress.file_done()
    record.complete = complete
    record.save()
    progress.report(final=True)
    return result
