"""Serving takes GPUs back from training on one machine, as the autoscaler's GPU arbitration does on a cluster.

On Kubernetes, a serving pool that cannot get GPUs suspends TrainingJobs of lower `scheduling.priority` than the
InferenceService's `llmfleet.io/priority` annotation (llmfleet.autoscaler.arbitration). `llmfleet up` and
`llmfleet train` on one machine share its GPUs through claims (gpus.py), and the same pure decision runs here: while
replicas of `llmfleet up` wait for whole GPUs, the training runs that hold such GPUs at a lower priority are asked,
lowest priority first, until the missing GPUs are covered, to let go of them (DeviceLocks.ask). A training run
that is asked stops as a suspended TrainingJob does (SIGTERM: it finishes its step, flushes a checkpoint and exits),
lets go of its GPUs, and resumes from that checkpoint once enough GPUs are free and no one asks for them
(llmfleet.local.train_cli). While a request stands no other process claims the device, so it comes to the waiting
replica; the requests are withdrawn once no replica waits.

MIG pools stay out of it, as on a cluster: training holds whole GPUs, which become MIG instances only when the GPU
is repartitioned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.autoscaler.arbitration import ServingNeed, TrainingJobInfo, arbitrate, serving_priority
from llmfleet.local.gpus import Device, DeviceLedger, GpuRequest, matches_type

TRAINING_NOTE_KIND = "training"  # the `kind` of a claim note `llmfleet train` writes


@dataclass(frozen=True)
class TrainingClaim:
    """The GPUs one `llmfleet train` process holds, from its claim notes."""

    job: str
    priority: int
    pid: int
    devices: tuple[Device, ...]

    @property
    def name(self) -> str:
        return f"{self.job} (pid {self.pid})"


def training_note(job: str, priority: int) -> dict[str, object]:
    """What `llmfleet train` writes beside each GPU it claims (DeviceLocks.note adds its pid)."""
    return {"kind": TRAINING_NOTE_KIND, "job": job, "priority": priority}


def training_claims(ledger: DeviceLedger) -> list[TrainingClaim]:
    """The training runs of other processes that hold this machine's devices, by their claim notes."""
    found: dict[tuple[int, str], TrainingClaim] = {}
    for d in ledger.devices or []:
        note = ledger.locks.holder_note(d)
        if not note or note.get("kind") != TRAINING_NOTE_KIND:
            continue
        pid, priority, job = note.get("pid"), note.get("priority", 0), str(note.get("job", "training"))
        if not isinstance(pid, int) or not isinstance(priority, int):
            continue
        have = found.get((pid, job))
        found[pid, job] = TrainingClaim(job, priority, pid, (*(have.devices if have else ()), d))
    return list(found.values())


def service_priority(isvc: InferenceService) -> int:
    """The service's serving priority (llmfleet.autoscaler.arbitration.serving_priority); ValueError naming the
    annotation when it is not an integer."""
    try:
        return serving_priority(isvc.metadata.annotations)
    except ValueError as err:
        raise ValueError(f"{err}; GPU arbitration with local training skipped") from None


class LocalArbiter:
    """One `llmfleet up`'s side: asks lower-priority training runs for the GPUs its waiting replicas need."""

    def __init__(self, service: str, priority: int, ledger: DeviceLedger, event: Callable[[str], None]) -> None:
        self.service, self.priority, self.ledger, self.event = service, priority, ledger, event
        self.asked: dict[str, tuple[str, ...]] = {}  # training run (name) -> the device ids asked of it

    def update(self, waiting: Sequence[GpuRequest]) -> None:
        """One pass, with what the replicas waiting now ask for: ask or withdraw."""
        whole = [w for w in waiting if w.count > 0 and not w.mig]
        if not whole or self.ledger.devices is None:
            if self.asked:
                self.event(f"no replica waits for a GPU: withdrew the requests to training "
                           f"({', '.join(self.asked)})")
                self.withdraw()
            return
        claims = {c.name: c for c in training_claims(self.ledger)
                  if any(matches_type(d.product, w.gpu_type) for d in c.devices for w in whole)}
        need = ServingNeed(self.service, self.priority, burning=True, gpus_missing=sum(w.count for w in whole),
                           gpus_surplus=0)
        jobs = [TrainingJobInfo(name=c.name, priority=c.priority, gpus=len(c.devices), suspended=False)
                for c in claims.values()]
        by = f"InferenceService {self.service} (priority {self.priority})"
        for action in arbitrate(need, jobs):
            claim = claims[action.job]
            # A run asked before may hold other GPUs now (it resumed on free ones): those are asked anew.
            new = [d for d in claim.devices if d.id not in self.asked.get(action.job, ())]
            if action.action != "suspend" or not new:
                continue
            got = tuple(d.id for d in new if self.ledger.locks.ask(d, by))
            if got:
                self.asked[action.job] = (*self.asked.get(action.job, ()), *got)
                self.event(f"{need.gpus_missing} GPU(s) wanted by waiting replicas: asked training {action.job}, "
                           f"priority {claim.priority} < {self.priority}, to let go of GPU {','.join(got)} "
                           f"(it checkpoints and resumes when GPUs are free)")

    def withdraw(self) -> None:
        self.ledger.locks.withdraw_all()
        self.asked = {}
