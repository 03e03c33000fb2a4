"""Shared pieces of the llmfleet API: the base model, conditions and resource requests.

Every model uses camelCase aliases on the wire (as Kubernetes does) and snake_case in Python.
Unknown fields are rejected so a typo in a manifest is an error, not a silently ignored field.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base for every spec/status model: camelCase aliases, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict as it appears in a manifest (unset optional fields omitted)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel_rules(*rules: tuple[str, str]) -> ConfigDict:
    """Model config carrying CEL validation rules (rule, message) into the CRD (x-kubernetes-validations)."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]})


class StatusModel(ApiModel):
    """Status written by controllers: tolerate fields added by newer versions."""

    model_config = ConfigDict(extra="allow")


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(StatusModel):
    """A Kubernetes-style condition (Ready, Progressing, Degraded, ...)."""

    type: str = Field(description="Condition type, e.g. Ready, Progressing, Degraded.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase machine-readable reason, e.g. InvalidSpec.")
    message: str = Field(default="", description="Human-readable explanation, including the field path for spec errors.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this condition was computed from."
    )


MEMORY_PATTERN = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?)?$"
# Kubernetes quantity suffixes: decimal (M = 10^6) and binary (Mi = 2^20); a bare K is not one.
_MEMORY_FACTORS: dict[str, float] = {"": 1, **{s: 1000 ** (i + 2) for i, s in enumerate("MGTPE")},
                   **{f"{s}i": 1024 ** (i + 1) for i, s in enumerate("KMGTPE")}}


def memory_bytes(quantity: str) -> float:
    """Bytes of a memory quantity as `Resources.memory` admits it ('64Gi', '500M', '1.5Gi')."""
    m = re.match(MEMORY_PATTERN, quantity)
    suffix = (m.group(2) or "") if m else None
    if m is None or suffix not in _MEMORY_FACTORS:
        raise ValueError(f"{quantity!r} is not a memory quantity (e.g. 64Gi, 500Mi, 8G)")
    return float(quantity.removesuffix(suffix)) * _MEMORY_FACTORS[suffix]


MIG_PROFILE_PATTERN = r"^[1-7]g\.[0-9]+gb$"
# A Kubernetes object name that is a DNS subdomain (Secrets, PriorityClasses, ...): at most 253 characters.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# Kubernetes label syntax: a value is at most 63 characters of alphanumerics, '-', '_' and '.', alphanumeric at both
# ends (or empty); a key is such a name, optionally after a DNS-subdomain prefix (at most 253 characters) and '/'.
# A key is checked by this regex and a cap on its whole length (253 + 1 + 63).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_KEY_MAX = 317
LABEL_KEY_MESSAGE = ("keys must be Kubernetes label keys: an optional DNS-subdomain prefix and '/', then at most 63 "
                     "alphanumerics, '-', '_' or '.', alphanumeric at both ends")


def _label_keys(labels: dict[str, str]) -> dict[str, str]:
    for key in labels:
        if len(key) > LABEL_KEY_MAX or not re.fullmatch(LABEL_KEY_PATTERN, key):
            raise ValueError(f"{key!r}: {LABEL_KEY_MESSAGE}")
    return labels


# The key rule stays out of the CRD: a CEL rule over every key of a map whose keys have no length bound exceeds the
# API server's cost budget. The operator (an InvalidSpec condition) and `llmfleet validate` check it.
NodeSelector = Annotated[dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]],
                         AfterValidator(_label_keys)]
NODE_SELECTOR_DESCRIPTION = (
    "Node labels the pods' nodes must have (a pod nodeSelector), in place of the node affinity gpuType gives "
    "(NVIDIA GPU feature discovery's nvidia.com/gpu.product label, every product name of the type): for clusters "
    "that label GPU nodes otherwise (GKE: cloud.google.com/gke-accelerator: nvidia-h100-80gb). gpuType still sets "
    "the GPU the planner and MFU use. `llmfleet up` ignores it.")
TOLERATIONS_DESCRIPTION = (
    "Pod tolerations beside the nvidia.com/gpu one GPU pods always get: for GPU nodes tainted otherwise (e.g. "
    "dedicated=gpu:NoSchedule). Kubernetes core/v1 Toleration fields. `llmfleet up` ignores them.")
TOLERATION_VALUE_NEEDS_EQUAL = "a toleration with operator Exists takes no value"
TOLERATION_EMPTY_KEY_NEEDS_EXISTS = "a toleration without a key must have operator Exists (it tolerates every taint)"
TOLERATION_SECONDS_NEED_NO_EXECUTE = "tolerationSeconds is for effect NoExecute only"


class Toleration(ApiModel):
    """A pod toleration (Kubernetes core/v1 Toleration): lets the pods onto nodes with a matching taint."""

    model_config = cel_rules(
        ("self.operator != 'Exists' || !has(self.value) || self.value == ''", TOLERATION_VALUE_NEEDS_EQUAL),
        ("(has(self.key) && self.key != '') || self.operator == 'Exists'", TOLERATION_EMPTY_KEY_NEEDS_EXISTS),
        ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
         TOLERATION_SECONDS_NEED_NO_EXECUTE),
    )

    key: str | None = Field(default=None, max_length=LABEL_KEY_MAX, pattern=LABEL_KEY_PATTERN,
                            description="Taint key (a label key); without one, operator Exists tolerates every taint.")
    operator: Literal["Equal", "Exists"] = Field(default="Equal", description="Equal: the taint's value is `value`; "
                                                 "Exists: any value.")
    value: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE_PATTERN,
                              description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; without one, every effect.")
    toleration_seconds: int | None = Field(default=None, ge=0, description="With effect NoExecute: how long the pod "
                                           "stays bound after the taint appears; without it, for good.")

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError(TOLERATION_VALUE_NEEDS_EQUAL)
        if not self.key and self.operator != "Exists":
            raise ValueError(TOLERATION_EMPTY_KEY_NEEDS_EXISTS)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(TOLERATION_SECONDS_NEED_NO_EXECUTE)
        return self


