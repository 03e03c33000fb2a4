"""The demo's chat users keep every request within the model's window (`Traffic.fits`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from llmfleet.local.demo_traffic import Sample, Traffic, _sources


def _chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


def _sent(window: int | None, seconds: float = 0.3) -> list[list[dict[str, str]]]:
    """What one user sends to a fake engine for `seconds`, with a window of `window` characters (None: no check)."""
    _sources()  # the code snippets' files, read once before the clock starts
    sent: list[list[dict[str, str]]] = []

    async def fake_chat(self: Traffic, client: Any, target: str, messages: list[dict[str, str]], tenant: str,
                        turn: int, session: str) -> tuple[Sample, str]:
        sent.append([dict(m) for m in messages])
        await asyncio.sleep(0)
        return Sample(ts=time.time(), phase=self.phase, tenant=tenant, turn=turn, ok=True, ttft_ms=1.0), "x" * 400

    t = Traffic(["http://fake"], "test", users=1, think_s=(0.0, 0.0), seed=3,
                fits=None if window is None else (lambda m: _chars(m) <= window))
    t._chat = fake_chat.__get__(t)  # type: ignore[method-assign]
    asyncio.run(t.run(until=time.time() + seconds))
    return sent


def test_without_a_window_conversations_grow_past_it() -> None:
    assert max(_chars(m) for m in _sent(None)) > 2400  # the check below is not vacuous


def test_every_request_fits_the_window_and_sessions_restart_when_they_would_not() -> None:
    sent = _sent(2400)
    assert sent and all(_chars(m) <= 2400 for m in sent)
    firsts = [m for m in sent if len(m) == 2]
    assert len(firsts) >= 2  # sessions that would outgrow the window start over



def test_a_first_turn_too_long_for_the_window_gets_a_shorter_snippet() -> None:
    sent = _sent(1500)  # the system prompt plus a whole snippet is ~1,850 characters
    firsts = [m for m in sent if len(m) == 2]
    assert firsts and all(_chars(m) <= 1500 for m in sent)
    assert all("About this code" in m[1]["content"] for m in firsts)  # shortened, not dropped
