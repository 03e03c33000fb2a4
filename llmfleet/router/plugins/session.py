"""The session-affinity scorer: a request goes back to the replica that served its session last."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from llmfleet.router.config import DEFAULT_SESSION_BYTES
from llmfleet.router.plugins.base import ReplicaState, RequestInfo, Scorer

# Memory of one remembered session (tracemalloc, CPython 3.11: an OrderedDict entry with its 64-bit int key, the
# replica id shared), with sessions evicted as new ones come: 180-220 bytes in steady state, up to 250 while the
# table resizes; rounded up.
BYTES_PER_SESSION = 256


def session_key(session_id: str) -> int:
    """A session id as 8 bytes (BLAKE2b): what the table keeps, whatever the id's length. Deterministic across
    processes (unlike hash()); a collision (2^-64 per pair) only shares a pin."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SessionAffinityScorer(Scorer):
    """1 for the replica that served this session last, else 0. An LRU table bounded by bytes: session ids are
    kept as 8-byte hashes, so `max_bytes` holds max_bytes // BYTES_PER_SESSION sessions of any id length."""

    name = "session-affinity"

    def __init__(self, max_bytes: int = DEFAULT_SESSION_BYTES) -> None:
        self.max_bytes = max_bytes
        self.max_sessions = max(1, max_bytes // BYTES_PER_SESSION)
        self.sessions: OrderedDict[int, str] = OrderedDict()
        self.last_pinned: str | None = None
        self._last: tuple[str, int] | None = None  # (session id, key) of the request being routed

    def _key(self, session_id: str) -> int:
        last = self._last
        if last is not None and last[0] is session_id:  # score() then on_routed() of the same request
            return last[1]
        key = session_key(session_id)
        self._last = (session_id, key)
        return key

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        pinned = self.last_pinned = self.sessions.get(self._key(req.session_id)) if req.session_id else None
        return [1.0 if r.id == pinned else 0.0 for r in replicas]

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        if not req.session_id:
            return
        key = self._key(req.session_id)
        self.sessions[key] = replica.id
        self.sessions.move_to_end(key)
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
