"""Every pod the operator creates (router, serving replicas, training workers, the feature store's CronJob,
their fetch init containers) and the chart's own operator pod meet the "restricted" Pod Security Standard,
with a read-only root filesystem and the folders they write mounted; GPU pods keep their shared memory."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pod_security import pod_specs, read_only_root_violations, restricted_violations
from rendered_objects import builder_objects, chart_objects

from llmfleet.operator.builders.security import CACHE_ENV, HOME_DIR, TMP_DIR

COMPLIANT: dict[str, Any] = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}}],
    "volumes": [{"name": "v", "emptyDir": {}}],
}


def _mutated(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(COMPLIANT)
    node: Any = spec
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[last] = value
    return spec


@pytest.mark.parametrize(("path", "value", "control"), [
    ("hostNetwork", True, "Host Namespaces"),
    ("hostPID", True, "Host Namespaces"),
    ("containers.0.securityContext.privileged", True, "Privileged Containers"),
    ("containers.0.securityContext.capabilities.add", ["SYS_ADMIN"], "Capabilities (baseline)"),
    ("containers.0.securityContext.capabilities.add", ["CHOWN"], "Capabilities: "),
    ("containers.0.securityContext.capabilities.drop", ["NET_RAW"], "Capabilities: "),
    ("containers.0.ports", [{"name": "p", "containerPort": 80, "hostPort": 80}], "Host Ports"),
    ("containers.0.securityContext.procMount", "Unmasked", "/proc Mount Type"),
    ("volumes", [{"name": "h", "hostPath": {"path": "/"}}], "HostPath Volumes"),
    ("volumes", [{"name": "n", "nfs": {"server": "x", "path": "/"}}], "Volume Types"),
    ("securityContext.seLinuxOptions", {"type": "spc_t"}, "SELinux"),
    ("securityContext.appArmorProfile", {"type": "Unconfined"}, "AppArmor"),
    ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "Sysctls"),
    ("containers.0.securityContext.allowPrivilegeEscalation", True, "Privilege Escalation"),
    ("securityContext.runAsNonRoot", False, "Running as Non-root:"),
    ("containers.0.securityContext.runAsNonRoot", False, "Running as Non-root:"),
    ("containers.0.securityContext.runAsUser", 0, "Running as Non-root user"),
    ("securityContext.seccompProfile", {"type": "Unconfined"}, "Seccomp"),
    ("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}, "Seccomp"),
])
def test_the_checker_finds_each_control(path: str, value: Any, control: str) -> None:
    assert restricted_violations(COMPLIANT) == []
    found = restricted_violations(_mutated(path, value))
    assert any(v.startswith(control) for v in found), found


def test_the_checker_wants_seccomp_and_non_root_somewhere_and_counts_init_containers() -> None:
    spec = copy.deepcopy(COMPLIANT)
    del spec["securityContext"]
    assert {v.split(":")[0] for v in restricted_violations(spec)} == {"Running as Non-root", "Seccomp"}
    spec["containers"][0]["securityContext"] |= {"runAsNonRoot": True, "seccompProfile": {"type": "Localhost"}}
    assert restricted_violations(spec) == []
    init = copy.deepcopy(COMPLIANT)
    init["initContainers"] = [{"name": "fetch"}]
    assert any("initContainers[fetch]" in v for v in restricted_violations(init))
    annotated = restricted_violations(COMPLIANT, {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"})
    assert annotated and annotated[0].startswith("AppArmor")


def _pods(objects: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any, Any]]:
    return [(f"{source}: {where}", meta, spec) for source, obj in objects for where, meta, spec in pod_specs(obj)]


def test_every_pod_the_operator_creates_is_restricted() -> None:
    pods = _pods(builder_objects())
    kinds = {where.split(": ")[1].split("/")[0] for where, _, _ in pods}
    assert kinds == {"Deployment", "Job", "CronJob"}
    assert any(spec.get("initContainers") for _, _, spec in pods)  # fetch init containers are covered
    for where, meta, spec in pods:
        assert restricted_violations(spec, meta.get("annotations")) == [], where
        assert read_only_root_violations(spec) == [], where
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            env = {e["name"]: e.get("value") for e in container["env"]}
            for path in (TMP_DIR, HOME_DIR):
                assert path in mounts and "emptyDir" in volumes[mounts[path]], (where, container["name"], path)
            for name, value in CACHE_ENV.items():
                assert env[name] == value and value.startswith((HOME_DIR, TMP_DIR)), (where, name)
        gpus = any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in spec["containers"])
        if gpus:  # vLLM's workers and NCCL exchange through shared memory
            shm = next(m["name"] for c in spec["containers"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
            assert volumes[shm]["emptyDir"]["medium"] == "Memory", where


@pytest.mark.helm
def test_every_pod_of_the_chart_is_restricted() -> None:
    pods = _pods(chart_objects())
    assert pods
    for where, meta, spec in pods:
        assert restricted_violations(spec, meta.get("annotations")) == [], where
        assert read_only_root_violations(spec) == [], where


def test_a_checkpoint_folder_at_tmp_keeps_its_own_volume() -> None:
    from llmfleet.operator.builders.security import restricted

    pod = {"containers": [{"name": "w", "volumeMounts": [{"name": "checkpoints", "mountPath": "/tmp"}]}],
           "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}]}
    (container,) = restricted(pod)["containers"]
    assert [m["name"] for m in container["volumeMounts"]] == ["checkpoints", "home"]
    with pytest.raises(ValueError, match="reserved"):
        restricted({"containers": [], "volumes": [{"name": "tmp", "emptyDir": {}}]})


def test_the_pod_user_is_configurable_and_never_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLMFLEET_POD_USER (the chart's workloads.runAsUser): another user id, or `image` (the image's or the
    platform's user, e.g. OpenShift's per-namespace range): the pods stay restricted either way."""
    from llmfleet.operator.config import POD_UID, OperatorConfig

    assert OperatorConfig.from_env().pod_user == POD_UID
    monkeypatch.setenv("LLMFLEET_POD_USER", "1000740000")
    assert OperatorConfig.from_env().pod_user == 1000740000
    monkeypatch.setenv("LLMFLEET_POD_USER", "image")
    config = OperatorConfig.from_env()
    assert config.pod_user is None
    for bad in ("0", "root", "-5"):
        monkeypatch.setenv("LLMFLEET_POD_USER", bad)
        with pytest.raises(ValueError, match="LLMFLEET_POD_USER"):
            OperatorConfig.from_env()
    pods = _pods(builder_objects(config))
    assert pods
    for where, meta, spec in pods:
        assert restricted_violations(spec, meta.get("annotations")) == [], where
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(spec["securityContext"]), where


def test_image_pull_secrets_reach_every_pod_the_operator_creates(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLMFLEET_IMAGE_PULL_SECRETS (the chart's workloads.imagePullSecrets): images from a private registry are
    pulled with them in replica, router, training and feature-store pods alike; none by default."""
    from llmfleet.operator.config import OperatorConfig

    assert OperatorConfig.from_env().image_pull_secrets == ()
    assert all("imagePullSecrets" not in spec for _, _, spec in _pods(builder_objects(OperatorConfig.from_env())))
    monkeypatch.setenv("LLMFLEET_IMAGE_PULL_SECRETS", "regcred, mirror.io")
    config = OperatorConfig.from_env()
    assert config.image_pull_secrets == ("regcred", "mirror.io")
    pods = _pods(builder_objects(config))
    assert len(pods) >= 4
    for where, _, spec in pods:
        assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.io"}], where
    monkeypatch.setenv("LLMFLEET_IMAGE_PULL_SECRETS", "Reg_Cred")
    with pytest.raises(ValueError, match="LLMFLEET_IMAGE_PULL_SECRETS"):
        OperatorConfig.from_env()
