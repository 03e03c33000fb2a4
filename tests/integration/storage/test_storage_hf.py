"""hf:// against a fake Hub (tests/fakehub.py: the model-info API with file metadata and the resolve endpoint,
served on a free port) with the real huggingface_hub client: one commit, checksums of LFS and git files,
skips on a second fetch, include patterns, and the operator's rendered init container (token from a Secret)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakehub import COMMIT, FakeHub, fake_hub
from podrun import run_init_container

from llmfleet.api import InferenceService
from llmfleet.operator.builders import build_inferenceservice
from llmfleet.operator.config import OperatorConfig
from llmfleet.storage import FetchError, fetch

pytestmark = [pytest.mark.integration]

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b'{"version": "1.0"}' * 40,
    "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
    "model.safetensors": os.urandom(256 << 10),
}
LFS = {"model.safetensors"}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with fake_hub("org/tiny-chat", FILES, LFS) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        yield h


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".llmfleet-fetch") and ".cache" not in p.parts}


def test_fetch_one_commit_then_skip(hub: FakeHub, tmp_path: Path) -> None:
    first = fetch("hf://org/tiny-chat@main", tmp_path / "m")
    assert _tree(tmp_path / "m") == FILES and first.bytes_transferred == sum(map(len, FILES.values()))
    downloads = [r for r in hub.requests if r.startswith("GET /org/")]
    assert len(downloads) == 4 and all(f"/resolve/{COMMIT}/" in r for r in downloads)  # the resolved commit
    hub.requests.clear()
    again = fetch("hf://org/tiny-chat@main", tmp_path / "m")
    assert again.skipped == 4 and not [r for r in hub.requests if "/resolve/" in r]


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors"])
def test_content_that_does_not_match_the_hub_metadata_is_refused(hub: FakeHub, tmp_path: Path, name: str) -> None:
    hub.corrupt = {name: bytes(len(FILES[name]))}  # same size, other bytes: only the checksum can tell
    with pytest.raises(FetchError, match=f"{name}: size or checksum differs"):
        fetch("hf://org/tiny-chat", tmp_path / "m")
    assert not (tmp_path / "m" / name).exists()
    hub.corrupt = {}
    fetch("hf://org/tiny-chat", tmp_path / "m")
    assert _tree(tmp_path / "m") == FILES


def test_include_and_unknown_repositories(hub: FakeHub, tmp_path: Path) -> None:
    fetch("hf://org/tiny-chat", tmp_path / "tok", include=["tokenizer*.json", "config.json"])
    assert sorted(_tree(tmp_path / "tok")) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    with pytest.raises(FetchError, match="hf://org/other"):
        fetch("hf://org/other", tmp_path / "x")


def test_the_rendered_router_init_container_fetches_only_the_tokenizer(hub: FakeHub, tmp_path: Path) -> None:
    isvc = InferenceService.model_validate({
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u"},
        "spec": {"model": {"path": "hf://org/tiny-chat@main"},
                 "storage": {"hf": {"tokenSecret": "hf-token", "endpoint": hub.endpoint}}},
    })
    router = next(m for m in build_inferenceservice(isvc, OperatorConfig())
                  if m["kind"] == "Deployment" and m["metadata"]["name"] == "chat-router")
    (init,) = router["spec"]["template"]["spec"]["initContainers"]
    proc, folders = run_init_container(init, {"hf-token": {"HF_TOKEN": "hf_test"}}, tmp_path / "volumes")
    assert proc.returncode == 0, proc.stderr
    folder = folders[init["command"][3]]  # llmfleet fetch URI DEST
    assert sorted(_tree(folder)) == ["config.json", "tokenizer.json", "tokenizer_config.json"]  # no weights
    assert hub.authorizations == {"Bearer hf_test"}  # the token from the Secret, on every request
