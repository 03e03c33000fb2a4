"""hf:// locations with huggingface_hub: every file of one commit, each checked against the Hub's metadata.

The revision is resolved to a commit first, so all files come from the same snapshot. LFS files are checked
against their SHA-256, small (git) files against their git blob id; huggingface_hub resumes partial downloads.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmfleet.api.storage import HF_ENDPOINT_ENV, HF_TOKEN_KEY, StorageUri
from llmfleet.storage.common import FetchError, FetchResult, Progress, RemoteFile, fetch_files, selected

CHUNK = 1 << 20


def _errors() -> tuple[type[Exception], ...]:
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    return (HfHubHTTPError, LocalEntryNotFoundError, OSError)


def list_files(api: Any, uri: StorageUri) -> tuple[str, list[RemoteFile]]:
    """(commit, files) of the repository at the URI's revision, with sizes and checksums."""
    try:
        info = api.model_info(uri.location, revision=uri.revision, files_metadata=True)
    except _errors() as err:
        raise FetchError(f"{uri}: {str(err).splitlines()[0]}") from None
    files = []
    for sib in info.siblings or []:
        lfs = getattr(sib, "lfs", None)
        sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
        files.append(RemoteFile(sib.rfilename, int(sib.size or 0), sha256 or sib.blob_id or "",
                                {"sha256": sha256, "blob_id": sib.blob_id}))
    if not files:
        raise FetchError(f"{uri}: the repository has no files")
    return str(info.sha), files


def checksum_matches(path: Path, f: RemoteFile) -> bool:
    """SHA-256 for LFS files, the git blob id (SHA-1 of 'blob <size>\\0' + content) for the others."""
    if f.extra.get("sha256"):
        h = hashlib.sha256()
        want = f.extra["sha256"]
    elif f.extra.get("blob_id"):
        h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
        want = f.extra["blob_id"]
    else:
        return True
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return bool(h.hexdigest() == want)


def fetch(uri: StorageUri, dest: Path, include: Sequence[str] | None, progress_every_s: float) -> FetchResult:
    from huggingface_hub import HfApi, hf_hub_download

    endpoint = os.environ.get(HF_ENDPOINT_ENV) or None
    token = os.environ.get(HF_TOKEN_KEY) or None
    api = HfApi(endpoint=endpoint, token=token)
    commit, files = list_files(api, uri)
    files = selected(files, include)
    if not files:
        raise FetchError(f"{uri}: no files match {list(include or [])}")

    def download(f: RemoteFile, target: Path, progress: Progress) -> int:
        try:
            got = Path(str(hf_hub_download(uri.location, f.rel, revision=commit, local_dir=dest, token=token,
                                           endpoint=endpoint)))
        except _errors() as err:
            raise FetchError(f"{uri}: {f.rel}: {str(err).splitlines()[0]}") from None
        if got.resolve() != target:
            raise FetchError(f"{uri}: {f.rel}: downloaded to {got}, expected {target}")
        if got.stat().st_size != f.size or not checksum_matches(got, f):
            got.unlink()
            raise FetchError(f"{uri}: {f.rel}: size or checksum differs from the Hub's metadata (file removed)")
        progress.add(f.size)
        return f.size

    return fetch_files(str(uri), dest, files, download, f"{uri} ({commit[:12]})", include is None, progress_every_s)
