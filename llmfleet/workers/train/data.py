"""Token shards: `prepare` writes uint16/uint32 shards + manifest.json; `TokenData` serves each rank
disjoint, resumable batches.

Positions are global and world-size independent: step s uses the sequences at positions
[s*B, (s+1)*B) of a seeded permutation (re-drawn every epoch), B = sequences per optimizer step; rank r
takes the r-th of `world` equal slices. So a resumed run - with the same or another number of ranks - sees
exactly the batches the uninterrupted run would have seen, and the only state to save is the step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

MANIFEST = "manifest.json"
SHARD_TOKENS = 1 << 24  # tokens per shard file


def train_bpe(files: list[Path], vocab_size: int, out: Path) -> Path:
    """A small byte-level BPE (Hugging Face `tokenizers`) written to out/tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def _files(inputs: Iterable[str]) -> list[Path]:
    found: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*") if q.is_file()))
        elif p.is_file():
            found.append(p)
        else:
            matched = sorted(Path().glob(item)) if not p.is_absolute() else sorted(Path("/").glob(item.lstrip("/")))
            if not matched:
                raise FileNotFoundError(f"no input files match {item!r}")
            found.extend(q for q in matched if q.is_file())
    if not found:
        raise FileNotFoundError("no input files")
    return found


def prepare(inputs: Iterable[str], out: str | Path, tokenizer: str = "bytes", vocab_size: int = 4096) -> dict[str, Any]:
    """Tokenize text files into shards under `out`.

    tokenizer: "bytes" (raw UTF-8 bytes, vocab 257 with <eos>=256), "bpe" (train a byte-level BPE of
    `vocab_size` on the inputs) or a path to a tokenizer.json.
    """
    files = _files(inputs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok_file: str | None = None
    if tokenizer == "bytes":
        vocab, eos = 257, 256

        def encode(text: str) -> list[int]:
            return list(text.encode("utf-8"))
    else:
        from tokenizers import Tokenizer

        if tokenizer == "bpe":
            tok_path = train_bpe(files, vocab_size, out)
        else:
            tok_path = Path(tokenizer)
            if not tok_path.is_file():
                raise FileNotFoundError(f"tokenizer file not found: {tokenizer}")
            (out / "tokenizer.json").write_bytes(tok_path.read_bytes())
        tok = Tokenizer.from_file(str(tok_path))
        vocab = tok.get_vocab_size()
        eos_id = tok.token_to_id("<|endoftext|>") or tok.token_to_id("</s>")
        eos = eos_id if eos_id is not None else vocab - 1
        tok_file = "tokenizer.json"

        def encode(text: str) -> list[int]:
            return list(tok.encode(text).ids)

    dtype = np.uint16 if vocab <= 65536 else np.uint32
    shards: list[dict[str, Any]] = []
    buf: list[int] = []

    def flush() -> None:
        name = f"shard-{len(shards):05d}.bin"
        np.asarray(buf, dtype=dtype).tofile(out / name)
        shards.append({"file": name, "tokens": len(buf)})
        buf.clear()

    for f in files:
        buf.extend(encode(f.read_text(encoding="utf-8", errors="replace")))
        buf.append(eos)
        if len(buf) >= SHARD_TOKENS:
            flush()
    if buf:
        flush()
    manifest = {
        "dtype": np.dtype(dtype).name, "vocab": vocab, "eos": eos, "tokenizer": tok_file,
        "tokens": sum(s["tokens"] for s in shards), "shards": shards, "files": len(files),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


class TokenStream:
    """Shards as one read-only token stream without loading them: memory-mapped, sliced across shard edges."""

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, sl: slice) -> np.ndarray:
        start, stop = sl.start, sl.stop
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        while start < stop:
            lo = start - int(self.starts[i])
            take = min(stop - start, len(self.parts[i]) - lo)
            pieces.append(self.parts[i][lo: lo + take])
            start += take
            i += 1
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


@dataclass
class TokenData:
    """All shards of a prepared folder as one token stream, cut into (seq_len + 1)-token samples."""

    tokens: TokenStream
    seq_len: int
    seed: int
    vocab: int

    @classmethod
    def open(cls, path: str | Path, seq_len: int, seed: int) -> TokenData:
        root = Path(path)
        mf = root / MANIFEST
        if not mf.is_file():
            raise FileNotFoundError(f"{mf} not found: run `llmfleet data prepare` first")
        manifest = json.loads(mf.read_text())
        parts = [np.memmap(root / s["file"], dtype=manifest["dtype"], mode="r") for s in manifest["shards"]]
        data = cls(tokens=TokenStream(parts), seq_len=seq_len, seed=seed, vocab=int(manifest["vocab"]))
        if data.num_samples < 1:
            raise ValueError(f"{root}: {len(data.tokens)} tokens is less than one sequence of {seq_len + 1}")
        return data

    @property
    def num_samples(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def _sample_ids(self, positions: np.ndarray) -> np.ndarray:
        n = self.num_samples
        out = np.empty_like(positions)
        for epoch in np.unique(positions // n):
            perm = np.random.default_rng(self.seed + int(epoch)).permutation(n)
            sel = positions // n == epoch
            out[sel] = perm[positions[sel] % n]
        return out

    def batch(self, step: int, micro: int, *, micro_batch: int, accum: int, rank: int, world: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (micro_batch, seq_len) int64, for one micro-batch of one rank."""
        per_step = micro_batch * accum * world
        start = step * per_step + rank * micro_batch * accum + micro * micro_batch
        ids = self._sample_ids(np.arange(start, start + micro_batch))
        rows = np.stack([np.asarray(self.tokens[i * self.seq_len: i * self.seq_len + self.seq_len + 1])
                         for i in ids]).astype(np.int64)
        t = torch.from_numpy(rows)
        return t[:, :-1], t[:, 1:]
