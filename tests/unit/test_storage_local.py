"""llmfleet.storage without a server: local copies, what fetch refuses, the record of complete files."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.api.storage import parse_uri
from llmfleet.storage import FetchError, cache_key, fetch, local_copy, upload
from llmfleet.storage.common import RECORD_FILE, Record, RemoteFile, target_file


def _src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"x" * 1000)
    return src


def test_local_copy_then_skip_and_include(tmp_path: Path) -> None:
    src = _src(tmp_path)
    first = fetch(str(src), tmp_path / "dst")
    assert first.files == 2 and first.bytes_transferred == 1002
    assert (tmp_path / "dst" / "sub" / "w.bin").read_bytes() == b"x" * 1000
    again = fetch(f"file://{src}", tmp_path / "dst")
    assert again.skipped == 2 and again.bytes_transferred == 0
    only = fetch(str(src), tmp_path / "only", include=["*.json"])
    assert only.files == 1 and not (tmp_path / "only" / "sub").exists()


def test_upload_to_a_local_folder(tmp_path: Path) -> None:
    result = upload(_src(tmp_path), str(tmp_path / "out"))
    assert result.files == 2 and (tmp_path / "out" / "config.json").is_file()


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("pvc://claim/x", "mounted into the pod by the operator"),
        ("tiny://tiny-llama", "built locally"),
        ("gs://bucket/x", "unknown scheme"),
        ("/no/such/folder", "no such file or folder"),
    ],
)
def test_fetch_refuses(tmp_path: Path, uri: str, needle: str) -> None:
    with pytest.raises(FetchError, match=needle):
        fetch(uri, tmp_path / "d")


def test_local_copy_needs_no_copy_for_local_paths_and_refuses_claims(tmp_path: Path) -> None:
    assert local_copy(str(tmp_path)) == tmp_path
    with pytest.raises(FetchError, match="claims exist only on Kubernetes"):
        local_copy("pvc://claim/x")


def test_keys_outside_the_destination_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="outside"):
        target_file(tmp_path, "../escape")


def test_record_skips_only_same_size_and_tag(tmp_path: Path) -> None:
    f = RemoteFile("a.bin", 3, "etag1")
    (tmp_path / "a.bin").write_bytes(b"abc")
    record = Record(tmp_path, "s3://b/p")
    record.add(f)
    again = Record(tmp_path, "s3://b/p")
    assert again.has(tmp_path, f)
    assert not again.has(tmp_path, RemoteFile("a.bin", 3, "etag2"))  # the object changed
    assert not Record(tmp_path, "s3://b/other").has(tmp_path, f)  # another location in the same folder
    (tmp_path / "a.bin").write_bytes(b"ab")
    assert not again.has(tmp_path, f)  # the local copy was truncated
    assert (tmp_path / RECORD_FILE).is_file()


def test_cache_keys_are_stable_readable_and_distinct() -> None:
    a = cache_key(parse_uri("hf://Qwen/Qwen2.5-7B-Instruct@main"))
    assert a == cache_key(parse_uri("hf://Qwen/Qwen2.5-7B-Instruct@main")) and a.startswith("Qwen2.5-7B-Instruct-")
    assert a != cache_key(parse_uri("hf://Qwen/Qwen2.5-7B-Instruct@v2"))


def test_a_fetched_folder_copies_without_its_bookkeeping(tmp_path: Path) -> None:
    src = _src(tmp_path)
    Record(src, "s3://b/p").save()  # what a fetch from S3 leaves beside the files
    fetch(str(src), tmp_path / "copy")
    names = {p.name for p in (tmp_path / "copy").rglob("*") if p.is_file()}
    assert names == {"config.json", "w.bin", ".llmfleet-fetch.lock"}  # its own lock, not the source's record
