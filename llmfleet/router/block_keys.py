"""A prompt's KV block keys: the hashing the router's prefix index and vLLM's KV events share.

A prompt is cut into fixed-size blocks of tokens (the served model's tokenizer when its tokenizer.json is
readable, else UTF-8 bytes in blocks of 4 x block_size as a text stand-in). Block i's key hashes the whole
prefix up to and including block i (a hash chain c_i = c_{i-1} * M + inner(block_i) mod 2^64), so equal keys
mean equal prefixes (up to 64-bit collisions). The chain is computed in closed form with numpy
(c_i = M^i * cumsum(inner_k * M^-k)), which keeps an 8k-token prompt well under the route-decision budget.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("llmfleet.router.block_keys")

_M = 0xC2B2AE3D27D4EB4F  # chain multiplier (odd: invertible mod 2^64)
_M_INV = pow(_M, -1, 1 << 64)
_MASK = (1 << 64) - 1
_B = 0x9E3779B97F4A7C15  # inner (within-block) polynomial base
TEXT_BYTES_PER_TOKEN = 4
# Up to this many blocks a prompt is hashed in plain Python (BlockHasher.small_keys), beyond it with numpy:
# the crossover measured in a running router, where numpy's fixed per-call cost is paid with cold caches.
SMALL_PROMPT_BLOCKS = 8


def adapter_seed(adapter: str | None) -> int:
    """The chain's start for a prompt run with a LoRA adapter (0 for the base model): KV blocks of the same
    tokens differ per adapter (vLLM puts the LoRA name in its block hashes), so their keys must too. Stable
    across processes (no Python hash()), so the router and KV events (their `lora_name`) agree."""
    if not adapter:
        return 0
    return int.from_bytes(hashlib.blake2b(adapter.encode(), digest_size=8).digest(), "little") or 1


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) mod 2^64: a running product in uint64, which wraps modulo 2^64."""
    out = np.ones(n, dtype=np.uint64)
    if n > 1:
        out[1:] = np.cumprod(np.full(n - 1, base, dtype=np.uint64), dtype=np.uint64)
    return out


class BlockKeys(Sequence[int]):
    """A prompt's block keys, kept as the hasher's uint64 array; Python ints only when asked for.

    The route decision reads a handful of keys (the prefix match bisects), so converting all of an 8k-token
    prompt's 512 keys to Python ints (a quarter of the hashing time) waits until the index update after the
    decision, which iterates them all. Compares equal to a list of the same ints.
    """

    __slots__ = ("array", "_list")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self._list: list[int] | None = None

    def tolist(self) -> list[int]:
        if self._list is None:
            self._list = self.array.tolist()
        return self._list

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.tolist()[i]
        return self.array.item(i)

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __reversed__(self) -> Iterator[int]:
        return reversed(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockKeys):
            return self.tolist() == other.tolist()
        if isinstance(other, Sequence):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking sequence: unhashable, like a list

    def __repr__(self) -> str:
        return f"BlockKeys({self.tolist()!r})"