MIG_NEEDS_ONE_GPU = ("migProfile needs gpus: 1 and a gpuType: a pod gets one MIG instance (a process sees one MIG "
                     "device, so tensor parallelism across slices is impossible) and the profile is the GPU type's")


class Resources(ApiModel):
    """Compute requested per replica or per worker."""

    model_config = cel_rules(("!has(self.migProfile) || (self.gpus == 1 && has(self.gpuType))", MIG_NEEDS_ONE_GPU))

    gpus: int = Field(default=0, ge=0, le=64, description="GPUs per pod (nvidia.com/gpu). 0 runs on CPU. `llmfleet "
                      "up` gives each replica GPUs of its own (CUDA_VISIBLE_DEVICES); one that no free GPU fits waits.")
    gpu_type: str | None = Field(
        default=None,
        description="GPU model (H100, H200, A100, L40S, B200, B300, L4); sets the planner's GPU and the peak FLOP/s "
                    "used for MFU, and becomes a required node affinity on nvidia.com/gpu.product for every product name of the type "
                    "(H100: NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe, NVIDIA-H100-NVL; a type the table lacks: "
                    "NVIDIA-<gpuType>) unless nodeSelector is set.",
    )
    mig_profile: str | None = Field(
        default=None, pattern=MIG_PROFILE_PATTERN,
        description="MIG instance profile of gpuType (e.g. 3g.71gb on H200, 1g.10gb on H100 or A100): the pod asks "
                    "for one `nvidia.com/mig-<profile>` instead of a whole GPU (the NVIDIA device plugin's mixed "
                    "strategy). The planner, autoscaler and simulator give a replica the slice's share of compute, "
                    "memory and memory bandwidth, and count its GPU-seconds at the share of the GPU it occupies. "
                    "For a small model (a student pool) that a whole GPU would mostly leave idle. Needs gpus: 1. "
                    "Such a pool stays out of GPU arbitration with training (autoscaling.gpuBudget counts whole "
                    "GPUs): training frees whole GPUs, which become MIG instances only when a node is "
                    "repartitioned. `llmfleet up` gives each replica a free instance of the profile that "
                    "`nvidia-smi -L` lists (CUDA_VISIBLE_DEVICES=MIG-<uuid>).",
    )
    node_selector: NodeSelector | None = Field(default=None, description=NODE_SELECTOR_DESCRIPTION)
    tolerations: list[Toleration] | None = Field(default=None, max_length=32, description=TOLERATIONS_DESCRIPTION)
    cpu: str = Field(default="2", pattern=r"^[0-9]+(\.[0-9]+)?m?$", description="CPU request, Kubernetes quantity (e.g. '8' or '500m').")
    memory: str = Field(
        default="8Gi", pattern=MEMORY_PATTERN, description="Memory request, Kubernetes quantity (e.g. '64Gi')."
    )

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs a pod takes: `gpus`, or 0 on a MIG instance. What GPU arbitration with training counts:
        training frees whole GPUs, which become MIG instances only when a node is repartitioned."""
        return 0 if self.mig_profile else self.gpus

    @model_validator(mode="after")
    def _mig_one_gpu(self) -> Resources:
        if self.mig_profile is not None and (self.gpus != 1 or self.gpu_type is None):
            raise ValueError(MIG_NEEDS_ONE_GPU)
        return self


class SecretKeyRef(ApiModel):
    """One key of a Secret in the resource's namespace (what a pod's env valueFrom.secretKeyRef names)."""

    name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Secret name."
    )
    key: str = Field(
        min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="Key in the Secret's data."
    )


# A URL with a password in its user info (scheme://user:password@host) or in its query (?password=...): RE2
# syntax, so the CRD's CEL rule and pydantic test the same thing.
URL_WITH_PASSWORD = r"(?i)^[^:/?#]+://[^/?#@]*:[^/?#@]*@|[?&]password="
URL_WITH_PASSWORD_MESSAGE = ("contains a password; specs are copied into ConfigMaps and pod environments, so "
                             "credentials belong in a Secret")


def _no_password(url: str) -> str:
    if re.search(URL_WITH_PASSWORD, url):
        raise ValueError(URL_WITH_PASSWORD_MESSAGE)
    return url


_NO_PASSWORD_RULE = {"x-kubernetes-validations": [{"rule": f"!self.matches('{URL_WITH_PASSWORD}')",
                                                    "message": URL_WITH_PASSWORD_MESSAGE}]}
# A URL field that refuses credentials, in pydantic and (the same regular expression) in the CRD's CEL rule.
CredentialFreeUrl = Annotated[str, AfterValidator(_no_password), Field(json_schema_extra=_NO_PASSWORD_RULE)]
# The same for an http(s) endpoint.
CredentialFreeHttpUrl = Annotated[
    str, Field(pattern=r"^https?://"), AfterValidator(_no_password), Field(json_schema_extra=_NO_PASSWORD_RULE)
]


class ObjectMeta(StatusModel):
    """The subset of Kubernetes ObjectMeta llmfleet reads; other keys are kept as they are."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Object name (DNS-1123 label: children's names are derived from it).",
    )
    namespace: str | None = Field(default=None, description="Namespace; the default namespace when omitted.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    generation: int | None = Field(default=None, description="Set by the API server.")
    uid: str | None = Field(default=None, description="Set by the API server.")
