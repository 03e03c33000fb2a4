"""fetch / upload: dispatch on the URI scheme; the record of finished files; progress lines; the folder lock."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.api.storage import StorageUri, UriError, parse_uri

log = logging.getLogger("llmfleet.storage")

# Written into the destination folder: which files are complete (and their remote checksums), so a second
# fetch skips them without reading them again, and whether the whole location arrived.
RECORD_FILE = ".llmfleet-fetch.json"
LOCK_FILE = ".llmfleet-fetch.lock"
PARTIAL_SUFFIX = ".part"


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


@contextmanager
def folder_lock(dest: Path, timeout_s: float) -> Iterator[None]:
    """One fetch per destination at a time (pods sharing a cache claim); the others wait, then skip."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(dest / LOCK_FILE))
    try:
        with lock.acquire(timeout=timeout_s):
            yield
    except Timeout:
        raise FetchError(f"{dest} is being filled by another fetch for more than {timeout_s:.0f}s") from None


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


def cache_base() -> Path:
    """$LLMFLEET_CACHE, else ~/.cache/llmfleet: where local runs keep built and fetched models."""
    base = os.environ.get("LLMFLEET_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "llmfleet"


def local_copy(uri: str | StorageUri) -> Path:
    """A local folder holding the location: a local path as it is, s3:// and hf:// fetched into the cache.

    For `llmfleet up` and `llmfleet train` (pods get theirs from the operator's init containers).
    """
    u = parse(uri)
    if u.scheme == "local":
        return Path(u.path).expanduser()
    if not u.is_remote:
        raise FetchError(f"{u}: {u.scheme}:// cannot be read on this machine "
                         + ("(pvc:// claims exist only on Kubernetes)" if u.scheme == "pvc" else ""))
    dest = cache_base() / "fetched" / cache_key(u)
    log.info("fetching %s into %s", u, dest)
    fetch(u, dest)
    return dest


def parse(uri: str | StorageUri) -> StorageUri:
    if isinstance(uri, StorageUri):
        return uri
    try:
        return parse_uri(uri)
    except UriError as err:
        raise FetchError(str(err)) from None


def fetch(
    uri: str | StorageUri,
    dest: str | Path,
    include: Sequence[str] | None = None,
    *,
    lock_timeout_s: float = 6 * 3600.0,
    progress_every_s: float = 5.0,
) -> FetchResult:
    """Copy the location into `dest` (created); files already complete there are skipped.

    `include`: fnmatch patterns of the relative paths to copy (e.g. the router's tokenizer files only).
    Credentials and endpoints come from the environment (see llmfleet.api.storage for the variable names).
    """
    u = parse(uri)
    folder = Path(dest)
    if u.scheme == "pvc":
        raise FetchError(f"{u}: a pvc:// location is mounted into the pod by the operator, not fetched; "
                         "fetch from the mounted folder instead")
    if u.scheme == "tiny":
        raise FetchError(f"{u}: tiny:// models are built locally by `llmfleet model build-tiny`")
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with folder_lock(folder, lock_timeout_s):
        if u.scheme == "s3":
            from llmfleet.storage import s3

            result = s3.fetch(u, folder, include, progress_every_s)
        elif u.scheme == "hf":
            from llmfleet.storage import hf

            result = hf.fetch(u, folder, include, progress_every_s)
        else:
            result = copy_local(Path(u.path).expanduser(), folder, include, progress_every_s)
    result.seconds = time.monotonic() - start
    return result


def copy_local(src: Path, dest: Path, include: Sequence[str] | None, progress_every_s: float) -> FetchResult:
    """Copy a local file or folder; files with the same size and mtime are already there."""
    if not src.exists():
        raise FetchError(f"{src}: no such file or folder")
    if src.resolve() == dest.resolve():
        return FetchResult(uri=str(src), dest=str(dest))
    pairs = [(src, src.name)] if src.is_file() else [
        (p, p.relative_to(src).as_posix()) for p in sorted(src.rglob("*")) if p.is_file()
    ]
    files = selected([RemoteFile(rel, p.stat().st_size, str(int(p.stat().st_mtime))) for p, rel in pairs], include)
    by_rel = dict((rel, p) for p, rel in pairs)
    progress = Progress(str(src), len(files), sum(f.size for f in files), progress_every_s)
    result = FetchResult(uri=str(src), dest=str(dest), files=len(files), bytes_total=progress.total)
    for f in files:
        target = target_file(dest, f.rel)
        source = by_rel[f.rel]
        if target.is_file() and target.stat().st_size == f.size and int(target.stat().st_mtime) == int(f.tag):
            result.skipped += 1
            progress.add(f.size, moved=False)
        else:
            shutil.copy2(source, target)
            progress.add(f.size)
            result.bytes_transferred += f.size
        progress.file_done()
    progress.report(final=True)
    return result


def upload(src: str | Path, uri: str | StorageUri, *, progress_every_s: float = 5.0) -> FetchResult:
    """Write the folder `src` to the location (s3:// or a local path) and verify each file arrived intact."""
    u = parse(uri)
    folder = Path(src)
    if not folder.is_dir():
        raise FetchError(f"{folder}: not a folder")
    start = time.monotonic()
    if u.scheme == "s3":
        from llmfleet.storage import s3

        result = s3.upload(folder, u, progress_every_s)
    elif u.scheme == "local":
        result = copy_local(folder, Path(u.path).expanduser(), None, progress_every_s)
    else:
        raise FetchError(f"{u}: uploads go to s3:// or a local folder (a pvc:// output is a mounted folder)")
    result.seconds = time.monotonic() - start
    return result
