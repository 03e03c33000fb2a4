"""A minimal Hugging Face Hub for tests: the model-info API (with file metadata) and the resolve endpoint that
huggingface_hub downloads from, serving one repository at one commit, on a free port."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(body: bytes) -> str:
    return hashlib.sha1(f"blob {len(body)}\0".encode() + body).hexdigest()


@dataclass
class FakeHub:
    repo: str
    files: dict[str, bytes]
    lfs: set[str]
    endpoint: str = ""
    corrupt: dict[str, bytes] = field(default_factory=dict)  # served instead of the real content
    requests: list[str] = field(default_factory=list)
    authorizations: set[str] = field(default_factory=set)  # Authorization headers seen

    def info(self) -> dict[str, Any]:
        siblings = []
        for name, body in self.files.items():
            sib: dict[str, Any] = {"rfilename": name, "size": len(body), "blobId": git_blob_id(body)}
            if name in self.lfs:
                sib["lfs"] = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body), "pointerSize": 134}
            siblings.append(sib)
        return {"id": self.repo, "modelId": self.repo, "sha": COMMIT, "siblings": siblings, "private": False}


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    resolve = re.compile(rf"^/{re.escape(hub.repo)}/resolve/([^/]+)/(.+)$")
    api = re.compile(rf"^/api/models/{re.escape(hub.repo)}(/revision/[^/?]+)?(\?.*)?$")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _file(self) -> tuple[str, bytes, dict[str, str]] | None:
            m = resolve.match(self.path.split("?")[0])
            if not m or m.group(2) not in hub.files:
                return None
            name = m.group(2)
            body = hub.corrupt.get(name, hub.files[name])
            real = hub.files[name]
            headers = {"X-Repo-Commit": COMMIT, "Content-Length": str(len(body)), "Accept-Ranges": "bytes"}
            if name in hub.lfs:
                headers["ETag"] = f'"{hashlib.sha256(real).hexdigest()}"'
                headers["X-Linked-Etag"] = headers["ETag"]
                headers["X-Linked-Size"] = str(len(real))
            else:
                headers["ETag"] = f'"{git_blob_id(real)}"'
            return name, body, headers

        def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            hub.requests.append(f"HEAD {self.path}")
            hub.authorizations.add(self.headers.get("Authorization", ""))
            found = self._file()
            if found is None:
                self._send(404, {"X-Error-Code": "EntryNotFound", "Content-Length": "0"})
                return
            self._send(200, found[2])

        def do_GET(self) -> None:  # noqa: N802
            hub.requests.append(f"GET {self.path}")
            hub.authorizations.add(self.headers.get("Authorization", ""))
            if api.match(self.path):
                body = json.dumps(hub.info()).encode()
                self._send(200, {"Content-Type": "application/json", "Content-Length": str(len(body))}, body)
                return
            found = self._file()
            if found is None:
                self._send(404, {"X-Error-Code": "RepoNotFound", "Content-Length": "0"})
                return
            _, body, headers = found
            start = 0
            if rng := self.headers.get("Range"):
                start = int(rng.removeprefix("bytes=").split("-")[0])
            part = body[start:]
            headers = {**headers, "Content-Length": str(len(part))}
            self._send(206 if start else 200, headers, part)

    return Handler


@contextmanager
def fake_hub(repo: str, files: dict[str, bytes], lfs: set[str]) -> Iterator[FakeHub]:
    hub = FakeHub(repo, files, lfs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
