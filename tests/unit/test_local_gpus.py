"""`llmfleet up` gives each GPU replica devices of its own (llmfleet/local/gpus.py), from a stand-in nvidia-smi."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.api import InferenceService
from llmfleet.api.common import Resources
from llmfleet.local.actuator import LocalActuator
from llmfleet.local.gpus import (
    LOCK_DIR_ENV,
    Device,
    DeviceLocks,
    GpuListError,
    GpuRequest,
    device_env,
    list_devices,
    matches_type,
    parse_nvidia_smi_list,
    pick,
    visible,
)
from llmfleet.local.runtime import Supervisor

# Two H100s and an A100: GPU 1 is split into MIG instances, so it is not handed out whole.
NVIDIA_SMI_L = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5b1d0000-0000-0000-0000-000000000000)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-7f570000-0000-0000-0000-000000000001)
  MIG 3g.40gb     Device  0: (UUID: MIG-377e0049-554c-540b-93c6-d0976f8426cb)
  MIG 3g.40gb     Device  1: (UUID: MIG-f39aa248-6f1b-5769-b119-8d650bb34b27)
GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-8c7c0000-0000-0000-0000-000000000002)
"""


@pytest.fixture(autouse=True)
def _own_lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Device claims of each test in a folder of its own (the default is the machine's)."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))


def test_nvidia_smi_list_is_read_with_mig_instances_in_place_of_their_gpu() -> None:
    ds = parse_nvidia_smi_list(NVIDIA_SMI_L)
    assert [(d.id, d.gpu, d.mig) for d in ds] == [
        ("0", 0, None), ("MIG-377e0049-554c-540b-93c6-d0976f8426cb", 1, "3g.40gb"),
        ("MIG-f39aa248-6f1b-5769-b119-8d650bb34b27", 1, "3g.40gb"), ("2", 2, None)]
    assert ds[1].product == "NVIDIA H100 80GB HBM3" and ds[1].gpu_uuid.startswith("GPU-7f57")
    assert parse_nvidia_smi_list("") == []
    with pytest.raises(GpuListError, match="cannot read"):
        parse_nvidia_smi_list("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_gpu_type_matches_the_types_product_names_or_whole_words_of_an_unknown_type() -> None:
    assert matches_type("NVIDIA H100 80GB HBM3", "H100") and matches_type("NVIDIA H100 PCIe", "h100")
    assert matches_type("NVIDIA A100-SXM4-40GB", "A100") and matches_type("NVIDIA H200", None)
    assert matches_type("NVIDIA H200 NVL", "H200") and not matches_type("NVIDIA H200", "H100")
    assert not matches_type("NVIDIA H100 80GB HBM3", "H10") and not matches_type("NVIDIA GH200 480GB", "H200")
    assert matches_type("NVIDIA RTX 6000 Ada Generation", "RTX-6000") and not matches_type("NVIDIA RTX 6000", "RTX-60")


def test_pick_gives_free_devices_of_the_pools_kind_or_none() -> None:
    ds = parse_nvidia_smi_list(NVIDIA_SMI_L)
    ids = lambda got: None if got is None else [d.id for d in got]  # noqa: E731
    one = GpuRequest(count=1)
    assert ids(pick(ds, set(), one)) == ["0"]
    assert ids(pick(ds, {"0"}, one)) == ["2"]  # the MIG-partitioned GPU 1 is never whole
    assert ids(pick(ds, {"0", "2"}, one)) is None
    assert ids(pick(ds, set(), GpuRequest(count=1, gpu_type="A100"))) == ["2"]
    assert ids(pick(ds, set(), GpuRequest(count=2))) == ["0", "2"]
    assert ids(pick(ds, set(), GpuRequest(count=3))) is None
    mig = GpuRequest.of(Resources(gpus=1, gpuType="H100", migProfile="3g.40gb"))
    assert ids(pick(ds, set(), mig)) == ["MIG-377e0049-554c-540b-93c6-d0976f8426cb"]
    assert ids(pick(ds, {"MIG-377e0049-554c-540b-93c6-d0976f8426cb"}, mig)) == [
        "MIG-f39aa248-6f1b-5769-b119-8d650bb34b27"]
    assert ids(pick(ds, set(), GpuRequest(count=1, gpu_type="H100", mig="1g.10gb"))) is None
    assert ids(pick(ds, set(), GpuRequest(count=0))) == []
    assert GpuRequest(count=2, gpu_type="H100").describe() == "2 whole H100 GPUs"
    assert mig.describe() == "a MIG 3g.40gb instance of an H100 GPU"


def test_a_callers_cuda_visible_devices_limits_the_devices() -> None:
    ds = parse_nvidia_smi_list(NVIDIA_SMI_L)
    assert visible(ds, None) == ds
    assert [d.id for d in visible(ds, "2")] == ["2"]
    assert [d.id for d in visible(ds, "GPU-7f570000-0000-0000-0000-000000000001")] == [d.id for d in ds[1:3]]
    assert [d.id for d in visible(ds, "MIG-f39aa248-6f1b-5769-b119-8d650bb34b27, 0")] == [
        "0", "MIG-f39aa248-6f1b-5769-b119-8d650bb34b27"]
    assert visible(ds, "") == [] and visible(ds, "-1") == []
    assert device_env([ds[0], ds[3]]) == {"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _fake_nvidia_smi(bin_dir: Path, text: str, code: int = 0, apps: str = "") -> Path:
    """A stand-in nvidia-smi: `-L` prints `text`, `--query-compute-apps=...` prints `apps` (rewrite
    bin_dir/apps.txt to change it); both exit `code`. Every call is appended to bin_dir/calls.txt."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "listing.txt").write_text(text)
    (bin_dir / "apps.txt").write_text(apps)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho \"$1\" >> '{bin_dir / 'calls.txt'}'\n"
                   f"case \"$1\" in --query-compute-apps*) cat '{bin_dir / 'apps.txt'}' ;; *) cat '{bin_dir / 'listing.txt'}' ;; "
                   f"esac\nexit {code}\n")
    smi.chmod(0o755)
    return smi


def test_list_devices_runs_nvidia_smi_and_reports_its_failure(tmp_path: Path) -> None:
    smi = _fake_nvidia_smi(tmp_path / "ok", NVIDIA_SMI_L)
    assert len(list_devices(str(smi))) == 4
    broken = _fake_nvidia_smi(tmp_path / "broken", "No devices were found\n", code=6)
    with pytest.raises(GpuListError, match="exited 6: No devices were found"):
        list_devices(str(broken))


class EnvEchoSupervisor(Supervisor):
    """Replicas that print the devices they were shown, then sleep until stopped."""

    def replica_command(self, r: Any) -> list[str]:
        return [sys.executable, "-c", "import os, signal, sys, time; e = os.environ.get; "
                "print('CVD=' + e('CUDA_VISIBLE_DEVICES', 'unset') + ' ORDER=' + e('CUDA_DEVICE_ORDER', 'unset'), "
                "flush=True); signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(120)"]

    def start_router(self) -> None:
        self.router = None


def _service(**spec: Any) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "gpus"},
        "spec": {"model": {"path": "/m"}, "replicas": 3, "maxReplicas": 3, "drainSeconds": 1,
                 "resources": {"gpus": 1, "gpuType": "H100"},
                 "fallback": {"pools": [{"name": "student", "model": {"path": "/s"}, "replicas": 1, "maxReplicas": 2,
                                         "resources": {"gpus": 1, "gpuType": "H100", "migProfile": "3g.40gb"}}]},
                 **spec},
    })


def _dashboard(sup: Supervisor) -> str:
    from rich.console import Console

    from llmfleet.local.dashboard import render

    console = Console(width=400, record=True, color_system=None)
    console.print(render(sup.state(), None))
    return console.export_text()


def _shown(r: Any, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [ln for ln in Path(r.log).read_text().splitlines() if ln.startswith("CVD=")]
        if lines:
            return lines[-1]
        time.sleep(0.05)
    raise TimeoutError(r.log)


@pytest.mark.timeout(90)
async def test_each_replica_gets_its_own_device_and_one_without_a_free_device_waits(tmp_path: Path) -> None:
    """Three H100 replicas on a machine with one whole H100 free (and an A100): one starts on GPU 0, two wait as
    replicas that are not ready (the autoscaler sees them as Pending pods); the MIG student gets an instance of its
    own; a stopped replica's GPU goes to a waiting one."""
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, NVIDIA_SMI_L)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    sup = EnvEchoSupervisor(_service(), tmp_path / "run", prometheus=False, env=env)
    try:
        sup.start()
        primary, student = sup.slots["primary"], sup.slots["student"]
        assert _shown(primary[0]) == "CVD=0 ORDER=PCI_BUS_ID" and primary[0].devices == ["0"]
        assert _shown(student[0]) == "CVD=MIG-377e0049-554c-540b-93c6-d0976f8426cb ORDER=PCI_BUS_ID"
        assert [r.proc is None for r in primary] == [False, True, True]
        assert primary[1].waiting_for == "no free device: primary asks for 1 whole H100 GPU"
        waits = [m for _, m in sup.events if "waits" in m]
        assert len(waits) == 2 and waits[0].endswith("(held: primary-0: 0; claimed by other llmfleet processes: none)")
        sup.reconcile()
        assert len([m for _, m in sup.events if "waits" in m]) == 2  # said once per wait, not every tick
        listed = await LocalActuator(sup).list_replicas("primary")
        assert [(r.name, r.ready) for r in listed] == [("primary-0", False), ("primary-1", False), ("primary-2", False)]
        assert sup.state()["replicas"][1]["waiting_for"] is not None
        shown = _dashboard(sup)
        assert "GPU 0" in shown and "GPU MIG-377e" in shown and "waits for a GPU" in shown

        # The second MIG instance goes to a second student replica.
        sup.desired["student"] = 2
        sup.reconcile()
        assert _shown(student[1]) == "CVD=MIG-f39aa248-6f1b-5769-b119-8d650bb34b27 ORDER=PCI_BUS_ID"

        # primary-0 stops: its GPU goes to the first waiting replica at the next reconcile.
        victim = primary[0]
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(timeout=10)
        victim.wanted = False
        sup.desired["primary"] = 2
        sup.reconcile()
        assert victim.devices == [] and victim.waiting_for is None
        assert primary[1].devices == ["0"] and _shown(primary[1]) == "CVD=0 ORDER=PCI_BUS_ID"
        assert primary[2].proc is None and primary[2].waiting_for is not None
        assert not sup.devices_free_for("primary") and not sup.devices_free_for("student")
    finally:
        await sup.stop(grace_s=0)
    assert all(r.devices == [] and r.waiting_for is None for r in sup.replicas())


async def test_a_callers_cuda_visible_devices_and_machines_without_nvidia_smi(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, NVIDIA_SMI_L)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    only_a100 = EnvEchoSupervisor(_service(resources={"gpus": 1}), tmp_path / "a", prometheus=False,
                                  env={"PATH": path, "CUDA_VISIBLE_DEVICES": "2"})
    assert [d.id for d in only_a100.gpus.devices or []] == ["2"]
    assert only_a100.devices_free_for("primary") and not only_a100.devices_free_for("student")

    # No nvidia-smi: replicas keep the environment as it is (one event says so); CPU-only services never ask.
    bare = EnvEchoSupervisor(_service(), tmp_path / "b", prometheus=False, env={"PATH": str(tmp_path / "empty")})
    assert bare.gpus.devices is None and any("no nvidia-smi" in m for _, m in bare.events)
    assert bare.devices_free_for("primary")
    cpu = EnvEchoSupervisor(_service(resources={"gpus": 0}, fallback={"pools": []}), tmp_path / "c", prometheus=False,
                            env={"PATH": path})
    assert cpu.gpus.devices is None and not cpu.events

    # nvidia-smi that fails: no device is handed out, GPU replicas wait.
    _fake_nvidia_smi(tmp_path / "broken", "No devices were found\n", code=6)
    broken = EnvEchoSupervisor(_service(), tmp_path / "d", prometheus=False,
                               env={"PATH": f"{tmp_path / 'broken'}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert broken.gpus.devices == [] and any("GPUs not listed" in m for _, m in broken.events)
    assert not broken.devices_free_for("primary")


def test_device_ids_are_what_cuda_visible_devices_takes() -> None:
    d = Device(id="MIG-x", gpu=0, gpu_uuid="GPU-y", product="NVIDIA H200", mig="3g.71gb")
    assert device_env([d])["CUDA_VISIBLE_DEVICES"] == "MIG-x"


def test_device_locks_hold_across_holders_and_die_with_their_process(tmp_path: Path) -> None:
    gpu = parse_nvidia_smi_list(NVIDIA_SMI_L)[0]
    a, b = DeviceLocks(tmp_path / "l"), DeviceLocks(tmp_path / "l")
    assert a.acquire(gpu) and not a.acquire(gpu) and not b.acquire(gpu) and not b.free(gpu)
    a.release(gpu)
    assert b.free(gpu) and b.free(gpu) and b.acquire(gpu)  # free() claims nothing
    b.release_all()
    # A process that holds a claim and dies (SIGKILL: no clean-up) lets go of it.
    code = ("import sys, time; from pathlib import Path; from llmfleet.local.gpus import DeviceLocks, parse_nvidia_smi_list; "
            f"d = parse_nvidia_smi_list({NVIDIA_SMI_L!r})[0]; assert DeviceLocks(Path(sys.argv[1])).acquire(d); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "l")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert not a.free(gpu)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert a.acquire(gpu)


def test_claim_note_and_request_files_are_open_to_every_users_runs(tmp_path: Path) -> None:
    """Runs of several users share the claims folder: its files are created readable and writable by all whatever
    the umask (a file another user made in the sticky folder can only be rewritten, not replaced), and a note
    rewrites what a process that died left in its place."""
    import json
    import stat

    gpu, other = parse_nvidia_smi_list(NVIDIA_SMI_L)[0], parse_nvidia_smi_list(NVIDIA_SMI_L)[3]
    root = tmp_path / "l"
    root.mkdir()
    (root / f"{gpu.uuid}.holder.json").write_text(json.dumps({"name": "a run that died without its clean-up", "pid": 1}))
    a = DeviceLocks(root)
    old = os.umask(0o077)
    try:
        assert a.acquire(gpu) and a.ask(other, "an InferenceService")
        a.note(gpu, {"name": "distill"})
        for name in (f"{gpu.uuid}.lock", f"{other.uuid}.yield", f"{gpu.uuid}.holder.json"):
            assert stat.S_IMODE((root / name).stat().st_mode) == 0o666, name
        assert json.loads((root / f"{gpu.uuid}.holder.json").read_text()) == {"name": "distill", "pid": os.getpid()}
        assert stat.S_IMODE(root.stat().st_mode) == 0o1777
    finally:
        os.umask(old)
        a.release_all()


@pytest.mark.timeout(90)
async def test_two_runs_on_one_machine_never_share_a_gpu(tmp_path: Path) -> None:
    """Two `llmfleet up`s (two supervisors, one machine-wide claim folder): the second run's replica waits for the
    one whole H100 the first holds, names the claim, and gets the GPU once the first run stops."""
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, NVIDIA_SMI_L)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    one_h100 = {"replicas": 1, "maxReplicas": 1, "fallback": {"pools": []}}
    first = EnvEchoSupervisor(_service(**one_h100), tmp_path / "first", prometheus=False, env=env)
    second = EnvEchoSupervisor(_service(**one_h100), tmp_path / "second", prometheus=False, env=env)
    try:
        first.start()
        assert _shown(first.slots["primary"][0]) == "CVD=0 ORDER=PCI_BUS_ID"
        second.start()
        waiting = second.slots["primary"][0]
        assert waiting.proc is None and not second.devices_free_for("primary")
        assert any("claimed by other llmfleet processes: 0" in m for _, m in second.events)
        await first.stop(grace_s=0)
        second.reconcile()
        assert _shown(waiting) == "CVD=0 ORDER=PCI_BUS_ID" and waiting.devices == ["0"]
    finally:
        await first.stop(grace_s=0)
        await second.stop(grace_s=0)


def test_a_gpu_another_program_computes_on_is_not_given_out(tmp_path: Path) -> None:
    """A whole GPU that no llmfleet process claimed but a notebook computes on: vLLM there would find its memory
    taken, so a claim skips it (the next GPU of the kind, or a wait that names the pid); the answer is asked again
    only after BUSY_TTL_S."""
    from llmfleet.local.gpus import BUSY_TTL_S, DeviceLedger, compute_apps

    two_h100 = NVIDIA_SMI_L.replace("GPU 2: NVIDIA A100-SXM4-40GB", "GPU 2: NVIDIA H100 80GB HBM3")
    smi = _fake_nvidia_smi(tmp_path / "bin", two_h100, apps="GPU-5b1d0000-0000-0000-0000-000000000000, 4242\n")
    assert compute_apps(str(smi)) == {"GPU-5b1d0000-0000-0000-0000-000000000000": [4242]}
    now = [0.0]
    ledger = DeviceLedger(parse_nvidia_smi_list(two_h100), DeviceLocks(tmp_path / "locks"), nvidia_smi=str(smi),
                          clock=lambda: now[0])
    h100 = GpuRequest(count=1, gpu_type="H100")
    got = ledger.claim("a", h100)
    assert got is not None and [d.id for d in got] == ["2"]  # GPU 0 is computed on
    assert ledger.claim("b", h100) is None and not ledger.free_for(h100)
    assert ledger.holders().endswith("in use by other programs: 0 (pid 4242)")
    (tmp_path / "bin" / "apps.txt").write_text("")  # the notebook exits
    assert ledger.claim("b", h100) is None  # the last answer still stands ...
    now[0] += BUSY_TTL_S + 1
    got = ledger.claim("b", h100)
    assert got is not None and [d.id for d in got] == ["0"]  # ... until it is asked again
    queries = [c for c in (tmp_path / "bin" / "calls.txt").read_text().split() if c.startswith("--query")]
    assert len(queries) == 3  # compute_apps above, then the ledger twice
    # A MIG instance is not checked (nvidia-smi names its processes by the parent GPU), nor without nvidia-smi.
    blind = DeviceLedger(parse_nvidia_smi_list(two_h100), DeviceLocks(tmp_path / "other"))
    assert [d.id for d in blind.claim("a", h100) or []] == ["0"]


def test_llmfleet_up_stops_at_once_on_a_gpu_no_device_here_could_fit(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of a GPU type, MIG profile or count this machine does not have would wait for good: `llmfleet up`
    says so in one line (the field, what it asks, the devices here) and exits 2."""
    from typer.testing import CliRunner

    from llmfleet.cli.main import app
    from llmfleet.local.gpus import device_kind_problems

    _fake_nvidia_smi(tmp_path / "bin", NVIDIA_SMI_L)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    devices = parse_nvidia_smi_list(NVIDIA_SMI_L)
    assert device_kind_problems(devices, _service().pools()) == []  # an H100 whole, a 3g.40gb instance: both here
    assert device_kind_problems(None, _service(resources={"gpus": 1, "gpuType": "H200"}).pools()) == []
    manifest = tmp_path / "isvc.yaml"
    (tmp_path / "model").mkdir()
    h200 = _service(model={"path": str(tmp_path / "model")}, resources={"gpus": 1, "gpuType": "H200"},
                    fallback={"pools": []})
    manifest.write_text(yaml.safe_dump(h200.to_wire()))
    result = CliRunner().invoke(app, ["up", "-f", str(manifest), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "llmfleet up: spec.resources: a replica asks for 1 whole H200 GPU, and this machine has no such device "
        "(devices: 0 (NVIDIA H100 80GB HBM3), MIG-377e0049-554c-540b-93c6-d0976f8426cb (NVIDIA H100 80GB HBM3 MIG "
        "3g.40gb), MIG-f39aa248-6f1b-5769-b119-8d650bb34b27 (NVIDIA H100 80GB HBM3 MIG 3g.40gb), 2 (NVIDIA "
        "A100-SXM4-40GB))")
    two = _service(resources={"gpus": 2, "gpuType": "H100"}, vllm={"tensorParallelSize": 2})
    assert "asks for 2 whole H100 GPUs" in device_kind_problems(devices, two.pools())[0]
    mig = _service(fallback={"pools": [{"name": "student", "model": {"path": "/s"}, "maxReplicas": 1,
                                        "resources": {"gpus": 1, "gpuType": "H100", "migProfile": "1g.10gb"}}]})
    assert device_kind_problems(devices, mig.pools())[0].startswith("spec.fallback.pools[name=student].resources: a replica "
                                                                     "asks for a MIG 1g.10gb instance")


def test_llmfleet_up_lists_the_devices_once_and_hands_them_to_its_supervisor(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The device-type check before start lists the machine's devices; the foreground supervisor takes that
    listing instead of running `nvidia-smi -L` a second time."""
    from typer.testing import CliRunner

    import llmfleet.local.foreground as foreground
    from llmfleet.cli.main import app

    _fake_nvidia_smi(tmp_path / "bin", NVIDIA_SMI_L)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "model").mkdir()
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(yaml.safe_dump(_service(model={"path": str(tmp_path / "model")},
                                                resources={"gpus": 1, "gpuType": "H100"}, fallback={"pools": []}).to_wire()))
    built: list[Supervisor] = []

    def fake_run(isvc: InferenceService, run_dir: Path, *args: Any, ledger: Any = None, **kw: Any) -> int:
        built.append(Supervisor(isvc, run_dir, ledger=ledger))
        return 0

    monkeypatch.setattr(foreground, "run_foreground", fake_run)
    result = CliRunner().invoke(app, ["up", "-f", str(manifest), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bin" / "calls.txt").read_text().split() == ["-L"]
    assert built and [d.id for d in built[0].gpus.devices or []] == ["0", "MIG-377e0049-554c-540b-93c6-d0976f8426cb",
                                                                       "MIG-f39aa248-6f1b-5769-b119-8d650bb34b27", "2"]
