"""Prompt tokenization that reuses the ids of an earlier prompt beginning with the same text.

Multi-turn chat sends the whole conversation again at every turn, and a tenant's requests share its system
prompt, so a router that keys prompts by their tokens tokenizes the same text over and over: on chat prompts
of a few hundred tokens the tokenizer (mostly its pre-tokenization pattern) is most of the route decision's CPU.
`PromptTokenizer.encode(text)` finds the earlier prompt that shares the longest beginning with `text` (hashes of
its prefixes, one per `BLOCK_CHARS` characters), keeps that prompt's ids up to one of its word boundaries at
least `margin` characters before the two texts may differ, and tokenizes only the rest.

Why that is exact, and where it is not: a `tokenizers` tokenizer first splits out its added tokens, then
pre-tokenizes each piece with a left-to-right pattern whose decisions look at most a few characters past the
word they end (`margin` covers them, and the longest added token), then encodes each word on its own. A word
boundary of the earlier prompt that far inside the shared text is a word boundary of the new prompt too, with
the same words before it, and the words after it are what tokenizing the rest alone gives. Byte-level BPE
tokenizers (GPT-2's, Llama 3's, Qwen's) behave so. A tokenizer that marks a text's first word (`add_prefix_space`,
a Metaspace prefix on the first word only, a prepending normalizer) does not: the rest's first word would be
marked. Right after an added token (a chat template's role and turn markers) it is not marked in the whole prompt
either, so for such tokenizers the rest is tokenized behind that added token, whose id is then dropped.
The encoder checks itself against the whole prompt's tokenization on its first `VERIFY_FIRST` reuses and on one
in `VERIFY_EVERY` after: a difference at a word boundary narrows the cuts to those after added tokens (checked
again from the start), a difference there turns reuse off for the process, with a warning. Ids that are wrong
between two checks cost prefix-index misses, never a wrong answer: the engine tokenizes the prompt itself.

Memory: the ids, word boundaries and prefix hashes of at most `max_tokens` prompt tokens (about 16 bytes a
token, measured), least recently used first out; a prompt that extends an earlier one takes over its prefix
hashes, and the earlier one is dropped once no hash leads to it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from llmfleet.router.block_keys import SMALL_PROMPT_BLOCKS, TEXT_BYTES_PER_TOKEN, BlockHasher, adapter_seed

log = logging.getLogger("llmfleet.router.prompt_tokens")

BLOCK_CHARS = 64  # prefix hashes every 64 characters: a reuse keeps all but the last < 64 + margin characters
MIN_REUSE_CHARS = 2 * BLOCK_CHARS  # shorter prompts are tokenized whole: a lookup would save nothing
VERIFY_FIRST = 32  # reuses checked against the whole prompt's tokenization before trusting the tokenizer...
VERIFY_EVERY = 64  # ...and one in this many after that
DEFAULT_MAX_TOKENS = 1 << 20  # ids kept per tokenizer: ~16 MiB


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_NO_CUTS = (np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, bool))


@dataclass(eq=False)
class _Prompt:
    ids: np.ndarray  # uint32: the prompt's ids, the post-processor's added tokens included
    cut_chars: np.ndarray  # int32, ascending: character offsets of word boundaries...
    cut_ids: np.ndarray  # int32: ...how many ids come before each...
    after_added: np.ndarray  # bool: ...and whether an added token ends there
    keys: list[int] = field(default_factory=list)  # its prefix hashes, one per full BLOCK_CHARS block
    live_keys: int = 0  # of those, how many still lead here (a longer prompt takes the shared ones over)


class TokenPlan(NamedTuple):
    """What `PromptTokenizer.encode` will do with a text: the earlier prompt whose ids it keeps, up to which of its
    word boundaries, and how many characters are left to tokenize (all of them without such a prompt)."""

    keys: list[int]  # the text's prefix hashes (none: tokenized whole, not kept)
    earlier: _Prompt | None
    boundary: int  # index into earlier's boundaries (-1: none)
    new_chars: int
    after_added: bool = False  # the rest is tokenized behind the added token that ends at the boundary


def _boundaries(enc: Any, ids: np.ndarray, char_offset: int, id_offset: int,
                is_added: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Word boundaries between the tokens of `enc` (`ids`: its ids; not before its first): (character offsets, ids
    before, whether an added token ends there; `is_added`: id -> added)."""
    offsets = enc.offsets
    if len(offsets) < 2:
        return _NO_CUTS
    w = np.array(enc.word_ids, dtype=np.float64)  # a post-processor's token has no word: NaN, unequal to every word
    off = np.fromiter(chain.from_iterable(offsets), dtype=np.int64, count=2 * len(offsets)).reshape(-1, 2)
    # a new word starts at token j (an added token is a word of its own), right where token j-1 ends: offsets
    # that skip characters (trimmed whitespace) are no place to cut
    at = np.flatnonzero((w[1:] != w[:-1]) & (off[1:, 0] == off[:-1, 1])) + 1
    added = is_added[ids[at - 1]] & (off[at - 1, 1] > off[at - 1, 0])  # in the text (not a BOS of none)
    return (off[at, 0] + char_offset).astype(np.int32), (at + id_offset).astype(np.int32), added


