"""A checker of the Kubernetes Pod Security Standards' "restricted" profile (baseline included), for tests.

Written from https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the policy as of
Kubernetes 1.34): each control there is one check below, named as in the document. The Windows-only
controls are out of scope (llmfleet runs Linux pods). `pod_specs` finds the pod templates in any workload
object (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}
SECCOMP_ALLOWED = {"RuntimeDefault", "Localhost"}
APPARMOR_ALLOWED = {"RuntimeDefault", "Localhost"}


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            yield f"{key}[{c.get('name')}]", c


def restricted_violations(spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> list[str]:
    """Every control of the restricted profile that the pod spec breaks, as 'control: field path'."""
    bad: list[str] = []
    pod_sc: Mapping[str, Any] = spec.get("securityContext") or {}
    containers = list(_containers(spec))

    # --- baseline ---
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            bad.append(f"Host Namespaces: spec.{field}")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        bad.append("HostProcess: spec.securityContext.windowsOptions.hostProcess")
    for where, c in containers:
        sc = c.get("securityContext") or {}
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad.append(f"HostProcess: {where}.securityContext.windowsOptions.hostProcess")
        if sc.get("privileged"):
            bad.append(f"Privileged Containers: {where}.securityContext.privileged")
        for cap in (sc.get("capabilities") or {}).get("add") or []:
            if cap not in BASELINE_CAPABILITIES:
                bad.append(f"Capabilities (baseline): {where} adds {cap}")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                bad.append(f"Host Ports: {where}.ports[{port.get('name')}].hostPort")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"/proc Mount Type: {where}.securityContext.procMount")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            bad.append(f"HostPath Volumes: spec.volumes[{v.get('name')}]")
    for where, sc in [("spec", pod_sc)] + [(w, c.get("securityContext") or {}) for w, c in containers]:
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor is not None and apparmor not in APPARMOR_ALLOWED:
            bad.append(f"AppArmor: {where}.securityContext.appArmorProfile.type={apparmor}")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            bad.append(f"SELinux: {where}.securityContext.seLinuxOptions")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            bad.append(f"Seccomp: {where}.securityContext.seccompProfile.type=Unconfined")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            bad.append(f"AppArmor: metadata.annotations[{key}]={value}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            bad.append(f"Sysctls: spec.securityContext.sysctls[{sysctl.get('name')}]")

    # --- restricted ---
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"Volume Types: spec.volumes[{v.get('name')}] is {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type") in SECCOMP_ALLOWED
    if pod_sc.get("runAsUser") == 0:
        bad.append("Running as Non-root user: spec.securityContext.runAsUser=0")
    for where, c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"Privilege Escalation: {where}.securityContext.allowPrivilegeEscalation is not false")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            bad.append(f"Running as Non-root: {where}.securityContext.runAsNonRoot")
        if sc.get("runAsUser") == 0:
            bad.append(f"Running as Non-root user: {where}.securityContext.runAsUser=0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is None and not pod_seccomp or seccomp is not None and seccomp not in SECCOMP_ALLOWED:
            bad.append(f"Seccomp: {where}.securityContext.seccompProfile")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"Capabilities: {where}.securityContext.capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"Capabilities: {where}.securityContext.capabilities.add beyond NET_BIND_SERVICE")
    return bad


def pod_specs(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(where, pod metadata, pod spec) of each pod an object runs."""
    kind = obj.get("kind")
    name = f"{kind}/{(obj.get('metadata') or {}).get('name')}"
    spec = obj.get("spec") or {}
    if kind == "Pod":
        yield name, obj.get("metadata") or {}, spec
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        template = spec.get("template") or {}
        yield name, template.get("metadata") or {}, template.get("spec") or {}
    elif kind == "CronJob":
        template = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}
        yield name, template.get("metadata") or {}, template.get("spec") or {}


def read_only_root_violations(spec: Mapping[str, Any]) -> list[str]:
    """Containers whose root filesystem is writable (not a PSS control; llmfleet's pods all mount what they
    write)."""
    return [f"{where}.securityContext.readOnlyRootFilesystem" for where, c in _containers(spec)
            if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True]
