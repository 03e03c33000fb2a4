"""fetch / upload: dispatch on the URI scheme, local copies, the folder lock, the local cache."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from llmfleet.api.storage import StorageUri, UriError, parse_uri
from llmfleet.storage.common import (
    LOCK_FILE,
    FetchError,
    FetchResult,
    Progress,
    RemoteFile,
    cache_key,
    is_bookkeeping,
    log,
    selected,
    target_file,
)


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
        (p, p.relative_to(src).as_posix()) for p in sorted(src.rglob("*")) if p.is_file() and not is_bookkeeping(p)
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
