"""LoRA serving on an InferenceService: the engine's LoRA settings and the adapters served on the primary pool."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from llmfleet.api.common import ApiModel

# vLLM's LoRAConfig.max_lora_rank accepts exactly these values (vllm/config/lora.py, MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# A URI (scheme://...) or a filesystem path: no whitespace or control characters.
_URI_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")
_PATH = re.compile(r"^[^\s\x00-\x1f]+$")


class AdapterSpec(ApiModel):
    """A LoRA adapter served on top of the primary pool's model, under its own model name."""

    name: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="Model name clients use in the OpenAI API `model` field to get this adapter.",
    )
    uri: str = Field(
        min_length=1,
        description="Adapter folder in the PEFT format (adapter_config.json + adapter_model.safetensors): a local "
        "path, or file:// URI; other storage schemes where the model storage supports them.",
    )
    base_model: str | None = Field(
        default=None,
        description="The base model the adapter was trained on (model path or served name); when set it must be "
        "the primary pool's model, so an adapter for another base is refused instead of producing garbage.",
    )

    @model_validator(mode="after")
    def _check(self) -> AdapterSpec:
        if not (_URI_SCHEME.match(self.uri) or _PATH.match(self.uri)):
            raise ValueError(f"uri {self.uri!r} is neither a path nor a scheme://... URI")
        return self

    @property
    def engine_path(self) -> str:
        """What the engine's load call gets as lora_path: a file:// URI becomes its local path."""
        return self.uri.removeprefix("file://")


class LoraSpec(ApiModel):
    """LoRA serving on the primary pool (vLLM --enable-lora); adapters are loaded at run time, on demand."""

    max_loras: int = Field(default=4, ge=1, le=256, description="Adapters that can be active in one engine batch "
                           "(GPU slots per replica; --max-loras).")
    max_lora_rank: int = Field(default=16, description=f"Largest adapter rank the engine accepts (--max-lora-rank; "
                               f"one of {', '.join(map(str, LORA_RANKS))}).",
                               json_schema_extra={"enum": list(LORA_RANKS)})  # the API server refuses other ranks too
    max_cpu_loras: int | None = Field(default=None, ge=1, description="Adapters kept in host memory per replica "
                                      "(--max-cpu-loras, >= maxLoras); maxLoras when unset.")

    @model_validator(mode="after")
    def _check(self) -> LoraSpec:
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"maxLoraRank {self.max_lora_rank} is not one of {', '.join(map(str, LORA_RANKS))} "
                             "(the ranks vLLM accepts)")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"maxCpuLoras ({self.max_cpu_loras}) must be >= maxLoras ({self.max_loras})")
        return self

    @property
    def slots(self) -> int:
        """Adapters a replica holds loaded at once (its host cache; maxLoras of them active per batch)."""
        return self.max_cpu_loras or self.max_loras
