"""The demo's traffic: multi-tenant multi-turn chat with shared system prompts, streamed over HTTP.

Each simulated user belongs to a tenant; a tenant's sessions share its long system prompt (the prefix
that prefix-aware routing keeps on one replica), and every turn resends the conversation so far. Each
response is recorded with its TTFT, the pool that served it (`x-llmfleet-pool`) and whether the router
degraded it to a student (`x-llmfleet-degraded`). `targets` is the router URL, or several replica URLs
used in turn (the round-robin baseline, no router).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

TENANTS = {
    "acme-code": "You are a senior Python reviewer for Acme. Answer with short, precise suggestions about the "
    "standard library: prefer pathlib over os.path, use contextlib for resource handling, dataclasses for "
    "records, functools.lru_cache for pure memoization, itertools for lazy iteration, typing for signatures. " * 3,
    "globex-ops": "You are the on-call assistant of Globex's data platform. Explain failures step by step, quote "
    "the relevant log line, propose one safe fix and one follow-up. Never invent metrics; say when data is "
    "missing. Keep answers under five sentences, in plain words an engineer new to the team understands. " * 3,
    "initech-tutor": "You are Initech's tutor for algorithms. For each question, state the complexity, give a "
    "small example, and mention one pitfall: off-by-one errors, mutating a list while iterating, integer "
    "overflow in other languages, recursion depth limits, or hash collisions under adversarial input. " * 3,
}
SNIPPET_CHARS = 900  # ~250 tokens of the tiny tokenizer
MAX_TOKENS = 16  # answer tokens per chat turn
USER_TURNS = [
    "How do I read a large file line by line?", "What is the difference between a list and a tuple?",
    "Why does my loop skip elements?", "How should I cache an expensive function?",
    "Explain binary search with an example.", "What does this traceback mean: KeyError: 'id'?",
    "How do I merge two sorted lists?", "When should I use a generator?", "Is dict ordering guaranteed?",
    "How can I time a function precisely?",
]


@functools.cache
def _sources() -> list[str]:
    from llmfleet.local.tinymodel import stdlib_files

    return [p.read_text(errors="replace") for p in stdlib_files()[:60]]


def code_snippet(rng: random.Random, chars: int = SNIPPET_CHARS) -> str:
    """A random piece of standard-library source (every machine has it)."""
    text = rng.choice([t for t in _sources() if len(t) > chars] or [""])
    start = rng.randrange(0, max(1, len(text) - chars))
    return text[start:start + chars]


@dataclass
class Sample:
    """One chat completion as the client saw it."""

    ts: float
    phase: str
    tenant: str
    turn: int
    ok: bool
    ttft_ms: float | None = None
    e2e_ms: float = 0.0
    tokens: int = 0
    pool: str = ""
    degraded: bool = False
    target: str = ""
    error: str = ""


def context_check(model_dir: str, max_model_len: int, max_tokens: int) -> Callable[[list[dict[str, str]]], bool]:
    """Whether a conversation still fits `max_model_len` with `max_tokens` to spare, counted as the engine counts
    it: the model's own tokenizer and chat template (transformers, which vLLM brings). A code snippet that
    tokenizes badly, or a fourth turn, can otherwise pass the tiny models' 1,024-token window, and the engine
    refuses the request (HTTP 400)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)

    def fits(messages: list[dict[str, str]]) -> bool:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return len(ids) + max_tokens <= max_model_len

    return fits


