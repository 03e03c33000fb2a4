"""s3:// locations with boto3: resumable ranged downloads and uploads, both checked against the object's ETag.

An ETag without a dash is the MD5 of the object; `<md5 of part md5s>-N` is a multipart upload's, recomputed
from the part size (HEAD with PartNumber=1). Objects encrypted with SSE-KMS have opaque ETags: their size is
checked only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmfleet.api.storage import S3_ADDRESSING_ENV, S3_ENDPOINT_ENV, S3_REGION_ENV, StorageUri
from llmfleet.storage.common import (
    PARTIAL_SUFFIX,
    FetchError,
    FetchResult,
    Progress,
    RemoteFile,
    fetch_files,
    is_bookkeeping,
    selected,
)

CHUNK = 1 << 20
# Uploads: parts of 64 MiB above 64 MiB (at most 10,000 parts: 640 GiB per file).
MULTIPART_BYTES = 64 << 20


def client() -> Any:
    """An S3 client configured from the environment (endpoint, region, credentials, addressing style)."""
    import boto3
    from botocore.config import Config

    style = os.environ.get(S3_ADDRESSING_ENV) or "auto"
    config = Config(
        s3={"addressing_style": style},
        retries={"max_attempts": 8, "mode": "adaptive"},
        connect_timeout=10,
        read_timeout=120,
    )
    return boto3.client(
        "s3",
        endpoint_url=os.environ.get(S3_ENDPOINT_ENV) or None,
        region_name=os.environ.get(S3_REGION_ENV) or None,
        config=config,
    )


def _errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def _describe(err: Exception) -> str:
    response = getattr(err, "response", None)
    if isinstance(response, dict) and "Error" in response:
        e = response["Error"]
        return f"{e.get('Code', '?')}: {e.get('Message', '')}".strip()
    return str(err)


def list_files(s3: Any, uri: StorageUri) -> list[RemoteFile]:
    """The objects of the location: the object at the exact key (one file), else everything under `prefix/`."""
    bucket, key = uri.location, uri.path
    if key:
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
        except _errors() as err:
            if getattr(err, "response", {}).get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise FetchError(f"{uri}: {_describe(err)}") from None
        else:
            return [RemoteFile(key.rsplit("/", 1)[-1], int(head["ContentLength"]), head["ETag"].strip('"'),
                               {"key": key, "sse": head.get("ServerSideEncryption")})]
    prefix = f"{key}/" if key else ""
    files = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):]
                if rel and not rel.endswith("/"):  # "folder" marker objects hold nothing
                    files.append(RemoteFile(rel, int(obj["Size"]), obj["ETag"].strip('"'), {"key": obj["Key"]}))
    except _errors() as err:
        raise FetchError(f"{uri}: {_describe(err)}") from None
    if not files:
        raise FetchError(f"{uri}: no objects at this key or under this prefix")
    return files


def etag_matches(s3: Any, bucket: str, key: str, etag: str, path: Path, sse: str | None = None) -> bool:
    """Does the local file hash to the object's ETag (single-part MD5 or the multipart form)?"""
    if sse == "aws:kms":
        return True  # SSE-KMS ETags are not content hashes: the size check is all there is
    if "-" not in etag:
        md5 = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                md5.update(chunk)
        return md5.hexdigest() == etag
    parts = int(etag.rsplit("-", 1)[1])
    part_size = int(s3.head_object(Bucket=bucket, Key=key, PartNumber=1)["ContentLength"])
    digests = []
    with open(path, "rb") as fh:
        while block := fh.read(part_size):
            digests.append(hashlib.md5(block, usedforsecurity=False).digest())
    combined = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
    return len(digests) == parts and f"{combined}-{parts}" == etag


def _download(s3: Any, uri: StorageUri, f: RemoteFile, target: Path, progress: Progress) -> int:
    """Download into a partial file named after the ETag, continuing from its size; returns the bytes moved.

    The ETag in the name means a partial file only ever continues the same object version.
    """
    part = target.with_name(f"{target.name}.{f.tag[:16]}{PARTIAL_SUFFIX}")
    for stale in target.parent.glob(f"{target.name}.*{PARTIAL_SUFFIX}"):
        if stale != part:
            stale.unlink()
    have = part.stat().st_size if part.exists() else 0
    if have > f.size:
        part.unlink()
        have = 0
    if have:
        progress.add(have, moved=False)
    moved = 0
    if have < f.size:
        # If-Match: the object may not change while it is read (the error says to run again).
        resp = s3.get_object(Bucket=uri.location, Key=f.extra["key"], Range=f"bytes={have}-", IfMatch=f'"{f.tag}"')
        with open(part, "ab") as fh:
            for chunk in resp["Body"].iter_chunks(CHUNK):
                fh.write(chunk)
                moved += len(chunk)
                progress.add(len(chunk))
    else:
        part.touch()
    size = part.stat().st_size
    if size != f.size:
        raise FetchError(f"{uri}: {f.rel}: got {size} bytes, expected {f.size} (will resume on the next run)")
    if not etag_matches(s3, uri.location, f.extra["key"], f.tag, part, f.extra.get("sse")):
        part.unlink()
        raise FetchError(f"{uri}: {f.rel}: content does not match the ETag {f.tag} (partial file removed)")
    os.replace(part, target)
    return moved


def fetch(uri: StorageUri, dest: Path, include: Sequence[str] | None, progress_every_s: float) -> FetchResult:
    s3 = client()
    files = selected(list_files(s3, uri), include)
    if not files:
        raise FetchError(f"{uri}: no objects match {list(include or [])}")

    def download(f: RemoteFile, target: Path, progress: Progress) -> int:
        try:
            return _download(s3, uri, f, target, progress)
        except _errors() as err:
            raise FetchError(f"{uri}: {f.rel}: {_describe(err)}") from None

    return fetch_files(str(uri), dest, files, download, str(uri), include is None, progress_every_s)


def upload(src: Path, uri: StorageUri, progress_every_s: float) -> FetchResult:
    from boto3.s3.transfer import TransferConfig

    s3 = client()
    paths = [p for p in sorted(src.rglob("*")) if p.is_file() and not is_bookkeeping(p)]
    total = sum(p.stat().st_size for p in paths)
    progress = Progress(f"{src} -> {uri}", len(paths), total, progress_every_s)
    result = FetchResult(uri=str(uri), dest=str(src), files=len(paths), bytes_total=total)
    config = TransferConfig(multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES)
    for p in paths:
        rel = p.relative_to(src).as_posix()
        key = f"{uri.path}/{rel}" if uri.path else rel
        try:
            s3.upload_file(str(p), uri.location, key, Config=config, Callback=progress.add)
            head = s3.head_object(Bucket=uri.location, Key=key)
            ok = int(head["ContentLength"]) == p.stat().st_size and etag_matches(
                s3, uri.location, key, head["ETag"].strip('"'), p, head.get("ServerSideEncryption")
            )
        except _errors() as err:
            raise FetchError(f"{uri}: {rel}: {_describe(err)}") from None
        if not ok:
            raise FetchError(f"{uri}: {rel}: the stored object does not match the local file")
        result.bytes_transferred += p.stat().st_size
        progress.file_done()
    progress.report(final=True)
    return result
