"""GPUs for the replicas of `llmfleet up`: the devices this machine has, and which replica holds which.

In a cluster a pod asks the NVIDIA device plugin for `nvidia.com/gpu: N` or one `nvidia.com/mig-<profile>` and sees
only what it was given. On one machine every process sees every GPU, so replicas of `gpus: 1` would all start on
CUDA device 0 (vLLM takes 90 % of its memory: the second replica fails). The supervisor plays the device plugin:
it lists the devices with `nvidia-smi -L`, gives each replica its own through CUDA_VISIBLE_DEVICES, and a replica
that no free device fits waits, as a Pending pod does, until a stopped replica releases one.

Whole GPUs are named by index with CUDA_DEVICE_ORDER=PCI_BUS_ID, the order nvidia-smi numbers them in (CUDA's default
order, fastest first, can differ on a mixed machine). MIG instances can only be named by UUID (`MIG-...`); a GPU
with MIG instances is not handed out whole. A CUDA_VISIBLE_DEVICES the caller set limits the devices to those it
lists (indices or UUIDs), as a shared machine's scheduler would. Devices given out are also claimed machine-wide
(`DeviceLocks`), so several `llmfleet up`s and `llmfleet train` on one machine share its GPUs without collisions.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmfleet.api.common import Resources
from llmfleet.api.inferenceservice import PoolView
from llmfleet.local.run_state import pid_alive
from llmfleet.plan.hardware import gpu_products

LOCK_DIR_ENV = "LLMFLEET_DEVICE_LOCKS"
NVIDIA_SMI_TIMEOUT_S = 15.0  # nvidia-smi answers in well under a second; a hung driver must not hang `llmfleet up`
BUSY_TTL_S = 5.0  # how long one `nvidia-smi --query-compute-apps` answer stands for
SHARED_MODE = 0o666  # claim, note and request files: every user's runs on the machine open and rewrite them
_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<product>.+?) \(UUID: (?P<uuid>[^)]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>[^)]+)\)\s*$")


class GpuListError(RuntimeError):
    """nvidia-smi is there but could not list the devices (no driver, timed out, output it cannot read)."""


@dataclass(frozen=True)
class Device:
    """One device a replica can be given: a whole GPU or one MIG instance of it."""

    id: str  # what CUDA_VISIBLE_DEVICES takes: the GPU's index, or the MIG instance's UUID
    gpu: int  # the physical GPU's index
    gpu_uuid: str
    product: str  # e.g. "NVIDIA H200"
    mig: str | None = None  # the MIG profile, e.g. "3g.71gb"; None for a whole GPU

    @property
    def uuid(self) -> str:
        """The device's machine-wide name: the MIG instance's UUID, or the GPU's."""
        return self.id if self.mig else self.gpu_uuid

    def __str__(self) -> str:
        return f"{self.id} ({self.product}{' MIG ' + self.mig if self.mig else ''})"


@dataclass(frozen=True)
class GpuRequest:
    """What one replica of a pool asks for: `count` whole GPUs, or one MIG instance of profile `mig`."""

    count: int
    gpu_type: str | None = None
    mig: str | None = None

    @classmethod
    def of(cls, resources: Resources) -> GpuRequest:
        return cls(count=resources.gpus, gpu_type=resources.gpu_type, mig=resources.mig_profile)

    def describe(self) -> str:
        of = f" {self.gpu_type}" if self.gpu_type else ""
        if self.mig:
            return f"a MIG {self.mig} instance of an{of} GPU"
        return f"{self.count} whole{of} GPU{'s' if self.count != 1 else ''}"


def parse_nvidia_smi_list(text: str) -> list[Device]:
    """The devices in `nvidia-smi -L` output: each GPU line, and the MIG lines under it. A GPU that has MIG
    instances is listed by its instances only (it cannot also be used whole)."""
    devices: list[Device] = []
    gpu: Device | None = None
    migs: list[Device] = []

    def flush() -> None:
        if gpu is not None:
            devices.extend(migs or [gpu])

    for line in text.splitlines():
        if m := _GPU_LINE.match(line):
            flush()
            index = int(m["index"])
            gpu, migs = Device(id=str(index), gpu=index, gpu_uuid=m["uuid"], product=m["product"].strip()), []
        elif (m := _MIG_LINE.match(line)) and gpu is not None:
            migs.append(Device(id=m["uuid"], gpu=gpu.gpu, gpu_uuid=gpu.gpu_uuid, product=gpu.product, mig=m["profile"]))
        elif line.strip():
            raise GpuListError(f"cannot read this line of `nvidia-smi -L`: {line.strip()!r}")
    flush()
    return devices