class BlockHasher:
    """Token ids (or bytes) -> one key per full block. Stateless apart from cached power tables.

    Token ids are hashed as 32-bit values (every vocabulary fits), text as bytes. A block's values are read as
    64-bit words (two token ids, or eight bytes, per word) when the block is a whole number of words, which
    halves (eighths, for text) the multiply-adds of the inner hash; otherwise each value is its own word.
    Keys are the raw chain values: the chain is already a hash of the whole prefix, and a bijective mix on
    top would change no collision (it cost a fifth of the hashing time).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._inner: dict[int, np.ndarray] = {}  # words per block -> B^j table
        self._inner_ints: dict[int, list[int]] = {}  # the same tables as Python ints (small_keys)
        self._grow(64)

    def _inner_table(self, words: int) -> np.ndarray:
        t = self._inner.get(words)
        if t is None:
            t = self._inner[words] = np.array([pow(_B, j, 1 << 64) for j in range(words)], dtype=np.uint64)
        return t

    def _grow(self, n: int) -> None:
        self._pow = _powers(_M, n)
        self._ipow = _powers(_M_INV, n)

    def _words(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """(full blocks, words per block) uint64 matrix of the input."""
        arr = np.asarray(tokens)
        if arr.dtype != np.uint8:
            arr = arr.astype("<u4", copy=False)  # token ids: 32 bits each, whatever dtype they came in
        bs = self.block_size
        n = len(arr) // bs
        data = arr[: n * bs]
        if (bs * arr.itemsize) % 8 == 0:
            # little-endian words on any machine, as small_keys builds them
            return np.ascontiguousarray(data).view("<u8").reshape(n, bs * arr.itemsize // 8)
        return data.astype(np.uint64).reshape(n, bs)

    def raw_chain(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> np.ndarray:
        """Chain values of each full block; `parent` continues an earlier chain.

        Array arithmetic on uint64 wraps modulo 2^64 without warnings (no errstate context needed).
        """
        words = self._words(tokens)
        n = len(words)
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        if n + 1 > len(self._pow):
            self._grow(max(n + 1, 2 * len(self._pow)))
        inner = words @ self._inner_table(words.shape[1])
        inner += np.uint64(1)  # so an all-zero block still moves the chain
        inner *= self._ipow[1 : n + 1]
        pw = self._pow[1 : n + 1]
        # c_i = M^i * sum_k inner_k M^-k  ==  sequential c_i = c_{i-1} * M + inner_i (with c_0 = parent)
        chain: np.ndarray = np.cumsum(inner, out=inner)
        chain *= pw
        if parent:
            chain += np.full(1, parent, dtype=np.uint64) * pw
        return chain

    def keys(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> list[int]:
        keys: list[int] = self.raw_chain(tokens, parent).tolist()
        return keys

    def small_keys(self, values: Sequence[int] | bytes, parent: int = 0) -> list[int]:
        """The same keys as `keys`, in plain Python: for the few blocks of a short prompt, where numpy's
        per-call overhead (about a dozen array operations, each with cold caches inside a request) costs more
        than the arithmetic. `values`: token ids, or the bytes of text."""
        bs = self.block_size
        n = len(values) // bs
        if n == 0:
            return []
        if isinstance(values, (bytes, bytearray)):
            if bs % 8 == 0:  # eight bytes per word, little-endian
                words: Sequence[int] = struct.unpack_from(f"<{n * bs // 8}Q", values)
            else:
                words = values[: n * bs]
        elif bs % 2 == 0:  # two 32-bit token ids per word
            words = [(values[k] & 0xFFFFFFFF) | (values[k + 1] & 0xFFFFFFFF) << 32 for k in range(0, n * bs, 2)]
        else:
            words = [v & 0xFFFFFFFF for v in values[: n * bs]]
        wpb = len(words) // n
        table = self._inner_ints.get(wpb)
        if table is None:
            table = self._inner_ints[wpb] = self._inner_table(wpb).tolist()
        out = []
        c = parent
        for i in range(0, n * wpb, wpb):
            # sum + map: the block's multiply-adds in C (exact ints; only the chain is reduced mod 2^64)
            c = (c * _M + 1 + sum(map(operator.mul, words[i : i + wpb], table))) & _MASK
            out.append(c)
        return out

    def block_keys(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> BlockKeys:
        """The keys, converted to Python ints lazily (see BlockKeys): what the route decision uses."""
        return BlockKeys(self.raw_chain(tokens, parent))


def load_tokenizer(path: str | None) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json (file or folder), or None (text blocks)."""
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        return Tokenizer.from_file(str(p))
    except (OSError, ValueError, RuntimeError) as e:  # tokenizers raises Exception subclasses on bad files
        log.warning("tokenizer %s unreadable (%s): text blocks instead", p, e)
        return None
