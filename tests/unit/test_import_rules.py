"""The import rules of llmfleet/, checked on the source (AST only, nothing is imported).

Floors, lowest first; a module may import its own floor and the floors below it, never one above:

    api (contracts), util -> kube, storage -> plan -> router, workers, store -> autoscaler -> operator, local, sim
    -> testing -> cli

Also: only the kube floor imports a Kubernetes API client library (lightkube, kubernetes, kubernetes_asyncio), and
nothing imports kopf's private modules (kopf stays the framework; llmfleet.kube is the one client). No import cycles between modules (type-checking-only imports count: they couple the modules just the
same), and no import by string (importlib.import_module, __import__), which would hide an edge from this check.
See docs/architecture.md.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "llmfleet"

FLOORS: tuple[tuple[str, ...], ...] = (
    ("api", "util"),
    ("kube", "storage"),
    ("plan",),
    ("router", "workers", "store"),
    ("autoscaler",),
    ("operator", "local", "sim"),
    ("testing",),  # test doubles: they may use anything below cli; nothing but cli may import them
    ("cli",),
)
# `llmfleet/__init__.py` and `llmfleet/__main__.py` are the entry point: the top floor, with cli.
TOP_LEVEL_FLOOR = len(FLOORS) - 1

# Known cycles being removed; each entry is the sorted modules of one cycle. Remove an entry when its cycle is
# gone (the test fails on a listed cycle that no longer exists, so the list only shrinks).
ALLOWED_CYCLES: frozenset[tuple[str, ...]] = frozenset()

STRING_IMPORT_CALLS = {"import_module", "__import__"}

# Kubernetes API client libraries: only `<package>.kube` may import them.
CLIENT_LIBRARIES = ("lightkube", "kubernetes", "kubernetes_asyncio")
CLIENT_FLOOR = "kube"


@dataclass(frozen=True)
class Violation:
    module: str
    message: str

    def __str__(self) -> str:
        return f"{self.module}: {self.message}"


def floor_of(module: str) -> int:
    """Floor index of a module `llmfleet.<pkg>...`; the package's own top-level modules sit on the top floor."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in ("__init__", "__main__"):
        return TOP_LEVEL_FLOOR
    for i, floor in enumerate(FLOORS):
        if parts[1] in floor:
            return i
    raise ValueError(f"{module}: package {parts[1]!r} has no floor; add it to FLOORS (and docs/architecture.md)")


