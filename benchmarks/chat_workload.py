"""The seeded multi-tenant chat workload of the real-engine routing benchmarks (routing_vllm.py, routing_fidelity.py,
serve_shared_host.py): tenants with long system prompts, multi-turn conversations with think times, words from the
Python standard library's source."""

from __future__ import annotations

import argparse
import inspect
import random
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Conversation:
    tenant: int
    start_s: float
    turns: list[tuple[str, str]]  # (user message, the assistant reply the next turn's history carries)
    think_s: list[float] = field(default_factory=list)


def words() -> list[str]:
    import email.message
    import json.decoder

    text = inspect.getsource(json.decoder) + inspect.getsource(email.message)
    return sorted(set(re.findall(r"[a-z]{3,}", text)))


def workload_args(args: argparse.Namespace) -> tuple[Any, ...]:
    """chat_workload's arguments after the seed, from the command line (or a result file's params)."""
    return (args.tenants, args.conversations, args.span, args.system_words, (args.min_turns, args.max_turns), args.think)


def chat_workload(seed: int, tenants: int, conversations: int, span_s: float, system_words: int,
                  turns: tuple[int, int], think_mean_s: float) -> tuple[list[str], list[Conversation]]:
    """Seeded multi-tenant chat: (system prompt per tenant, conversations). Tenant t is picked with weight 1/(t+1)."""
    rng = random.Random(seed)
    vocabulary = words()

    def text(n: int) -> str:
        return " ".join(rng.choice(vocabulary) for _ in range(n))

    systems = [f"You are the assistant of tenant {t}. Follow these rules. " + text(system_words) for t in range(tenants)]
    weights = [1 / (t + 1) for t in range(tenants)]
    convs = []
    for _ in range(conversations):
        n = rng.randint(*turns)
        convs.append(Conversation(
            tenant=rng.choices(range(tenants), weights)[0], start_s=rng.uniform(0, span_s),
            turns=[(text(rng.randint(10, 30)), text(rng.randint(20, 50))) for _ in range(n)],
            think_s=[rng.expovariate(1 / think_mean_s) for _ in range(n)],
        ))
    return systems, sorted(convs, key=lambda c: c.start_s)
