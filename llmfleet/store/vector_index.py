"""An in-memory cosine-similarity index in numpy, grown incrementally.

Rows are L2-normalized float32, so similarity is a dot product. Below `ivf_min` vectors the index scans
everything (exact). Above, a scan of 100k x 384 floats (150 MB) is memory-bound at ~15 ms on a small machine,
so the index switches to an inverted file: k-means centroids (sqrt(n) lists), each vector in its nearest list,
and a query scans only the `nprobe` lists nearest to it. New vectors join their nearest list without
retraining; the centroids are retrained when the index has doubled since the last training.
"""

from __future__ import annotations

import threading

import numpy as np


class _Growable:
    """A float32 matrix with amortized O(1) appends (capacity doubling) plus parallel int64 ids."""

    def __init__(self, dim: int) -> None:
        self.vecs = np.zeros((16, dim), dtype=np.float32)
        self.ids = np.zeros(16, dtype=np.int64)
        self.n = 0

    def add(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        need = self.n + len(ids)
        if need > len(self.ids):
            cap = max(need, 2 * len(self.ids))
            nv = np.zeros((cap, self.vecs.shape[1]), dtype=np.float32)
            nv[: self.n] = self.vecs[: self.n]
            ni = np.zeros(cap, dtype=np.int64)
            ni[: self.n] = self.ids[: self.n]
            self.vecs, self.ids = nv, ni
        self.vecs[self.n : need] = vecs
        self.ids[self.n : need] = ids
        self.n = need


def kmeans(x: np.ndarray, k: int, iters: int = 8, seed: int = 0) -> np.ndarray:
    """Spherical k-means (cosine): centroids are re-normalized means. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    cent = x[rng.choice(len(x), size=k, replace=False)].copy()
    for _ in range(iters):
        assign = np.argmax(x @ cent.T, axis=1)
        sums = np.zeros_like(cent)
        np.add.at(sums, assign, x)
        counts = np.bincount(assign, minlength=k)
        empty = counts == 0
        sums[empty] = x[rng.choice(len(x), size=int(empty.sum()), replace=False)] if empty.any() else sums[empty]
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        cent = (sums / norms).astype(np.float32)
    return cent


class VectorIndex:
    """Top-k cosine search over (id, vector) pairs; thread-safe (one writer lock, lock-free-ish readers)."""

    def __init__(self, dim: int, *, ivf_min: int = 20_000, nprobe: int = 16, train_sample: int = 20_000) -> None:
        self.dim = dim
        self.ivf_min = ivf_min
        self.nprobe = nprobe
        self.train_sample = train_sample
        self._all = _Growable(dim)
        self._centroids: np.ndarray | None = None
        self._lists: list[_Growable] = []
        self._trained_at = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._all.n

    @property
    def is_ivf(self) -> bool:
        return self._centroids is not None

    def add(self, ids: np.ndarray | list[int], vecs: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        vecs = np.asarray(vecs, dtype=np.float32).reshape(-1, self.dim)
        if not len(ids):
            return
        with self._lock:
            self._all.add(ids, vecs)
            n = self._all.n
            if n >= self.ivf_min and (self._centroids is None or n >= 2 * self._trained_at):
                self._train()
            elif self._centroids is not None:
                self._assign(ids, vecs)

    def _train(self) -> None:
        n = self._all.n
        x = self._all.vecs[:n]
        rng = np.random.default_rng(0)
        sample = x[rng.choice(n, size=min(n, self.train_sample), replace=False)]
        k = max(8, int(np.sqrt(n)))
        cent = kmeans(sample, k)
        lists = [_Growable(self.dim) for _ in range(k)]
        # Assign in chunks to bound the temporary (chunk x k) score matrix.
        for s in range(0, n, 8192):
            a = np.argmax(x[s : s + 8192] @ cent.T, axis=1)
            for li in np.unique(a):
                sel = np.nonzero(a == li)[0] + s
                lists[li].add(self._all.ids[sel], x[sel])
        self._centroids, self._lists, self._trained_at = cent, lists, n

    def _assign(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        if self._centroids is None:
            return
        a = np.argmax(vecs @ self._centroids.T, axis=1)
        for li in np.unique(a):
            sel = np.nonzero(a == li)[0]
            self._lists[li].add(ids[sel], vecs[sel])

    def search(self, query: np.ndarray, k: int = 8, threshold: float = -1.0) -> list[tuple[int, float]]:
        """Up to k (id, similarity) pairs with similarity >= threshold, best first."""
        q = np.asarray(query, dtype=np.float32).reshape(self.dim)
        cent, lists, full = self._centroids, self._lists, self._all
        if cent is None:
            n = full.n
            if n == 0:
                return []
            scores, ids = full.vecs[:n] @ q, full.ids[:n]
        else:
            probe = np.argpartition(cent @ q, -min(self.nprobe, len(cent)))[-self.nprobe :]
            parts_s, parts_i = [], []
            for li in probe:
                g = lists[li]
                if g.n:
                    parts_s.append(g.vecs[: g.n] @ q)
                    parts_i.append(g.ids[: g.n])
            if not parts_s:
                return []
            scores, ids = np.concatenate(parts_s), np.concatenate(parts_i)
        kk = min(k, len(scores))
        top = np.argpartition(scores, -kk)[-kk:]
        top = top[np.argsort(-scores[top])]
        return [(int(ids[i]), float(scores[i])) for i in top if scores[i] >= threshold]
