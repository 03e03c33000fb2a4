"""Graceful stop on SIGTERM: finish the current step, flush a checkpoint, report, exit 0.

Kubernetes sends SIGTERM to the pod's torchrun when a TrainingJob is suspended (spec.suspend, the
autoscaler's arbitration, Kueue preemption) or its pod is evicted; torchrun forwards it to every worker and
SIGKILLs them `TORCHRUN_CLOSE_S` later (torch.distributed.elastic's fixed close timeout), whatever the pod's
terminationGracePeriodSeconds says. The handler only sets a flag: the training loop checks it between steps,
and the ranks agree on it with one all-reduce, because on several nodes the signal reaches them at different
steps and a rank that stopped alone would leave the others waiting in a collective.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from types import FrameType

log = logging.getLogger("llmfleet.train")

# torch.distributed.elastic's PContext.close(timeout=30): SIGTERM to the workers, SIGKILL 30 s later.
TORCHRUN_CLOSE_S = 30.0
# Environment variable the operator sets to the pod's terminationGracePeriodSeconds.
GRACE_ENV = "LLMFLEET_STOP_GRACE_SECONDS"


class StopRequest:
    """SIGTERM (and SIGINT) -> a flag and the time it arrived; the deadline is the smaller of the pod's grace
    period and torchrun's close timeout (when torchrun started this process)."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.at: float | None = None
        grace = float(os.environ.get(GRACE_ENV, TORCHRUN_CLOSE_S))
        under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
        self.budget_s = min(grace, TORCHRUN_CLOSE_S) if under_torchrun else grace

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal, self.at = signal.Signals(signum).name, time.monotonic()
            log.warning("%s: stopping after the current step and saving a checkpoint (budget %.0f s)",
                        self.signal, self.budget_s)

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def remaining_s(self) -> float:
        """Seconds left before the process is killed (infinite when no stop was requested)."""
        if self.at is None:
            return float("inf")
        return self.budget_s - (time.monotonic() - self.at)
