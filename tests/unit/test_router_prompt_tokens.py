"""PromptTokenizer: a prompt's ids reuse an earlier prompt's, equal to tokenizing it whole, or reuse turns off."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors, trainers

from llmfleet.router import prompt_tokens
from llmfleet.router.block_keys import BlockHasher
from llmfleet.router.prompt_tokens import PromptBlocks, PromptTokenizer

SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama 3's pre-tokenization pattern: punctuation takes the newlines after it, numbers go in threes
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = Path(textwrap.__file__).read_text()


def _bpe(pre_tokenizer: Any, post: str | None = "<|begin_of_text|> $A") -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator([CORPUS], trainers.BpeTrainer(
        vocab_size=1500, special_tokens=[*SPECIALS, "[SEP]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if post is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=post, special_tokens=[(t, tok.token_to_id(t)) for t in ("<|begin_of_text|>", "[SEP]")])
    return tok


def llama3_style() -> Tokenizer:
    return _bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))


def chats(seed: int = 0, conversations: int = 12, turns: int = 4) -> list[str]:
    """Multi-turn chat prompts in a Llama-3-like template, in arrival order: each turn's prompt is the whole
    conversation so far; conversations of a tenant share its system prompt."""
    rng = random.Random(seed)
    words = CORPUS.split()
    systems = [" ".join(words[i * 150:(i + 1) * 150]) for i in range(3)]
    header = "<|start_header_id|>{}<|end_header_id|>\n\n"
    history = [header.format("system") + systems[c % 3] + "<|eot_id|>" for c in range(conversations)]
    out = []
    for _ in range(turns):
        for c in range(conversations):
            user = " ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) + rng.choice(["?", ".\n", " 123"])
            history[c] += header.format("user") + user + "<|eot_id|>"
            out.append(history[c] + header.format("assistant"))
            history[c] += header.format("assistant") + " ".join(rng.choice(words) for _ in range(20)) + ".<|eot_id|>"
    return out


def whole(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=True).ids)


def test_reuse_equals_whole_tokenization_and_saves_most_of_it() -> None:
    tok = llama3_style()
    pt = PromptTokenizer(tok)
    prompts = chats()
    total = 0
    for text in prompts:
        ids = pt.encode(text)
        assert ids.dtype == np.uint32 and ids.tolist() == whole(tok, text)
        total += len(ids)
    assert pt.enabled
    assert pt.reuses >= len(prompts) - 3  # all but each tenant's first prompt start from an earlier one
    assert pt.reused_ids > 0.6 * total
    # later turns extend earlier ones: those are dropped, not kept beside them
    assert pt.cached_tokens < 0.5 * total


def test_suffix_tokens_of_the_post_processor_follow_the_rest() -> None:
    tok = _bpe(pre_tokenizers.Whitespace(), post="<|begin_of_text|> $A [SEP]")
    pt = PromptTokenizer(tok)
    for text in chats(seed=1):
        assert pt.encode(text).tolist() == whole(tok, text)
    assert pt.enabled and pt.reuses > 0


@pytest.mark.parametrize("pre", [pre_tokenizers.ByteLevel(add_prefix_space=True),
                                 pre_tokenizers.Metaspace(prepend_scheme="first")], ids=["prefix-space", "metaspace"])
def test_a_tokenizer_that_marks_a_texts_first_word_is_cut_only_after_added_tokens(pre: Any, caplog: Any) -> None:
    # Cut at a word boundary, the rest's first word would be marked as a text's first; behind an added token, as
    # in the whole prompt, it is not. The first checks find the difference and narrow the cuts.
    caplog.set_level("INFO", logger="llmfleet.router.prompt_tokens")
    tok = _bpe(pre)
    pt = PromptTokenizer(tok)
    prompts = chats(seed=2)
    for text in prompts:
        assert pt.encode(text).tolist() == whole(tok, text)  # checked reuses never return the wrong ids
        if pt.cuts == "added" and not hasattr(pt, "_reused_when_narrowed"):
            pt._reused_when_narrowed = pt.reused_ids  # type: ignore[attr-defined]
    assert pt.cuts == "added" and pt.enabled
    assert pt.reused_ids > pt._reused_when_narrowed + 10_000  # type: ignore[attr-defined]  # and reuse goes on
    assert "cut only after added tokens" in caplog.text


def test_padding_or_truncation_turns_reuse_off() -> None:
    tok = llama3_style()
    tok.enable_truncation(64)
    assert not PromptTokenizer(tok).enabled
    tok.no_truncation()
    tok.enable_padding(length=512)
    assert not PromptTokenizer(tok).enabled


def test_checks_continue_after_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompt_tokens, "VERIFY_FIRST", 2)
    monkeypatch.setattr(prompt_tokens, "VERIFY_EVERY", 3)
    tok = llama3_style()
    pt = PromptTokenizer(tok)
    prompts = iter(chats(seed=3, conversations=30))

    def until(cuts: str) -> None:
        # ids between two checks may be wrong (a prefix-index miss, no more); the check that finds them is not
        for _ in range(30):
            text = next(prompts)
            ids = pt.encode(text).tolist()
            if pt.cuts == cuts:
                assert ids == whole(tok, text)
                return

    def corrupt() -> None:
        # a wrong id in every kept prompt (what a tokenizer that is not prefix-stable would leave): the next
        # sampled check finds it, returns the whole tokenization and narrows the cuts
        for prompt in pt._prompts.values():
            prompt.ids[1:] = 0

    for _ in range(12):
        pt.encode(next(prompts))
    assert pt.cuts == "words" and pt.reuses > 3
    corrupt()
    until("added")
    assert pt.cuts == "added" and pt.cached_tokens < 5_000  # what was kept went with the word cuts


def test_a_tokenizer_whose_parts_never_match_turns_reuse_off(caplog: Any) -> None:
    tok = llama3_style()

    class OffByOne:
        """The tokenizer, except that a text tokenized without special tokens (a prompt's rest) gets one id more."""

        def __getattr__(self, name: str) -> Any:
            return getattr(tok, name)

        def encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[Any]:
            enc = tok.encode_batch(texts, add_special_tokens=add_special_tokens)[0]
            if add_special_tokens:
                return [enc]
            return [type("Enc", (), {"ids": [*enc.ids, 7], "offsets": [*enc.offsets, enc.offsets[-1]],
                                     "word_ids": [*enc.word_ids, None]})()]

    pt = PromptTokenizer(OffByOne())
    for text in chats(seed=6):
        assert pt.encode(text).tolist() == whole(tok, text)
    assert pt.cuts == "off" and not pt.enabled and pt.cached_tokens == 0
    assert "tokenized whole from now on" in caplog.text


def test_memory_bound() -> None:
    tok = llama3_style()
    pt = PromptTokenizer(tok, max_tokens=2_000)
    for text in chats(seed=4, conversations=30):
        assert pt.encode(text).tolist() == whole(tok, text)
        assert pt.cached_tokens <= 2_000
    assert pt.reuses > 0


def test_prompt_blocks_keys_are_the_whole_prompts_keys() -> None:
    tok = llama3_style()
    pb = PromptBlocks(16, tok)
    hasher = BlockHasher(16)
    for text in chats(seed=5):
        keys, n = pb(text)
        ids = whole(tok, text)
        assert n == len(ids) and list(keys) == hasher.keys(ids)
    assert pb.prompt_tokens is not None and pb.prompt_tokens.reuses > 0


def test_the_cut_stays_clear_of_where_the_texts_part() -> None:
    # The earlier prompt has a word boundary exactly where the shared text ends (a prefix-hash block's end):
    # " th" then " is". The new prompt goes on "the": a cut there would tokenize "th" and "e" apart.
    tok = llama3_style()
    pt = PromptTokenizer(tok)
    filler = " ".join(CORPUS.split()[:60])
    base = filler[: 3 * prompt_tokens.BLOCK_CHARS - 3] + " th"
    assert len(base) % prompt_tokens.BLOCK_CHARS == 0
    earlier, later = base + " is the end", base + "e end of it"
    for text in (earlier, later, earlier + " again", later + " again"):
        assert pt.encode(text).tolist() == whole(tok, text)
    assert pt.enabled and pt.reuses == 3


def _longest_main_thread_stall(work: Any) -> float:
    """The longest this thread waits between two turns of a loop while `work` runs in another thread, seconds."""
    import threading
    import time

    t = threading.Thread(target=work)
    longest, last = 0.0, time.perf_counter()
    t.start()
    alive = True
    while alive:
        # the wait up to the check that finds the thread done counts too: where `work` holds the GIL from its
        # start, this thread's first turn may come only after it ended
        alive = t.is_alive()
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    t.join()
    return longest


def test_tokenizing_in_a_worker_thread_leaves_the_event_loop_running() -> None:
    # The router sends long prompts to a worker thread; `Tokenizer.encode` holds the GIL for all its work, so
    # there the loop stood still for the whole encode. Compared with that control, the loop must get its turns:
    # its longest stall stays a small part of the control's. (Counting its turns instead failed on a loaded
    # machine: other processes took turns from both runs alike, and the control's count is the one switch
    # interval before the encode takes the GIL.)
    tok = llama3_style()
    text = CORPUS * 40  # ~0.5 s of tokenizing
    pt = PromptTokenizer(tok)
    held = _longest_main_thread_stall(lambda: tok.encode(text, add_special_tokens=True))
    released = _longest_main_thread_stall(lambda: pt.encode(text))
    assert held > 0.2 and released < held / 5, (released, held)


def test_a_lone_surrogate_is_keyed_as_a_replacement_character() -> None:
    # Valid JSON ("\ud800") but no text a tokenizer takes: the prompt is keyed as if it held U+FFFD, short or long,
    # whole or reusing an earlier prompt, and reuse goes on.
    tok = llama3_style()
    pb = PromptBlocks(16, tok)
    hasher = BlockHasher(16)
    for text in chats(seed=7)[:20]:
        odd = text.replace(" the ", " \ud800 ", 1)
        keys, n = pb(odd)
        ids = whole(tok, odd.replace("\ud800", "\ufffd"))
        assert n == len(ids) and list(keys) == hasher.keys(ids)
    short, n = pb("a \udc80 b")
    assert n == len(whole(tok, "a \ufffd b"))
    assert pb.prompt_tokens is not None and pb.prompt_tokens.enabled and pb.prompt_tokens.reuses > 0
