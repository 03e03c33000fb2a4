"""When the operator's timer reconciles: a safety net behind the create/update/resume handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from llmfleet.operator.config import OperatorConfig
from llmfleet.operator.handlers import Runtime, run_reconcile
from llmfleet.operator.status import ReconcileOutcome


def _run(memo: Any, trigger: str, body: Mapping[str, Any], seen: list[str]) -> None:
    async def reconcile(body: Mapping[str, Any], rt: Runtime) -> ReconcileOutcome:
        seen.append(trigger)
        return ReconcileOutcome()

    asyncio.run(run_reconcile("TrainingJob", trigger, body, {}, memo, reconcile))


def test_timer_waits_for_the_first_handler_and_skips_right_after_one() -> None:
    rt = Runtime(config=OperatorConfig(timer_interval_seconds=30.0), capabilities_known=True)
    memo = SimpleNamespace(llmfleet=rt)
    body = {"metadata": {"uid": "u1", "name": "job"}, "status": {"phase": "Pending"}}
    seen: list[str] = []
    _run(memo, "timer", body, seen)  # no handler has reconciled it yet: its create/resume handler is queued
    _run(memo, "create", body, seen)
    _run(memo, "timer", body, seen)  # reconciled less than half an interval ago
    assert seen == ["create"]
    rt.last_done["u1"] -= 16.0  # more than half an interval ago
    _run(memo, "timer", body, seen)
    assert seen == ["create", "timer"]


def test_timer_of_a_running_training_job_always_runs() -> None:
    rt = Runtime(config=OperatorConfig(timer_interval_seconds=30.0), capabilities_known=True)
    memo = SimpleNamespace(llmfleet=rt)
    body = {"metadata": {"uid": "u2", "name": "job"}, "status": {"phase": "Running"}}
    seen: list[str] = []
    _run(memo, "timer", body, seen)  # reads rank 0's status even before this process's first handler ran
    _run(memo, "resume", body, seen)
    _run(memo, "timer", body, seen)
    assert seen == ["timer", "resume", "timer"]
