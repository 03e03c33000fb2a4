#!/usr/bin/env python3
"""The Debian packages `make test` needs for its test tiers: find the missing ones and install them when allowed.

Run by `make test` (target `system-deps`) before anything else, so `make test` on a fresh machine and CI
(`.ci/run`, which only calls `make test`) run the same suite. Standard library only: it runs with the system
Python before .venv exists.

Installs with apt-get as root, or through passwordless sudo; otherwise prints one line naming the tiers that
will be skipped and the command that enables them, and `make test` goes on. SYSTEM_DEPS=skip never installs
(the same line); SYSTEM_DEPS=require (CI) fails when a package is missing and cannot be installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("install", "skip", "require")


@dataclass(frozen=True)
class Tier:
    """A test tier that needs host commands, and the Debian packages that provide them."""

    name: str
    commands: tuple[str, ...]
    packages: tuple[str, ...]
    extra_paths: tuple[str, ...] = ()  # globs where the command also counts as present (not on PATH)
    satisfied_by: tuple[str, ...] = ()  # files (relative to the repository) that make the tier's commands moot


TIERS: tuple[Tier, ...] = (
    # Debian puts initdb/pg_ctl under /usr/lib/postgresql/<version>/bin, off PATH (llmfleet.store.pgtemp looks there).
    Tier("PostgreSQL", ("initdb",), ("postgresql",), extra_paths=("/usr/lib/postgresql/*/bin/initdb",)),
    Tier("Prometheus", ("prometheus",), ("prometheus",)),
    Tier("shellcheck", ("shellcheck",), ("shellcheck",)),
    # npm and unzip fetch helm (mk/chart.mk); once .tools/bin/helm exists they are not needed.
    Tier("Helm chart", ("npm", "unzip"), ("npm", "unzip"), satisfied_by=(".tools/bin/helm",)),
)


@dataclass(frozen=True)
class Host:
    """What the plan depends on, gathered once (tests build it by hand)."""

    present: frozenset[str]  # commands found (on PATH or in a tier's extra_paths)
    files: frozenset[str]  # the tiers' satisfied_by files that exist
    root: bool
    passwordless_sudo: bool
    apt: bool


@dataclass(frozen=True)
class Plan:
    """What to do: `commands` to run in order (empty: nothing to install), or a `message` (skip or fail)."""

    missing: tuple[Tier, ...]
    commands: tuple[tuple[str, ...], ...] = ()
    message: str = ""
    fail: bool = False  # missing and not installable in require mode: stop `make test`
    strict: bool = False  # require mode: a failed install stops `make test` too


def missing_tiers(host: Host, tiers: Sequence[Tier] = TIERS) -> tuple[Tier, ...]:
    return tuple(
        t for t in tiers
        if not any(f in host.files for f in t.satisfied_by) and not all(c in host.present for c in t.commands)
    )


def packages_of(tiers: Sequence[Tier], host: Host) -> tuple[str, ...]:
    """The packages to install: for each missing tier, those of its commands that are absent (deduplicated)."""
    out: list[str] = []
    for tier in tiers:
        for command, package in zip(tier.commands, tier.packages, strict=True):
            if command not in host.present and package not in out:
                out.append(package)
    return tuple(out)


def _names(tiers: Sequence[Tier]) -> str:
    """`the Prometheus tier`, `the Prometheus and shellcheck tiers`, `the A, B and C tiers`."""
    names = [t.name for t in tiers]
    if len(names) == 1:
        return f"the {names[0]} tier"
    return "the " + ", ".join(names[:-1]) + " and " + names[-1] + " tiers"


def plan(host: Host, mode: str = "install", tiers: Sequence[Tier] = TIERS) -> Plan:
    """Pure: what to do on this host. mode: install (when allowed), skip (never install), require (CI)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    missing = missing_tiers(host, tiers)
    if not missing:
        return Plan(missing=())
    packages = packages_of(missing, host)
    apt_install = ("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages)
    enable = f"sudo apt-get install {' '.join(packages)}" if host.apt else f"install {' '.join(packages)}"
    why = ""
    if mode == "skip":
        why = "SYSTEM_DEPS=skip"
    elif not host.apt:
        why = "no apt-get on this machine"
    elif not (host.root or host.passwordless_sudo):
        why = "not root, and no passwordless sudo"
    if why:
        if mode == "require":
            return Plan(missing=missing, fail=True,
                        message=f"make test: missing {', '.join(packages)} for {_names(missing)} and "
                                f"cannot install them ({why}); run: {enable}")
        return Plan(missing=missing,
                    message=f"make test: {_names(missing)} will be skipped ({why}); to run them: {enable}")
    prefix: tuple[str, ...] = () if host.root else ("sudo", "-n")
    env = ("env", "DEBIAN_FRONTEND=noninteractive")
    return Plan(
        missing=missing,
        strict=mode == "require",
        commands=((*prefix, *env, "apt-get", "update", "-qq"), (*prefix, *env, *apt_install)),
        message=f"make test: installing {' '.join(packages)} for {_names(missing)} "
                f"({'as root' if host.root else 'with sudo'}; SYSTEM_DEPS=skip to not)",
    )


def probe_host(tiers: Sequence[Tier] = TIERS, root_dir: Path = ROOT) -> Host:
    present = set()
    for tier in tiers:
        for command in tier.commands:
            if shutil.which(command) or any(glob.glob(p) for p in tier.extra_paths):
                present.add(command)
    files = {f for t in tiers for f in t.satisfied_by if (root_dir / f).exists()}
    host = Host(present=frozenset(present), files=frozenset(files), root=os.geteuid() == 0,
                passwordless_sudo=False, apt=shutil.which("apt-get") is not None)
    # sudo is asked only when it would be used: something is missing and we are not root.
    if missing_tiers(host, tiers) and not host.root and shutil.which("sudo"):
        try:
            ok = subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        host = dataclasses.replace(host, passwordless_sudo=ok)
    return host


def execute(p: Plan, run: Callable[[Sequence[str]], int], out: Callable[[str], None]) -> int:
    """Carry out a plan; the exit status for make. A failed install is reported and skipped unless p.fail."""
    if p.message:
        out(p.message)
    if p.fail:
        return 1
    for command in p.commands:
        rc = run(command)
        if rc:
            out(f"make test: `{' '.join(command)}` failed (exit {rc}); {_names(p.missing)} may be skipped")
            return rc if p.strict else 0
    return 0


def _run(command: Sequence[str]) -> int:
    return subprocess.run(list(command), stdout=subprocess.DEVNULL).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES,
                        default=os.environ.get("SYSTEM_DEPS") or "install")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, install nothing")
    args = parser.parse_args(argv)
    if args.mode not in MODES:
        parser.error(f"SYSTEM_DEPS={args.mode!r}: expected one of {', '.join(MODES)}")
    p = plan(probe_host(), args.mode)
    if args.dry_run:
        print(p.message or "make test: every host tool of the test tiers is present")
        for command in p.commands:
            print("  would run:", " ".join(command))
        return 1 if p.fail else 0
    return execute(p, _run, lambda line: print(line, file=sys.stderr, flush=True))


if __name__ == "__main__":
    sys.exit(main())
