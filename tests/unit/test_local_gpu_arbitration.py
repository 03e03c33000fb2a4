"""Serving takes GPUs back from local training (llmfleet/local/gpu_arbitration.py): the requests between
processes, the supervisor's side, and `llmfleet train`'s suspension and resumption, with a stand-in nvidia-smi."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from llmfleet.local.gpu_arbitration import LocalArbiter, training_claims, training_note
from llmfleet.local.gpus import LOCK_DIR_ENV, DeviceLedger, DeviceLocks, GpuRequest, parse_nvidia_smi_list

from .test_local_gpus import NVIDIA_SMI_L, EnvEchoSupervisor, _fake_nvidia_smi, _service, _shown

H100 = GpuRequest(count=1, gpu_type="H100")


@pytest.fixture(autouse=True)
def _own_lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))


def _wait(cond: Any, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def test_a_request_keeps_the_device_for_who_asked_and_ends_with_its_process(tmp_path: Path) -> None:
    gpu0 = parse_nvidia_smi_list(NVIDIA_SMI_L)[0]
    holder, asker, third = (DeviceLocks(tmp_path / "l") for _ in range(3))
    assert holder.acquire(gpu0)
    holder.note(gpu0, training_note("pretrain", 3))
    note = asker.holder_note(gpu0)
    assert note is not None and note["job"] == "pretrain" and note["priority"] == 3 and note["pid"] == os.getpid()
    assert holder.holder_note(gpu0) is None  # one's own claim is not another's

    assert asker.ask(gpu0, "InferenceService chat (priority 10)") and asker.ask(gpu0, "again")
    assert not third.ask(gpu0, "someone else")  # one request per device at a time
    assert holder.asked(gpu0) == "InferenceService chat (priority 10)" and asker.asked(gpu0) is None
    holder.release(gpu0)
    assert asker.holder_note(gpu0) is None and not (tmp_path / "l" / f"{gpu0.uuid}.holder.json").exists()
    # The freed device goes to the process that asked, not to another (nor back to the holder).
    ledger = DeviceLedger([gpu0], third)
    assert ledger.claim("x", H100) is None and not ledger.free_for(H100)
    mine = DeviceLedger([gpu0], asker)
    assert [d.id for d in mine.claim("primary-0", H100) or []] == ["0"]
    mine.release_all()
    assert third.asked(gpu0) is not None  # the request stands until withdrawn
    assert asker.withdraw_all() == [gpu0.uuid] and third.asked(gpu0) is None
    assert [d.id for d in ledger.claim("x", H100) or []] == ["0"]
    ledger.release_all()

    # A process that asks and dies (SIGKILL) withdraws with it.
    code = ("import sys, time; from pathlib import Path; from llmfleet.local.gpus import DeviceLocks, parse_nvidia_smi_list; "
            f"d = parse_nvidia_smi_list({NVIDIA_SMI_L!r})[0]; assert DeviceLocks(Path(sys.argv[1])).ask(d, 'gone soon'); "
            "print('asked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "l")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "asked"
        assert holder.asked(gpu0) == "gone soon"
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert holder.asked(gpu0) is None


def test_the_arbiter_asks_lower_priority_training_lowest_first_and_withdraws(tmp_path: Path) -> None:
    """The autoscaler's pure decision (arbitrate) on the claims' notes: jobs strictly below the service's priority,
    lowest first, until the missing GPUs are covered; nothing for MIG replicas; withdrawn once no replica waits."""
    listing = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i}-0000-0000-0000-000000000000)\n"
                      for i in range(4))
    devices = parse_nvidia_smi_list(listing)
    jobs = {}
    for job, priority, ds in (("low", 1, devices[:2]), ("mid", 5, devices[2:3]), ("high", 20, devices[3:])):
        locks = DeviceLocks(tmp_path / "l")
        for d in ds:
            assert locks.acquire(d)
            locks.note(d, training_note(job, priority))
        jobs[job] = locks
    ledger = DeviceLedger(devices, DeviceLocks(tmp_path / "l"))
    assert sorted((c.job, c.priority, len(c.devices)) for c in training_claims(ledger)) == [
        ("high", 20, 1), ("low", 1, 2), ("mid", 5, 1)]
    events: list[str] = []
    arbiter = LocalArbiter("chat", 10, ledger, events.append)
    arbiter.update([GpuRequest(count=1, gpu_type="H100", mig="3g.40gb")])  # a MIG replica: training cannot help
    assert arbiter.asked == {} and events == []
    arbiter.update([H100])
    assert list(arbiter.asked) == [f"low (pid {os.getpid()})"] and arbiter.asked[f"low (pid {os.getpid()})"] == ("0", "1")
    assert "asked training low (pid" in events[0] and "priority 1 < 10, to let go of GPU 0,1" in events[0]
    assert jobs["low"].asked(devices[0]) == "InferenceService chat (priority 10)"
    arbiter.update([H100])
    assert len(events) == 1  # said once
    arbiter.update([H100, H100, H100])  # three wanted: "low" frees two, "mid" the third; "high" is above chat
    assert sorted(j.split(" ")[0] for j in arbiter.asked) == ["low", "mid"] and len(events) == 2
    assert jobs["high"].asked(devices[3]) is None
    arbiter.update([])
    assert arbiter.asked == {} and events[-1].startswith("no replica waits for a GPU: withdrew")
    assert jobs["low"].asked(devices[0]) is None and jobs["mid"].asked(devices[2]) is None


STAND_IN_TRAINER = """\
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
with out.open("a") as f:
    f.write(f"start CVD={os.environ.get('CUDA_VISIBLE_DEVICES')}\\n")