def list_devices(nvidia_smi: str, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> list[Device]:
    """This machine's devices, from `nvidia-smi -L` (the binary at `nvidia_smi`)."""
    try:
        out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GpuListError(f"`{nvidia_smi} -L` failed: {err}") from err
    if out.returncode != 0:
        said = (out.stdout + out.stderr).strip().splitlines()
        raise GpuListError(f"`{nvidia_smi} -L` exited {out.returncode}: {said[0] if said else 'no output'}")
    return parse_nvidia_smi_list(out.stdout)


def visible(devices: Iterable[Device], cuda_visible_devices: str | None) -> list[Device]:
    """The devices a CUDA_VISIBLE_DEVICES the caller set leaves (all of them when it is unset). Entries are GPU
    indices, GPU UUIDs or MIG UUIDs; a GPU's index or UUID admits its MIG instances too."""
    devices = list(devices)
    if cuda_visible_devices is None:
        return devices
    entries = {e.strip() for e in cuda_visible_devices.split(",") if e.strip()}
    return [d for d in devices if entries & {d.id, str(d.gpu), d.gpu_uuid}]


def _tokens(s: str) -> list[str]:
    return [t for t in re.split(r"[\s_-]+", s.upper()) if t]


def matches_type(product: str, gpu_type: str | None) -> bool:
    """Whether a GPU's product name is of `gpu_type`: one of the type's product names (plan.hardware.GPU_PRODUCTS,
    which the operator's node affinity also uses), or, for a type outside that table, a name holding the type's
    words in a row ("RTX 6000" is "NVIDIA RTX 6000 Ada Generation", "H10" is not "NVIDIA H100 PCIe")."""
    if not gpu_type:
        return True
    if (known := gpu_products(gpu_type)) is not None:
        return product.upper() in {k.upper() for k in known}
    want, have = _tokens(gpu_type), _tokens(product)
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def pick(devices: Iterable[Device], held: Collection[str], want: GpuRequest,
         lock: Callable[[Device], bool] | None = None) -> list[Device] | None:
    """The devices a replica asking `want` gets: the first free ones of its kind in nvidia-smi's order (not in
    `held`, and, with `lock`, claimed by it), or None when too few are free (the replica waits; what `lock`
    claimed is then for the caller to release)."""
    if want.count <= 0:
        return []
    n = 1 if want.mig else want.count
    got: list[Device] = []
    for d in devices:
        if len(got) == n:
            break
        if d.id not in held and d.mig == want.mig and matches_type(d.product, want.gpu_type) and (lock is None or lock(d)):
            got.append(d)
    return got if len(got) == n else None


def default_lock_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the machine's device claims live: `env`'s LLMFLEET_DEVICE_LOCKS, else <tmp>/llmfleet-devices."""
    return Path(env.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "llmfleet-devices")


class DeviceLocks:
    """Claims on devices that hold across processes on one machine: one lock file per device (its UUID), locked
    (flock) by the process that gave the device out, for as long as it is given out. Two `llmfleet up`s, or an
    `up` and a `llmfleet train`, then never give out one GPU twice; a process that dies, however it dies, lets go
    of its claims with it (the kernel drops its locks). The files stay: an unlocked file claims nothing.

    Beside a claim: a note saying what holds it (`<uuid>.holder.json`, written by `llmfleet train`), and a request
    that the holder let go (`<uuid>.yield`, locked by the process that asks for as long as it asks: local GPU
    arbitration, gpu_arbitration.py). A device another process asks for is claimed by no one else meanwhile."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_lock_dir()
        self._fds: dict[str, int] = {}
        self._asks: dict[str, int] = {}  # device UUID -> the locked .yield file of this process's request
        self._notes: set[str] = set()

    def _open(self, name: str, flags: int) -> int | None:
        """The folder's file `name`, created readable and writable by every user (SHARED_MODE): the runs of
        several users on one machine claim, note and ask through the same files, and a file another user created
        in the sticky folder cannot be replaced, only rewritten."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(PermissionError):  # another user's folder: theirs to open to all
                self.root.chmod(0o1777)
            fd = os.open(self.root / name, flags, SHARED_MODE)
        except OSError:
            return None
        with contextlib.suppress(PermissionError):  # the umask narrowed it; only the file's owner can widen it
            os.fchmod(fd, SHARED_MODE)
        return fd

    @staticmethod
    def _lock(fd: int, how: int) -> bool:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def _open_locked(self, name: str, flags: int) -> int | None:
        """A descriptor of the folder's file `name`, exclusively locked by it; None when another holds the lock."""
        fd = self._open(name, flags)
        if fd is None:
            return None
        if not self._lock(fd, fcntl.LOCK_EX):
            os.close(fd)
            return None
        return fd

    def acquire(self, d: Device) -> bool:
        """Claim `d` (True), or False when another process (or another claim of this one) holds it."""
        if d.uuid in self._fds:
            return False
        # Read-only suffices for flock, so another user can open a file this one created.
        fd = self._open_locked(f"{d.uuid}.lock", os.O_RDONLY | os.O_CREAT)
        if fd is None:
            return False
        self._fds[d.uuid] = fd
        return True

    def release(self, d: Device) -> None:
        self._release(d.uuid)

    def _release(self, uuid: str) -> None:
        if uuid in self._notes:  # the note goes first: a note never outlives its claim
            self._notes.discard(uuid)
            with contextlib.suppress(OSError):
                (self.root / f"{uuid}.holder.json").unlink()
        fd = self._fds.pop(uuid, None)
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the file's open description drops the lock

    def release_all(self) -> None:
        for uuid in list(self._fds):
            self._release(uuid)
        self.withdraw_all()

    def free(self, d: Device) -> bool:
        """Whether `d` could be claimed now (claimed and let go at once)."""
        if not self.acquire(d):
            return False
        self.release(d)
        return True

    def note(self, d: Device, what: dict[str, object]) -> None:
        """Say what holds claimed `d` (with this process's pid), for other processes' arbitration."""
        if d.uuid in self._fds:
            fd = self._open(f"{d.uuid}.holder.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            if fd is None:
                return
            try:
                with contextlib.suppress(OSError):
                    os.write(fd, json.dumps({**what, "pid": os.getpid()}).encode())
                    self._notes.add(d.uuid)
            finally:
                os.close(fd)

    def holder_note(self, d: Device) -> dict[str, object] | None:
        """The note of another process's claim of `d`, or None: unclaimed, no note, or its process is gone."""
        if d.uuid in self._fds or self.free(d):
            return None
        try:
            note = json.loads((self.root / f"{d.uuid}.holder.json").read_text())
        except (OSError, ValueError):
            return None
        pid = note.get("pid") if isinstance(note, dict) else None
        return note if isinstance(pid, int) and pid_alive(pid) else None

    def ask(self, d: Device, by: str) -> bool:
        """Ask the holder of `d` to let go of it, for `by` (who asks, in words); True while this process asks
        (False: another process asks already, or the request cannot be written)."""
        if d.uuid in self._asks:
            return True
        fd = self._open_locked(f"{d.uuid}.yield", os.O_RDWR | os.O_CREAT)
        if fd is None:
            return False
        os.ftruncate(fd, 0)
        os.write(fd, by.encode()[:400])
        self._asks[d.uuid] = fd
        return True

    def withdraw_all(self) -> list[str]:
        """Withdraw this process's requests; the UUIDs they were for."""
        uuids = list(self._asks)
        for fd in self._asks.values():
            os.close(fd)
        self._asks.clear()
        return uuids

    def asked(self, d: Device) -> str | None:
        """Who asks (another process) that `d` be let go, in its words; None when no other process asks."""
        if d.uuid in self._asks:
            return None
        try:
            fd = os.open(self.root / f"{d.uuid}.yield", os.O_RDONLY)
        except OSError:
            return None
        try:
            if self._lock(fd, fcntl.LOCK_SH):
                return None  # nobody holds the request's lock: it was withdrawn (or its process is gone)
            return os.read(fd, 400).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)


def device_env(devices: Iterable[Device]) -> dict[str, str]:
    """The environment that shows a replica exactly `devices`."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(d.id for d in devices), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def device_kind_problems(devices: list[Device] | None, pools: Iterable[PoolView]) -> list[str]:
    """The GPU pools whose replica no device of this machine could ever fit (its GPU type, MIG profile or count is
    not here): `llmfleet up` stops on them at once rather than leave replicas waiting for good. None: devices are
    not counted (no nvidia-smi), nothing to say."""
    if devices is None:
        return []
    problems = []
    for pool in pools:
        want = GpuRequest.of(pool.resources)
        if want.count > 0 and pick(devices, (), want) is None:
            have = ", ".join(map(str, devices)) or "none"
            problems.append(f"{pool.field_path}.resources: a replica asks for {want.describe()}, and this machine has "
                            f"no such device (devices: {have})")
    return problems


def compute_apps(nvidia_smi: str, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> dict[str, list[int]]:
    """GPU UUID -> the pids of the compute processes on it (`nvidia-smi --query-compute-apps=gpu_uuid,pid`); {}
    when nvidia-smi cannot say, so that no device is held back on a guess."""
    try:
        out = subprocess.run([nvidia_smi, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    apps: dict[str, list[int]] = {}
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        uuid, _, pid = (x.strip() for x in line.partition(","))
        if uuid.startswith("GPU-") and pid.isdigit():
            apps.setdefault(uuid, []).append(int(pid))
    return apps


def machine_ledger(env: Mapping[str, str]) -> tuple[DeviceLedger, str]:
    """The ledger of the devices a process with environment `env` may give out, and what to tell the user about
    them. Its devices are None without nvidia-smi on the PATH (not counted: replicas get the environment as it is),
    [] when nvidia-smi fails (GPU replicas wait). Claims go to `$LLMFLEET_DEVICE_LOCKS` (DeviceLocks)."""
    locks = DeviceLocks(default_lock_dir(env))
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return DeviceLedger(None, locks), ("no nvidia-smi on PATH: GPU replicas are not given devices of their own "
                                           "(each sees CUDA_VISIBLE_DEVICES as set)")
    try:
        found = visible(list_devices(smi), env.get("CUDA_VISIBLE_DEVICES"))
    except GpuListError as err:
        return DeviceLedger([], locks), f"GPUs not listed ({err}): GPU replicas wait for a device"
    return DeviceLedger(found, locks, nvidia_smi=smi), f"devices: {', '.join(map(str, found)) or 'none'}"


class DeviceLedger:
    """Which of one run's holders (replicas, by name) holds which devices; each device given out is also claimed
    machine-wide (DeviceLocks). `devices` None: devices are not counted, every claim succeeds with none.

    With `nvidia_smi`, a whole GPU that another program computes on (a notebook, a process not llmfleet's: it holds
    no claim) is not given out either: vLLM there would find its memory taken. Asked at most every BUSY_TTL_S
    seconds, and only when a claim gets that far. MIG instances are not checked: nvidia-smi names their processes
    by the parent GPU."""

    def __init__(self, devices: list[Device] | None, locks: DeviceLocks, nvidia_smi: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.devices = devices
        self.locks = locks
        self.held: dict[str, list[Device]] = {}
        self._smi, self._clock = nvidia_smi, clock
        self._apps: tuple[float, dict[str, list[int]]] | None = None

    def _taken(self) -> set[str]:
        return {d.id for ds in self.held.values() for d in ds}

    def _foreign(self, d: Device) -> list[int]:
        """The pids computing on whole GPU `d` (none for a MIG instance, or without nvidia-smi)."""
        if self._smi is None or d.mig is not None:
            return []
        now = self._clock()
        if self._apps is None or now - self._apps[0] > BUSY_TTL_S:
            self._apps = (now, compute_apps(self._smi))
        return self._apps[1].get(d.gpu_uuid, [])

    def claim(self, holder: str, want: GpuRequest) -> list[Device] | None:
        """Devices for `holder`, or None when too few are free (nothing stays claimed then)."""
        if self.devices is None or want.count <= 0:
            return []
        claimed: list[Device] = []

        def lock(d: Device) -> bool:
            if ok := self.locks.acquire(d):
                # claimed by no one, but computed on, or kept for another process that asked for it: not free
                if self._foreign(d) or self.locks.asked(d) is not None:
                    self.locks.release(d)
                    return False
                claimed.append(d)
            return ok

        got = pick(self.devices, self._taken(), want, lock=lock)
        if got is None:
            for d in claimed:
                self.locks.release(d)
            return None
        self.held[holder] = got
        return got

    def release(self, holder: str) -> None:
        """Let go of `holder`'s devices (its process has exited): the next claim asks nvidia-smi afresh, as the
        last answer may still show that process on them."""
        for d in self.held.pop(holder, []):
            self.locks.release(d)
            self._apps = None

    def release_all(self) -> None:
        for holder in list(self.held):
            self.release(holder)

    def free_for(self, want: GpuRequest) -> bool:
        """Whether a claim of `want` would succeed now."""
        if self.devices is None:
            return True
        return pick(self.devices, self._taken(), want,
                    lock=lambda d: self.locks.free(d) and not self._foreign(d) and self.locks.asked(d) is None) is not None

    def asked_of(self, holder: str) -> str | None:
        """Who asks (another process) that one of `holder`'s devices be let go, in its words; None if no one."""
        return next((who for d in self.held.get(holder, []) if (who := self.locks.asked(d)) is not None), None)

    def holders(self) -> str:
        """Who holds what, for a waiting replica's event: this run's holders, other llmfleet processes' claims,
        and GPUs other programs compute on."""
        mine = ", ".join(f"{h}: {','.join(d.id for d in ds)}" for h, ds in self.held.items())
        taken = self._taken()
        elsewhere = [d for d in self.devices or [] if d.id not in taken and not self.locks.free(d)]
        named = [d.id + (f" ({note.get('kind')} {note.get('job')}, pid {note.get('pid')})"
                         if (note := self.locks.holder_note(d)) else "") for d in elsewhere]
        others = [f"{d.id} (pid {','.join(map(str, pids))})" for d in self.devices or []
                  if d.id not in taken and d not in elsewhere and (pids := self._foreign(d))]
        said = f"held: {mine or 'none'}; claimed by other llmfleet processes: {','.join(named) or 'none'}"
        return said + (f"; in use by other programs: {', '.join(others)}" if others else "")