def find_modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file for every .py under root/package."""
    mods: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, mods: dict[str, Path], package: str = PACKAGE) -> Iterator[tuple[str, int]]:
    """(imported llmfleet module, line) for every import in the file, at any depth (functions, TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    if (target := _resolve(alias.name, mods)) and target != module:
                        yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") + (["__init__"] if is_pkg else [])
                base = ".".join(parts[: -node.level] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base != package and not base.startswith(package + "."):
                continue
            for alias in node.names:
                target = _resolve(f"{base}.{alias.name}", mods) or _resolve(base, mods)
                if target and target != module:
                    yield target, node.lineno


def string_imports(module: str, path: Path) -> Iterator[Violation]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in STRING_IMPORT_CALLS:
                yield Violation(module, f"line {node.lineno}: import by string ({name}); import the module instead")


def client_library_imports(module: str, path: Path) -> Iterator[Violation]:
    """Imports of a Kubernetes client library outside the kube floor, and of kopf's private modules anywhere."""
    in_kube = module.split(".")[1:2] == [CLIENT_FLOOR]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in CLIENT_LIBRARIES and not in_kube:
                yield Violation(module, f"line {node.lineno}: imports {top}; use {CLIENT_FLOOR}'s client instead")
                break
            if top == "kopf" and any(part.startswith("_") for part in name.split(".")[1:]):
                yield Violation(module, f"line {node.lineno}: imports kopf's private {name}")
                break


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[tuple[str, ...]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(tuple(sorted(comp)))
    return out


def _package_init_only(cycle: tuple[str, ...]) -> bool:
    """A package's __init__ re-exporting its children links parent and child both ways: not a real cycle."""
    return all(any(a == b.rpartition(".")[0] or b == a.rpartition(".")[0] for b in cycle if b != a) for a in cycle)


def check(root: Path, package: str = PACKAGE, allowed_cycles: frozenset[tuple[str, ...]] = ALLOWED_CYCLES) -> list[Violation]:
    """Every violation of the import rules in root/package."""
    mods = find_modules(root, package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    problems: list[Violation] = []
    for module, path in mods.items():
        problems.extend(string_imports(module, path))
        problems.extend(client_library_imports(module, path))
        here = floor_of(module)
        for target, line in imports_of(module, path, mods, package):
            graph[module].add(target)
            if floor_of(target) > here:
                problems.append(Violation(
                    module, f"line {line}: imports {target} from a higher floor "
                    f"({FLOORS[floor_of(target)]} above {FLOORS[here] if here < len(FLOORS) else 'top'})",
                ))
    found = [c for c in _cycles(graph) if not _package_init_only(c)]
    for cycle in found:
        if cycle not in allowed_cycles:
            problems.append(Violation(cycle[0], "import cycle: " + " <-> ".join(cycle)))
    for cycle in sorted(allowed_cycles - set(found)):
        problems.append(Violation(cycle[0], "allowed cycle no longer exists; remove it from ALLOWED_CYCLES: "
                                  + " <-> ".join(cycle)))
    return problems


# ---- the rules hold for llmfleet/


def test_llmfleet_follows_the_import_rules() -> None:
    problems = check(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_contracts_and_util_import_nothing_from_llmfleet() -> None:
    """The names every component shares, and the stdlib helpers, sit below everything else."""
    mods = find_modules(ROOT)
    leaves = [m for m in mods if m == "llmfleet.api.contracts" or m == "llmfleet.util" or m.startswith("llmfleet.util.")]
    assert "llmfleet.api.contracts" in leaves
    for module in leaves:
        assert [t for t, _ in imports_of(module, mods[module], mods) if t != "llmfleet.util"] == [], module


def test_every_package_has_a_floor() -> None:
    packages = {p.name for p in (ROOT / PACKAGE).iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= {pkg for floor in FLOORS for pkg in floor}


# ---- the check catches new violations (a synthetic package tree)


def _write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"fake/__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != "." and not (root / parent / "__init__.py").exists():
                (root / parent / "__init__.py").write_text("")
        path.write_text(text)
    return root


def _check_fake(root: Path, allowed: frozenset[tuple[str, ...]] = frozenset()) -> list[str]:
    return [str(v) for v in check(root, "fake", allowed)]


def test_clean_tree_passes(tmp_path: Path) -> None:
    root = _write_tree(tmp_path, {
        "fake/api/contracts.py": "PORT = 1\n",
        "fake/router/server.py": "from fake.api.contracts import PORT\nfrom fake.kube import client\n",
        "fake/kube/client.py": "from fake.api import contracts\nimport lightkube\nfrom kopf import ConnectionInfo\n",
        "fake/operator/run.py": "import fake.autoscaler.policy\nfrom fake.router import server\n",
        "fake/autoscaler/policy.py": "from fake.router.server import PORT\n",
    })
    assert _check_fake(root) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {"fake/autoscaler/policy.py": "from fake.operator.status import now\n", "fake/operator/status.py": ""},
            "fake.autoscaler.policy: line 1: imports fake.operator.status from a higher floor",
            id="lower-imports-higher",
        ),
        pytest.param(
            {"fake/operator/run.py": "from fake.testing.fake_backend import FakeBackend\n",
             "fake/testing/fake_backend.py": "from fake.router import server\n", "fake/router/server.py": ""},
            "fake.operator.run: line 1: imports fake.testing.fake_backend from a higher floor",
            id="production-imports-a-test-double",
        ),
        pytest.param(
            {"fake/api/contracts.py": "def f():\n    from fake.kube.client import C\n", "fake/kube/client.py": ""},
            "fake.api.contracts: line 2: imports fake.kube.client from a higher floor",
            id="lazy-import-upward",
        ),
        pytest.param(
            {"fake/router/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake.router.b import B\n",
             "fake/router/b.py": "from fake.router import a\n"},
            "fake.router.a: import cycle: fake.router.a <-> fake.router.b",
            id="cycle-through-type-checking",
        ),
        pytest.param(
            {"fake/router/a.py": "from .b import x\n", "fake/router/b.py": "from . import c\n",
             "fake/router/c.py": "from fake.router.a import y\n"},
            "fake.router.a: import cycle: fake.router.a <-> fake.router.b <-> fake.router.c",
            id="relative-import-cycle",
        ),
        pytest.param(
            {"fake/operator/h.py": "import importlib\nimportlib.import_module('fake.autoscaler.k')\n"},
            "fake.operator.h: line 2: import by string (import_module)",
            id="importlib-by-string",
        ),
        pytest.param(
            {"fake/autoscaler/k.py": "def f():\n    from kubernetes import client\n"},
            "fake.autoscaler.k: line 2: imports kubernetes; use kube's client instead",
            id="client-library-outside-kube",
        ),
        pytest.param(
            {"fake/router/d.py": "import lightkube.generic_resource\n"},
            "fake.router.d: line 1: imports lightkube",
            id="lightkube-outside-kube",
        ),
        pytest.param(
            {"fake/operator/h.py": "from kopf._cogs.clients import api\n"},
            "fake.operator.h: line 1: imports kopf's private kopf._cogs.clients",
            id="kopf-private-client",
        ),
        pytest.param(
            {"fake/local/f.py": "NAMES = ['fake.router.x']\nmods = [__import__(n) for n in NAMES]\n"},
            "fake.local.f: line 2: import by string (__import__)",
            id="dunder-import",
        ),
    ],
)
def test_check_reports_a_new_violation(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    problems = _check_fake(_write_tree(tmp_path, files))
    assert any(p.startswith(expected) for p in problems), problems


def test_allowed_cycle_passes_and_a_fixed_one_must_leave_the_list(tmp_path: Path) -> None:
    cycle = ("fake.sim.a", "fake.sim.b")
    root = _write_tree(tmp_path, {"fake/sim/a.py": "import fake.sim.b\n", "fake/sim/b.py": "import fake.sim.a\n"})
    assert _check_fake(root, frozenset({cycle})) == []
    (root / "fake/sim/b.py").write_text("")
    assert any("no longer exists" in p for p in _check_fake(root, frozenset({cycle})))


def test_unknown_package_is_an_error(tmp_path: Path) -> None:
    root = _write_tree(tmp_path, {"fake/attic/old.py": "import fake.api\n"})
    with pytest.raises(ValueError, match="no floor"):
        check(root, "fake")