if out.read_text().count("start") > 1:
    sys.exit(0)  # resumed: the rest of the run
def stop(*_):
    with out.open("a") as f:
        f.write("checkpoint\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(120)
"""


@pytest.mark.timeout(120)
async def test_a_higher_priority_service_gets_the_gpu_training_holds_and_training_resumes_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmfleet train` (priority 0) holds the one whole H100; `llmfleet up` of priority 10 starts a replica that
    waits for it and asks; the run checkpoints (SIGTERM), lets go, the replica starts on GPU 0; once the service
    no longer needs it, the run claims it again and resumes."""
    from llmfleet.local import train_cli

    monkeypatch.setattr(train_cli, "YIELD_POLL_S", 0.05)
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, NVIDIA_SMI_L)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    train_env = dict(os.environ, PATH=path)
    ledger = train_cli._claim_gpus("distill", 1, "H100", train_env, priority=0)
    assert ledger is not None and train_env["CUDA_VISIBLE_DEVICES"] == "0"
    out = tmp_path / "trainer.txt"
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(train_cli._run_yielding(
        [sys.executable, "-c", STAND_IN_TRAINER, str(out)], train_env, ledger, "distill", "H100", 0)))
    runner.start()
    _wait(lambda: out.exists() and "start CVD=0" in out.read_text(), what="the trainer starts")

    one = {"replicas": 1, "maxReplicas": 1, "fallback": {"pools": []}}
    isvc = _service(**one)
    isvc.metadata.annotations["llmfleet.io/priority"] = "10"
    sup = EnvEchoSupervisor(isvc, tmp_path / "run", prometheus=False, env={"PATH": path})
    try:
        sup.start()
        sup.reconcile()
        replica = sup.slots["primary"][0]
        assert replica.proc is None and replica.waiting_for is not None
        assert any("asked training distill (pid" in m and "to let go of GPU 0" in m for _, m in sup.events)
        _wait(lambda: "checkpoint" in out.read_text(), what="the trainer checkpoints")

        def started() -> bool:
            sup.reconcile()
            return replica.proc is not None
        _wait(started, what="the replica gets GPU 0")
        assert _shown(replica) == "CVD=0 ORDER=PCI_BUS_ID" and runner.is_alive()  # training waits, suspended

        sup.desired["primary"] = 0  # the service scales in: the request is withdrawn, training resumes
        _wait(lambda: (sup.reconcile(), replica.proc is None)[1], what="the replica stops")
        sup.reconcile()
        assert any(m.startswith("no replica waits for a GPU: withdrew") for _, m in sup.events)
        runner.join(timeout=30)
        assert result == [0] and out.read_text().splitlines() == ["start CVD=0", "checkpoint", "start CVD=0"]
    finally:
        await sup.stop(grace_s=0)
        ledger.release_all()