class PromptTokenizer:
    """`encode(text)` == `tokenizer.encode(text, add_special_tokens=True).ids` (as uint32), reusing earlier prompts."""

    def __init__(self, tokenizer: Any, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.hasher = BlockHasher(BLOCK_CHARS)
        decoder = tokenizer.get_added_tokens_decoder()
        added = [t.content for t in decoder.values()]
        self._is_added = np.zeros(max(tokenizer.get_vocab_size(with_added_tokens=True), max(decoder, default=0) + 1),
                                  dtype=bool)
        self._is_added[list(decoder)] = True
        self.margin = max(8, *(len(a) for a in added)) if added else 8
        self._lock = threading.Lock()  # long prompts are tokenized in worker threads
        self._by_key: dict[int, tuple[_Prompt, int]] = {}  # hash of text[:(g + 1) * BLOCK_CHARS] -> (prompt, g)
        self._prompts: OrderedDict[int, _Prompt] = OrderedDict()  # id() -> prompt, least recently used first
        self._tokens = 0
        self.reuses = 0
        self.reused_ids = 0  # ids taken from earlier prompts rather than tokenized
        # Where a prompt may be cut: at any word boundary ("words"), or, for a tokenizer whose first checks failed
        # there, only right after an added token, the rest tokenized behind that token ("added"); else "off".
        self.cuts = "words"
        self._checks_from = 0  # reuses before the current kind of cut began: its first VERIFY_FIRST are checked
        # The post-processor's tokens after the text (e.g. an EOS) follow the rest, not the kept prefix.
        probe = "a b"
        full = tokenizer.encode(probe, add_special_tokens=True).ids
        bare = tokenizer.encode(probe, add_special_tokens=False).ids
        starts = [i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare]
        # padding and truncation act on the whole sequence: a prompt's parts are not the whole's
        if not (starts and bare and tokenizer.padding is None and tokenizer.truncation is None):
            self.cuts = "off"
        self._suffix = np.asarray(full[starts[0] + len(bare):] if starts else [], dtype=np.uint32)

    @property
    def enabled(self) -> bool:
        return self.cuts != "off"

    def plan(self, text: str) -> TokenPlan:
        """Find the earlier prompt to reuse (cheap: hashing and dict lookups; `new_chars` says what is left)."""
        cuts = self.cuts
        if cuts == "off" or len(text) < MIN_REUSE_CHARS:
            return TokenPlan([], None, -1, len(text))
        keys: list[int] = self.hasher.raw_chain(
            np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")).tolist()
        hit = self._lookup(keys)
        if hit is not None:
            earlier, g = hit
            i = int(np.searchsorted(earlier.cut_chars, (g + 1) * BLOCK_CHARS - self.margin, side="right")) - 1
            if cuts == "added":  # the last of those boundaries that an added token ends
                after = np.flatnonzero(earlier.after_added[:i + 1])
                i = int(after[-1]) if len(after) else -1
            if i >= 0:
                return TokenPlan(keys, earlier, i, len(text) - int(earlier.cut_chars[i]), cuts == "added")
        return TokenPlan(keys, None, -1, len(text))

    def encode(self, text: str, plan: TokenPlan | None = None) -> np.ndarray:
        """The ids of `text`; `plan`: this text's `plan`, when the caller already made it."""
        if plan is None:
            plan = self.plan(text)
        if not plan.keys:
            return np.asarray(self._encode(text, True).ids, dtype=np.uint32)
        prompt = self._extend(text, plan.earlier, plan) if plan.earlier is not None else None
        if prompt is None:
            enc = self._encode(text, True)
            ids = np.asarray(enc.ids, dtype=np.uint32)
            prompt = _Prompt(ids, *_boundaries(enc, ids, 0, 0, self._is_added))
        self._insert(prompt, plan.keys)
        return prompt.ids

    def _encode(self, text: str, add_special_tokens: bool) -> Any:
        # encode_batch lets go of the GIL while it tokenizes (encode holds it, the same time for one text): a long
        # prompt tokenized in a worker thread then leaves the router's event loop serving other requests
        try:
            return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        except TypeError:
            # A lone surrogate (valid JSON, "\ud800") is no text the tokenizer takes: key the prompt as if it were
            # U+FFFD, one character for one, so offsets stay the text's. The request is served all the same.
            return self.tokenizer.encode_batch([_LONE_SURROGATE.sub("\ufffd", text)],
                                               add_special_tokens=add_special_tokens)[0]

    def _extend(self, text: str, earlier: _Prompt, plan: TokenPlan) -> _Prompt | None:
        i = plan.boundary
        b, n = int(earlier.cut_chars[i]), int(earlier.cut_ids[i])
        if plan.after_added:
            # Behind the added token that ends at b, as in the whole prompt: a tokenizer that marks a text's first
            # word (a Metaspace prefix, add_prefix_space) marks no word after an added token.
            token = self.tokenizer.id_to_token(int(earlier.ids[n - 1])) or ""
            if not token or not text.startswith(token, b - len(token)):
                return None
            rest = self._encode(text[b - len(token):], False)
            rest_ids = np.asarray(rest.ids, dtype=np.uint32)
            cuts, cut_ids, added = _boundaries(rest, rest_ids, b - len(token), n - 1, self._is_added)
            keep = cuts > b  # the boundary right after that token is b itself
            cuts, cut_ids, added, rest_ids = cuts[keep], cut_ids[keep], added[keep], rest_ids[1:]
        else:
            rest = self._encode(text[b:], False)
            rest_ids = np.asarray(rest.ids, dtype=np.uint32)
            cuts, cut_ids, added = _boundaries(rest, rest_ids, b, n, self._is_added)
        ids = np.concatenate([earlier.ids[:n], rest_ids, self._suffix])
        self.reuses += 1
        if self.reuses - self._checks_from <= VERIFY_FIRST or self.reuses % VERIFY_EVERY == 0:
            whole = self._encode(text, True).ids
            if ids.tolist() != whole:
                self._narrow_cuts(plan.after_added)
                return _Prompt(np.asarray(whole, dtype=np.uint32), *_NO_CUTS)
        self.reused_ids += n
        return _Prompt(ids, np.concatenate([earlier.cut_chars[:i + 1], cuts]),
                       np.concatenate([earlier.cut_ids[:i + 1], cut_ids]),
                       np.concatenate([earlier.after_added[:i + 1], added]))

    def _narrow_cuts(self, after_added: bool) -> None:
        """A reuse differed from the whole prompt's ids: cut only after added tokens from now on, or not at all."""
        with self._lock:
            if self.cuts == "off" or (self.cuts == "added" and not after_added):
                return  # another thread narrowed them already
            self.cuts = "off" if after_added else "added"
            self._checks_from = self.reuses
            self._by_key.clear()
            self._prompts.clear()
            self._tokens = 0
        if self.cuts == "added":
            log.info("this tokenizer does not tokenize a prompt's end at a word boundary as it does the whole prompt: "
                     "prompts are cut only after added tokens from now on (%d reuses checked)", self.reuses)
        else:
            log.warning("this tokenizer does not tokenize a prompt's end as it does the whole prompt: prompts are "
                        "tokenized whole from now on (%d reuses checked)", self.reuses)

    def _lookup(self, keys: list[int]) -> tuple[_Prompt, int] | None:
        by_key = self._by_key
        with self._lock:
            for k in reversed(keys):
                hit = by_key.get(k)
                if hit is not None:
                    self._prompts.move_to_end(id(hit[0]))
                    return hit
        return None

    def _insert(self, prompt: _Prompt, keys: list[int]) -> None:
        with self._lock:
            if self.cuts == "off":
                return
            prompt.keys = keys
            for g, k in enumerate(keys):
                old = self._by_key.get(k)
                if old is not None:
                    self._release(old[0])
                self._by_key[k] = (prompt, g)
            prompt.live_keys = len(keys)
            self._prompts[id(prompt)] = prompt
            self._tokens += len(prompt.ids)
            while self._tokens > self.max_tokens and self._prompts:
                _, oldest = self._prompts.popitem(last=False)
                self._tokens -= len(oldest.ids)
                for k in oldest.keys:
                    if (hit := self._by_key.get(k)) is not None and hit[0] is oldest:
                        del self._by_key[k]
                oldest.live_keys = 0

    def _release(self, prompt: _Prompt) -> None:
        """One of `prompt`'s hashes now leads to a longer prompt: drop it once none leads to it."""
        prompt.live_keys -= 1
        if prompt.live_keys == 0 and self._prompts.pop(id(prompt), None) is not None:
            self._tokens -= len(prompt.ids)

    @property
    def cached_tokens(self) -> int:
        return self._tokens


class PromptBlocks:
    """Prompt text -> (keys, input token count), with a tokenizer (ids reused across prompts: PromptTokenizer) or
    the text stand-in."""

    def __init__(self, block_size: int, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self.prompt_tokens = PromptTokenizer(tokenizer) if tokenizer is not None else None
        self.block_size = block_size
        self.hasher = BlockHasher(block_size if tokenizer is not None else block_size * TEXT_BYTES_PER_TOKEN)

    def __call__(self, text: str, adapter: str | None = None, plan: TokenPlan | None = None) -> tuple[Sequence[int], int]:
        """`adapter`: the LoRA adapter the prompt runs with (its keys differ from the base model's); `plan`: the
        tokenizer's plan for `text` (`prompt_tokens.plan`), when the caller made it to see what is left to do."""
        small = SMALL_PROMPT_BLOCKS * self.hasher.block_size
        seed = adapter_seed(adapter)
        if self.prompt_tokens is not None:
            ids = self.prompt_tokens.encode(text, plan)
            if len(ids) <= small:
                return self.hasher.small_keys(ids.tolist(), seed), len(ids)
            return self.hasher.block_keys(ids, seed), len(ids)
        data = text.encode("utf-8", "surrogatepass")
        n_tokens = max(1, len(data) // TEXT_BYTES_PER_TOKEN)
        if len(data) <= small:
            return self.hasher.small_keys(data, seed), n_tokens
        return self.hasher.block_keys(np.frombuffer(data, dtype=np.uint8), seed), n_tokens


__all__ = ["BLOCK_CHARS", "DEFAULT_MAX_TOKENS", "PromptBlocks", "PromptTokenizer", "TokenPlan"]
