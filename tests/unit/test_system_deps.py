"""mk/system_deps.py, what `make test` installs before running: which packages are missing -> what it does.
Nothing here runs apt-get: the plan is pure, and execute() gets a recording runner."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALL = frozenset({"initdb", "prometheus", "shellcheck", "npm", "unzip"})


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llmfleet_mk_system_deps", ROOT / "mk" / "system_deps.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sd = _load()


def host(missing: Sequence[str] = (), *, root: bool = False, sudo: bool = False, apt: bool = True,
         helm: bool = False):  # type: ignore[no-untyped-def]
    return sd.Host(present=ALL - set(missing), files=frozenset({".tools/bin/helm"} if helm else ()),
                   root=root, passwordless_sudo=sudo, apt=apt)


def test_nothing_missing_does_nothing() -> None:
    p = sd.plan(host(root=True))
    assert p.missing == () and p.commands == () and p.message == "" and not p.fail


def test_root_installs_the_missing_packages_with_apt() -> None:
    p = sd.plan(host(["prometheus", "shellcheck"], root=True))
    assert [t.name for t in p.missing] == ["Prometheus", "shellcheck"]
    assert p.commands == (
        ("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "update", "-qq"),
        ("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq", "--no-install-recommends",
         "prometheus", "shellcheck"),
    )
    assert p.message.startswith("make test: installing prometheus shellcheck for the Prometheus and shellcheck tiers")


def test_passwordless_sudo_installs_through_sudo() -> None:
    p = sd.plan(host(["initdb"], sudo=True))
    assert [c[:2] for c in p.commands] == [("sudo", "-n"), ("sudo", "-n")]
    assert p.commands[1][-1] == "postgresql" and "with sudo" in p.message


def test_without_permission_one_line_names_the_tiers_and_the_command() -> None:
    p = sd.plan(host(["prometheus", "shellcheck", "npm"]))
    assert p.commands == () and not p.fail
    assert p.message == (
        "make test: the Prometheus, shellcheck and Helm chart tiers will be skipped "
        "(not root, and no passwordless sudo); to run them: sudo apt-get install prometheus shellcheck npm"
    )


def test_only_the_absent_commands_of_a_tier_are_installed() -> None:
    assert sd.plan(host(["unzip"], root=True)).commands[1][-1:] == ("unzip",)


def test_a_fetched_helm_makes_npm_and_unzip_unnecessary() -> None:
    assert sd.plan(host(["npm", "unzip"], root=True, helm=True)).commands == ()
    assert sd.plan(host(["npm", "unzip"], root=True)).commands[1][-2:] == ("npm", "unzip")


def test_no_apt_get_says_what_to_install() -> None:
    p = sd.plan(host(["prometheus"], root=True, apt=False))
    assert p.commands == ()
    assert p.message.endswith("(no apt-get on this machine); to run them: install prometheus")


def test_skip_mode_never_installs() -> None:
    p = sd.plan(host(["prometheus"], root=True), mode="skip")
    assert p.commands == () and not p.fail and "(SYSTEM_DEPS=skip)" in p.message


def test_require_mode_fails_when_it_cannot_install_and_installs_when_it_can() -> None:
    p = sd.plan(host(["shellcheck"]), mode="require")
    assert p.fail and p.message.startswith("make test: missing shellcheck for the shellcheck tier and cannot")
    assert sd.plan(host(["shellcheck"], root=True), mode="require").strict


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="mode 'sometimes'"):
        sd.plan(host(), mode="sometimes")


def _execute(p, fail_at: int | None = None) -> tuple[int, list[tuple[str, ...]], list[str]]:  # type: ignore[no-untyped-def]
    ran: list[tuple[str, ...]] = []
    lines: list[str] = []

    def run(command: Sequence[str]) -> int:
        ran.append(tuple(command))
        return 100 if len(ran) - 1 == fail_at else 0

    return sd.execute(p, run, lines.append), ran, lines


def test_execute_runs_update_then_install() -> None:
    p = sd.plan(host(["prometheus"], root=True))
    rc, ran, lines = _execute(p)
    assert rc == 0 and ran == list(p.commands) and lines == [p.message]


def test_a_failed_install_is_reported_and_make_test_goes_on_unless_required() -> None:
    rc, ran, lines = _execute(sd.plan(host(["prometheus"], root=True)), fail_at=0)
    assert rc == 0 and len(ran) == 1 and "failed (exit 100)" in lines[-1] and "Prometheus" in lines[-1]
    rc, _, _ = _execute(sd.plan(host(["prometheus"], root=True), mode="require"), fail_at=1)
    assert rc == 100


def test_execute_skip_and_fail_plans_run_nothing() -> None:
    rc, ran, lines = _execute(sd.plan(host(["prometheus"])))
    assert (rc, ran, len(lines)) == (0, [], 1)
    rc, ran, _ = _execute(sd.plan(host(["prometheus"]), mode="require"))
    assert (rc, ran) == (1, [])


def test_probe_finds_this_hosts_commands(tmp_path: Path) -> None:
    h = sd.probe_host(root_dir=tmp_path)
    assert h.files == frozenset()  # no .tools/bin/helm under an empty folder
    assert h.present <= ALL