@dataclass
class Traffic:
    """Who sends what: `users` concurrent chat users spread over the tenants, until `stop()` or `until`.

    `fits` (`context_check`): whether a conversation fits the model's window. A user whose next turn would not fit
    starts a new conversation, as a chat client that knows its model's window does; a first turn that would not
    fit gets a shorter code snippet. None: no check."""

    targets: list[str]
    phase: str
    users: int
    model: str = "demo"
    think_s: tuple[float, float] = (0.3, 1.0)
    max_tokens: int = MAX_TOKENS
    salt: str = ""  # makes this phase's prompts unlike other phases' (no cache carried over between A and B)
    seed: int = 7
    timeout_s: float = 300.0
    fits: Callable[[list[dict[str, str]]], bool] | None = None

    def __post_init__(self) -> None:
        self.samples: list[Sample] = []
        self._stop = asyncio.Event()
        self._rr = itertools.cycle(self.targets)

    def stop(self) -> None:
        self._stop.set()

    async def run(self, until: float | None = None, on_sample: Callable[[Sample], None] | None = None) -> list[Sample]:
        rng = random.Random(self.seed)
        limits = httpx.Limits(max_connections=self.users * 2 + 4)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            await asyncio.gather(*(self._user(client, u, random.Random(rng.random()), until, on_sample)
                                   for u in range(self.users)))
        return self.samples

    def _done(self, until: float | None) -> bool:
        return self._stop.is_set() or (until is not None and time.time() >= until)

    async def _user(self, client: httpx.AsyncClient, user: int, rng: random.Random, until: float | None,
                    on_sample: Callable[[Sample], None] | None) -> None:
        tenants = list(TENANTS)
        tenant = tenants[user % len(tenants)]
        session = 0
        while not self._done(until):
            session += 1
            system = f"[{self.salt}] {TENANTS[tenant]}" if self.salt else TENANTS[tenant]
            messages: list[dict[str, str]] = [{"role": "system", "content": system}]
            for turn in range(rng.randint(2, 4)):
                if self._done(until):
                    return
                question = rng.choice(USER_TURNS)
                if turn == 0:  # each session starts from its own piece of code: a long, session-specific prefix
                    snippet = code_snippet(rng)
                    while True:
                        messages.append({"role": "user",
                                         "content": f"About this code:\n```\n{snippet}\n```\n{question}"})
                        if self.fits is None or self.fits(messages) or not snippet:
                            break
                        messages.pop()
                        snippet = snippet[:len(snippet) // 2]  # a snippet that tokenizes badly: a shorter piece
                else:
                    messages.append({"role": "user", "content": question})
                    if self.fits is not None and not self.fits(messages):
                        break  # the conversation has outgrown the model's window: a new one
                s, answer = await self._chat(client, next(self._rr), messages, tenant, turn,
                                             f"{self.phase}-{tenant}-u{user}-s{session}")
                self.samples.append(s)
                if on_sample is not None:
                    on_sample(s)
                if not s.ok:
                    await asyncio.sleep(1.0)
                    break
                messages.append({"role": "assistant", "content": answer})
                await asyncio.sleep(rng.uniform(*self.think_s))

    async def _chat(self, client: httpx.AsyncClient, target: str, messages: list[dict[str, str]], tenant: str,
                    turn: int, session: str) -> tuple[Sample, str]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                                "stream": True, "ignore_eos": True}
        t0 = time.time()
        s = Sample(ts=t0, phase=self.phase, tenant=tenant, turn=turn, ok=False, target=target)
        text: list[str] = []
        try:
            async with client.stream("POST", target + "/v1/chat/completions", json=body,
                                     headers={"x-session-id": session}) as resp:
                s.pool = resp.headers.get("x-llmfleet-pool", "")
                s.degraded = resp.headers.get("x-llmfleet-degraded") == "true"
                if resp.status_code != 200:
                    s.error = f"HTTP {resp.status_code}: {(await resp.aread())[:120]!r}"
                else:
                    async for line in resp.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                        if delta:
                            if s.ttft_ms is None:
                                s.ttft_ms = (time.time() - t0) * 1000
                            text.append(delta)
                    s.ok = s.ttft_ms is not None
                    if not s.ok:
                        s.error = "no tokens in the stream"
        except (httpx.HTTPError, ValueError) as err:
            s.error = f"{type(err).__name__}: {str(err)[:120]}"
        s.e2e_ms, s.tokens = (time.time() - t0) * 1000, len(text)
        return s, "".join(text)
