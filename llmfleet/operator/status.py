"""Conditions and the outcome of one reconcile (status patch + Events), shared by both kinds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from llmfleet.api.loader import problems_from, problems_line

EventType = Literal["Normal", "Warning"]
CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "PromotionTarget")


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclass
class ReconcileOutcome:
    """What one reconcile decided: a status patch (camelCase) and Events to post."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    applied: int = 0
    # CPU seconds (this thread's) spent computing: validate, render, status. Not API waits, not time other
    # tasks or processes held the CPU.
    compute_seconds: float = 0.0
    # Events about other objects (e.g. the InferenceService a model is promoted to): (object, event).
    other_events: list[tuple[dict[str, Any], Event]] = field(default_factory=list)

    def event(self, type: EventType, reason: str, message: str) -> None:
        self.events.append(Event(type, reason, message))


def set_conditions(
    old: list[dict[str, Any]] | None,
    updates: dict[str, tuple[bool, str, str]],
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """New condition list: `updates` maps type -> (status, reason, message); transition time kept when unchanged."""
    by_type = {c.get("type"): c for c in (old or []) if isinstance(c, dict)}
    out = []
    for ctype in CONDITION_TYPES:
        if ctype not in updates:
            if ctype in by_type:
                out.append(by_type[ctype])
            continue
        flag, reason, message = updates[ctype]
        status = "True" if flag else "False"
        prev = by_type.get(ctype)
        changed = prev is None or prev.get("status") != status
        out.append({
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now if changed or prev is None else prev.get("lastTransitionTime", now),
            "observedGeneration": generation,
        })
    return out


def condition(conditions: list[dict[str, Any]] | None, ctype: str) -> dict[str, Any] | None:
    for c in conditions or []:
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None


def invalid_spec_message(err: ValidationError | ValueError) -> str:
    """'path: message; ...' for a pydantic error, or the message of a builder's spec error."""
    if isinstance(err, ValidationError):
        return problems_line(problems_from(err))
    return str(err)


def invalid_spec_outcome(
    old_status: dict[str, Any], message: str, generation: int | None, now: str, kind: str
) -> ReconcileOutcome:
    """Ready=False/InvalidSpec with the field path; children stay as they were."""
    out = ReconcileOutcome()
    old_ready = condition(old_status.get("conditions"), "Ready")
    out.status = {
        "phase": "Invalid",
        "observedGeneration": generation,
        "conditions": set_conditions(
            old_status.get("conditions"),
            {
                "Ready": (False, "InvalidSpec", message),
                "Progressing": (False, "InvalidSpec", "waiting for a valid spec"),
                "Degraded": (True, "InvalidSpec", message),
            },
            generation,
            now,
        ),
    }
    if not old_ready or old_ready.get("reason") != "InvalidSpec" or old_ready.get("message") != message:
        out.event("Warning", "InvalidSpec", f"{kind} spec is invalid: {message}")
    return out


def status_of(body: Any) -> dict[str, Any]:
    """The object's status as a dict; anything else (written by hand or before a CRD upgrade) counts as none,
    so one malformed object gets a condition instead of failing its reconcile."""
    status = body.get("status")
    return dict(status) if isinstance(status, Mapping) else {}


def cr_dict(body: Any) -> dict[str, Any]:
    """The parts of a kopf body the API models read (metadata trimmed of server-managed noise)."""
    meta = body.get("metadata", {})
    keep = {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "generation", "uid") if k in meta}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": keep, "spec": body.get("spec")}