def test_equal_priority_or_a_bad_annotation_asks_nothing(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, NVIDIA_SMI_L)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    bad = _service(replicas=1, maxReplicas=1, fallback={"pools": []})
    bad.metadata.annotations["llmfleet.io/priority"] = "high"
    sup = EnvEchoSupervisor(bad, tmp_path / "run", prometheus=False, env=env)
    assert sup.arbiter is None
    assert any("llmfleet.io/priority]: expected an integer, got 'high'" in m for _, m in sup.events)

    devices = parse_nvidia_smi_list(NVIDIA_SMI_L)
    locks = DeviceLocks(tmp_path / "l")
    assert locks.acquire(devices[0])
    locks.note(devices[0], training_note("same", 10))
    events: list[str] = []
    arbiter = LocalArbiter("chat", 10, DeviceLedger(devices, DeviceLocks(tmp_path / "l")), events.append)
    arbiter.update([H100])
    assert arbiter.asked == {} and events == [] and locks.asked(devices[0]) is None


def test_a_run_that_resumed_on_another_gpu_is_asked_again(tmp_path: Path) -> None:
    listing = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i}-0000-0000-0000-000000000000)\n"
                      for i in range(2))
    gpu0, gpu1 = parse_nvidia_smi_list(listing)
    training = DeviceLocks(tmp_path / "l")
    assert training.acquire(gpu0)
    training.note(gpu0, training_note("t", 0))
    events: list[str] = []
    ledger = DeviceLedger([gpu0, gpu1], DeviceLocks(tmp_path / "l"))
    arbiter = LocalArbiter("chat", 1, ledger, events.append)
    arbiter.update([H100])
    assert training.asked(gpu0) is not None and len(events) == 1
    training.release(gpu0)  # the run lets go of GPU 0 and resumes on GPU 1, which nobody asked for
    assert training.acquire(gpu1)
    training.note(gpu1, training_note("t", 0))
    assert [d.id for d in ledger.claim("primary-0", H100) or []] == ["0"]
    arbiter.update([H100])  # a second replica waits: GPU 1 is asked for now
    assert training.asked(gpu1) is not None and len(events) == 2 and "to let go of GPU 1" in events[1]



def test_ctrl_c_stops_the_workers_gracefully_before_the_gpus_are_let_go(tmp_path: Path) -> None:
    """Ctrl-C while training runs: the workers get the graceful stop (SIGTERM: checkpoint) and have exited before
    the command's `finally` lets go of the GPUs. The command runs in a process of its own, as `llmfleet train`
    does, with Python's SIGINT handler as a terminal starts it: a test run started in the background (`make test &`)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt for it."""
    up, out = tmp_path / "up", tmp_path / "trainer.txt"
    trainer = ("import signal, sys, time; from pathlib import Path; "
               f"signal.signal(signal.SIGTERM, lambda *a: (Path({str(out)!r}).write_text('checkpoint'), sys.exit(0))); "
               f"Path({str(up)!r}).touch(); time.sleep(120)")
    command = f"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from llmfleet.local import train_cli
from llmfleet.local.gpus import DeviceLedger, DeviceLocks, GpuRequest, parse_nvidia_smi_list
ledger = DeviceLedger(parse_nvidia_smi_list({NVIDIA_SMI_L!r}), DeviceLocks(Path({str(tmp_path / "l")!r})))
assert ledger.claim("job", GpuRequest(count=1, gpu_type="H100")) is not None
try:
    train_cli._run_yielding([sys.executable, "-c", {trainer!r}], dict(os.environ), ledger, "job", "H100", 0)
except KeyboardInterrupt:
    print("interrupted;", Path({str(out)!r}).read_text(), "written; GPUs held:", bool(ledger.held["job"]))
"""
    cli = subprocess.Popen([sys.executable, "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        _wait(lambda: up.exists() or cli.poll() is not None, what="the trainer is up, its SIGTERM handler installed")
        cli.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C
        said, _ = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert said.strip() == "interrupted; checkpoint written; GPUs held: True", said

