"""Router configuration: what one `llmfleet router` process needs to serve one InferenceService.

Pure pydantic + yaml (no aiohttp, kubernetes, torch): the operator imports this to render ConfigMap
`<isvc>-router` key `router.yaml`; the local runtime writes the same YAML to a file.

`router_config_from_service(isvc, endpoints)` is the only place that maps the InferenceService spec to router
settings. `endpoints` given (pool name -> base URLs) means a static list (local runtime); `None` means the
router discovers replicas from Kubernetes EndpointSlices with the contract labels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from llmfleet.api.contracts import KV_EVENTS_PORT, REPLICA_PORT, ROUTER_PORT, STORE_URL_ENV, pool_selector
from llmfleet.api.inferenceservice import (
    DEFAULT_EVICTION_COST,
    DEFAULT_SCORERS,
    DEFAULT_SOLE_HOLDER_DISCOUNT,
    SCORER_NAMES,
    InferenceService,
    PoolView,
)
from llmfleet.api.loader import dump_yaml
from llmfleet.api.outliers import OutlierEjection
from llmfleet.api.storage import parse_uri
from llmfleet.plan.pool_presets import pool_preset
from llmfleet.router.prefill_price import pool_prefill_rate, pool_prefill_speedup

# The router's ConfigMap key and where the operator mounts it (and the tenants Secret) in the router's pod.
ROUTER_CONFIG_KEY = "router.yaml"
ROUTER_CONFIG_DIR = "/etc/llmfleet"
TENANTS_DIR = f"{ROUTER_CONFIG_DIR}/tenants"
TENANTS_MOUNT_PATH = f"{TENANTS_DIR}/tenants.yaml"
# Environment variable of the router pods that holds the replicas' API key (from spec.router.upstreamKeySecret),
# and that Secret's data key.
UPSTREAM_API_KEY_ENV = "LLMFLEET_UPSTREAM_API_KEY"
UPSTREAM_KEY_SECRET_KEY = "apiKey"
# What the router reads of a model folder (tokenizer, chat template, shape for the KV tiers): on Kubernetes it
# fetches only these files, never the weights.
ROUTER_MODEL_FILES = (
    "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "generation_config.json",
)
KNOWN_SCORERS = SCORER_NAMES
# Memory bound of the session-affinity scorer's table (plugins/session.py): 131,072 sessions.
DEFAULT_SESSION_BYTES = 32 * 1024 * 1024
# Weight of the adapter-loaded scorer added to a service with adapters whose spec.router.scorers does not name it.
DEFAULT_ADAPTER_WEIGHT = 1.0


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# The Kubernetes API access the router's discovery needs (it lists EndpointSlices; nothing else): the operator
# grants exactly this to each router's ServiceAccount (builders.inferenceservice.build_router).
DISCOVERY_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
)


class KubernetesDiscovery(_Model):
    """Find a pool's replicas from EndpointSlices of its headless Service (in cluster)."""

    namespace: str = Field(default="default", description="Namespace of the replicas' EndpointSlices.")
    selector: str = Field(description="Label selector, e.g. llmfleet.io/inferenceservice=chat,llmfleet.io/pool=primary.")
    port: int = Field(default=REPLICA_PORT, ge=1, le=65535, description="Replica OpenAI port.")
    interval_seconds: float = Field(default=5.0, gt=0, description="Seconds between EndpointSlice lists.")
    timeout_seconds: float = Field(default=3.0, gt=0, description="Timeout of one Kubernetes API call.")


class AdapterConfig(_Model):
    """A LoRA adapter of a pool's model: clients ask for it by name; the router loads it where needed."""

    name: str = Field(min_length=1, description="Model name of the adapter (the engine's lora_name).")
    path: str = Field(min_length=1, description="What the engine's /v1/load_lora_adapter gets as lora_path.")


class PoolConfig(_Model):
    """One pool of replicas serving one model."""

    name: str = Field(min_length=1, description="Pool name: 'primary' or a student pool name.")
    role: Literal["primary", "student"] = Field(description="primary, or student (fallback target).")
    served_names: list[str] = Field(min_length=1, description="Model names clients may ask for; the first is sent upstream.")
    model_path: str | None = Field(default=None, description="Model folder; its tokenizer.json feeds the prefix index.")
    tokenizer_path: str | None = Field(
        default=None, description="tokenizer.json path or folder; model_path when unset; text blocks when unreachable."
    )
    block_size: int = Field(default=16, ge=1, description="Prefix-index block size in tokens (match the engine).")
    prefix_mode: Literal["auto", "tokens", "text"] = Field(
        default="auto",
        description="Prefix blocks from the tokenizer (tokens), UTF-8 text (text, cheapest), or tokens when readable (auto).",
    )
    max_model_len: int | None = Field(default=None, ge=1, description="Context length of the pool's model.")
    cache_capacity_blocks: int | None = Field(
        default=None, ge=1, description="GPU KV blocks per replica; read from vllm:cache_config_info when unset."
    )
    host_cache_blocks: int | None = Field(
        default=None, ge=0,
        description="KV blocks per replica in the host (CPU offload) tier; derived from vllm:cache_config_info's "
        "kv_offloading_size and the model's config.json when unset (GPU blocks only when that fails).",
    )
    kv_offload_gib: float | None = Field(
        default=None, gt=0, alias="kvOffloadGiB", description="The pool's vLLM CPU offload buffer, GiB (spec vllm.kvOffloadGiB); used "
        "when the engine's cache_config_info does not report one.",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per replica (sizes KV bytes per block).")
    prefill_tokens_per_s: float | None = Field(
        default=None, gt=0, description="The estimated-ttft scorer's price of the pool's prefill, tokens/s: the "
        "planner's for its model preset and GPU (llmfleet.router.prefill_price). Unset: the planner cannot "
        "price the pool (CPU replicas, no preset), and its rate is measured unless measurePrefillRate is false.",
    )
    prefill_speedup: float = Field(
        default=1.0, ge=1.0, description="How much faster than prefill_tokens_per_s the pool's replicas prefill "
        "at the planner's roofline (the price is capped at the H200-class default; 1 for an unpriced pool): the "
        "fallback compares pools' prefill queues at their own speeds (llmfleet.router.prefill_price).",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="The engine's model dtype; the KV dtype when its cache dtype is auto.",
    )
    scales_from_zero: bool = Field(
        default=False,
        description="The pool may have no replica (minReplicas 0): requests for it are held while the autoscaler "
        "starts one (limits.holdTimeoutSeconds) instead of answered 503.",
    )
    kv_events_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="vLLM KV-event ZMQ PUB port on each replica (--kv-events-config); corrects the prefix index.",
    )
    kv_events_endpoints: dict[str, str] | None = Field(
        default=None, description="Replica base URL -> its KV-event ZMQ endpoint (static setups on one host)."
    )
    adapters: list[AdapterConfig] = Field(default_factory=list, description="LoRA adapters served by this pool.")
    adapter_slots: int = Field(
        default=0, ge=0, description="Adapters one replica holds at once (spec.lora maxCpuLoras); beyond it the router "
        "unloads the least recently used idle one before loading another. 0 = no limit known.",
    )
    endpoints: list[str] | None = Field(default=None, description="Static replica base URLs (http://host:port).")
    discovery: KubernetesDiscovery | None = Field(default=None, description="EndpointSlice discovery (in cluster).")

    @model_validator(mode="after")
    def _check(self) -> PoolConfig:
        if self.endpoints is None and self.discovery is None:
            raise ValueError(f"pool {self.name}: set endpoints or discovery")
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"pool {self.name}: adapter names must be unique")
        return self


class SLOConfig(_Model):
    """The primary pool's latency objectives (burn rate, deadlines)."""

    ttft_p95_ms: float = Field(default=1000.0, gt=0, description="Time to first token objective, p95, ms.")
    tpot_p95_ms: float = Field(default=100.0, gt=0, description="Time per output token objective, p95, ms.")
    e2e_p99_ms: float | None = Field(default=None, gt=0, description="End-to-end objective, p99, ms.")
    window_seconds: float = Field(default=60.0, gt=0, description="Sliding window over which burn rate is measured.")


class FallbackConfig(_Model):
    """When a request goes to a student pool (see llmfleet.router.fallback)."""

    enabled: bool = Field(default=True, description="Consider student pools at all.")
    slo_burn_rate: float = Field(default=2.0, gt=0, description="Degrade while the primary's burn rate exceeds this.")
    max_queue_delay_ms: float | None = Field(default=None, gt=0, description="Degrade when predicted primary queueing exceeds this.")
    long_context_tokens: int | None = Field(default=None, ge=1, description="Prompts longer than this go to a student pool.")
    sheddable_classes: list[str] = Field(default_factory=list, description="Classes (class header) that may always be degraded.")
    class_header: str = Field(default="x-llmfleet-class", description="Header carrying the request class.")
    max_degraded_fraction: float = Field(default=0.2, ge=0, le=1, description="Cap on a tenant's degraded fraction.")
    min_requests_for_burn: int = Field(default=20, ge=1, description="Requests in the window before burn rate counts.")


class FeatureStoreConfig(_Model):
    """Online response lookups before routing (llmfleet.store.lookup)."""

    enabled: bool = Field(default=False, description="Look up responses before routing.")
    url: str | None = Field(default=None, description="SQLAlchemy URL of the store.")
    url_env: str | None = Field(
        default=None, description="Environment variable holding the URL instead (a Secret's value in the pod); "
        "wins over url.")
    semantic_threshold: float = Field(default=0.92, gt=0, le=1, description="Cosine similarity for a semantic hit.")
    lookup_timeout_ms: float = Field(default=20.0, gt=0, description="Lookup deadline; fail open.")
    opt_out_header: str = Field(default="x-llmfleet-no-lookup", description="Header that skips the lookup when present.")

    def resolved_url(self, environ: Mapping[str, str]) -> str | None:
        """The store's URL: from `url_env` in `environ` when named (ValueError when it is unset there), else url."""
        if self.url_env:
            value = environ.get(self.url_env)
            if not value:
                raise ValueError(f"featureStore.urlEnv: {self.url_env} is not set (the feature store's URL, from "
                                 "spec.featureStore.urlSecretRef)")
            return value
        return self.url


class LimitsConfig(_Model):
    """Timeouts, sizes and retries."""

    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="Larger bodies get 413.")
    request_timeout_seconds: float = Field(default=120.0, gt=0, description="Upper bound on one request at the router.")
    connect_timeout_seconds: float = Field(default=2.0, gt=0, description="TCP connect timeout to a replica.")
    first_byte_timeout_seconds: float | None = Field(
        default=None, gt=0, description="Deadline for the first upstream byte; SLO-derived (4x TTFT p95, >= 10 s) when unset."
    )
    max_retries: int = Field(default=2, ge=0, description="Other replicas tried when one fails before the first byte.")
    scrape_interval_seconds: float = Field(default=1.0, gt=0, description="Seconds between /metrics scrapes.")
    scrape_timeout_seconds: float = Field(default=0.5, gt=0, description="Timeout of one scrape or health check.")
    stale_after_seconds: float = Field(default=3.0, gt=0, description="Scraped load older than this is stale.")
    health_failures_to_down: int = Field(default=2, ge=1, description="Consecutive failed checks that mark a replica down.")
    max_held_requests: int = Field(
        default=1000, ge=0, description="Requests held at once for pools scaling from zero; more get 503 + Retry-After.",
    )
    hold_timeout_seconds: float | None = Field(
        default=None, gt=0,
        description="Deadline of a held request (scale from zero) before 503; requestTimeoutSeconds when unset.",
    )
    header_timeout_seconds: float = Field(
        default=10.0, gt=0,
        description="A client connection must deliver a request's complete headers within this time of opening "
        "(or of the request's first byte on a kept-alive connection), else it is closed (slowloris).",
    )
    body_timeout_seconds: float = Field(
        default=30.0, gt=0,
        description="A request's body must arrive completely within this time of its headers, else the "
        "connection is closed.",
    )
    idle_timeout_seconds: float = Field(
        default=75.0, gt=0,
        description="A kept-alive client connection with no request for this long is closed; it also bounds how "
        "long a new connection may wait before its first complete request.",
    )


# Outlier ejection's settings are the InferenceService API's (spec.router.outliers): one definition.
OutlierConfig = OutlierEjection


class TenantConfig(_Model):
    """One tenant: API keys and a token-bucket rate limit."""

    name: str = Field(min_length=1, description="Tenant name (request log, metrics).")
    api_keys: list[str] = Field(default_factory=list, description="Bearer keys of this tenant.")
    requests_per_second: float | None = Field(default=None, gt=0, description="Token-bucket refill rate; unlimited when unset.")
    burst: float | None = Field(default=None, gt=0, description="Bucket size; max(1, rate) when unset.")
    max_degraded_fraction: float | None = Field(default=None, ge=0, le=1, description="Overrides fallback.maxDegradedFraction.")


class TenantsConfig(_Model):
    """API keys: inline (local) or a mounted Secret file (`tenants.yaml`: {tenants: [TenantConfig...]})."""

    secret_name: str | None = Field(default=None, description="Secret the operator mounts at `file`.")
    file: str | None = Field(default=None, description="YAML file with {tenants: [...]} (re-read when it changes).")
    tenants: list[TenantConfig] = Field(default_factory=list, description="Inline tenants.")
    require_api_key: bool = Field(default=False, description="Reject requests without a known key (401).")
    default_tenant: str = Field(default="default", description="Tenant of requests without a key when keys are optional.")
    limit_share: float = Field(
        default=1.0, gt=0, le=1,
        description="Fraction of every tenant's requestsPerSecond and burst this router enforces: 1/N for N router "
        "replicas behind one Service (set by the operator), so together they allow the tenant's limit.",
    )


class RouterConfig(_Model):
    """Everything one router process needs."""

    service: str = Field(description="InferenceService name.")
    namespace: str = Field(default="default", description="InferenceService namespace.")
    host: str = Field(default="0.0.0.0", description="Listen address.")
    port: int = Field(default=ROUTER_PORT, ge=0, le=65535, description="Listen port (API and /metrics).")
    pools: list[PoolConfig] = Field(min_length=1, description="Primary pool first, then student pools in preference order.")
    scorers: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_SCORERS),
        description="Scorer name -> weight.",
    )
    session_affinity_header: str | None = Field(default="x-session-id", description="Header pinning a session.")
    session_affinity_bytes: int = Field(
        default=DEFAULT_SESSION_BYTES, ge=4096,
        description="Memory bound of the session-affinity scorer's session -> replica table, in bytes: session ids "
        "are kept as 8-byte hashes, 256 bytes per session with the table's overhead, whatever the ids' length "
        "(the default holds 131,072 sessions).",
    )
    measure_prefill_rate: bool | None = Field(
        default=None,
        description="Which pools' prefill rate the estimated-ttft scorer fits from this router's first-byte times: "
        "unset, the pools without prefillTokensPerS (the planner could not price them); true, every pool; false, "
        "none (a pool without prefillTokensPerS is priced at the H200-class default).",
    )
    sole_holder_discount: bool = Field(
        default=DEFAULT_SOLE_HOLDER_DISCOUNT,
        description="The estimated-ttft scorer's sole-holder discount (spec.router.soleHolderDiscount; "
        "docs/router.md; off by default): only where the alternative must evict, bounded by slo.ttftP95Ms.",
    )
    eviction_cost: bool = Field(
        default=DEFAULT_EVICTION_COST,
        description="The estimated-ttft scorer's eviction cost (spec.router.evictionCost; docs/router.md; off by "
        "default): a full cache pays for what it would evict while another candidate has room.",
    )
    burst_rearm_seconds: float = Field(
        default=15.0, gt=0,
        description="A burst of arrivals wakes the autoscaler through /admin/held at most once per this many seconds "
                    "(the service's spec.autoscaling.intervalSeconds: the decision it brings forward has seen the burst).",
    )
    block_size: int = Field(default=16, ge=1, description="Default prefix-index block size.")
    max_index_blocks: int = Field(default=1_000_000, ge=1, description="Bound on prefix-index entries (memory).")
    slo: SLOConfig = Field(default_factory=SLOConfig, description="Primary SLOs.")
    fallback: FallbackConfig = Field(default_factory=FallbackConfig, description="Student-pool fallback.")
    feature_store: FeatureStoreConfig = Field(default_factory=FeatureStoreConfig, description="Online lookups.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Timeouts and sizes.")
    outliers: OutlierConfig = Field(default_factory=OutlierConfig, description="Outlier ejection of replicas.")
    tenants: TenantsConfig = Field(default_factory=TenantsConfig, description="API keys and rate limits.")
    request_log: str | None = Field(default=None, description="JSONL request log path (DEVELOPERS.md format).")
    upstream_api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the key the replicas require: sent upstream as a Bearer token "
        "(clients' own Authorization headers never are).",
    )
    log_prompts: bool = Field(default=True, description="Include prompt text in the request log.")
    seed: int = Field(default=0, description="Picker RNG seed (deterministic tie breaks).")

    @model_validator(mode="after")
    def _check(self) -> RouterConfig:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("pool names must be unique")
        if self.pools[0].role != "primary" or sum(p.role == "primary" for p in self.pools) != 1:
            raise ValueError("exactly one primary pool, listed first")
        for name, weight in self.scorers.items():
            if name not in KNOWN_SCORERS:
                raise ValueError(f"unknown scorer {name!r} (known: {', '.join(KNOWN_SCORERS)})")
            if weight < 0:
                raise ValueError(f"scorer {name}: weight must be >= 0")
        return self

    def primary(self) -> PoolConfig:
        return self.pools[0]

    def to_yaml(self) -> str:
        return dump_yaml(self.model_dump(by_alias=True, mode="json", exclude_none=True))

    @classmethod
    def from_yaml(cls, text: str) -> RouterConfig:
        data: Any = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError("router config must be a YAML mapping")
        return cls.model_validate(data)


def load_router_config(path: str | Path) -> RouterConfig:
    """Read router.yaml; raises ValueError (pydantic ValidationError is one) on bad content."""
    return RouterConfig.from_yaml(Path(path).read_text())


def _local_folder(model_path: str) -> str | None:
    # Only local folders can be read by the router; other locations need a folder from model_folders.
    uri = parse_uri(model_path)
    return uri.path if uri.scheme == "local" else None


def _scorers(isvc: InferenceService) -> dict[str, float]:
    """spec.router.scorers, plus the adapter-loaded scorer for a service with LoRA unless the spec weighs it."""
    scorers = {k: v for k, v in isvc.spec.router.scorers.items() if k in KNOWN_SCORERS}
    if isvc.spec.lora is not None:
        scorers.setdefault("adapter-loaded", DEFAULT_ADAPTER_WEIGHT)
    return scorers


_T = TypeVar("_T")


def _priced(price: Callable[..., _T], isvc: InferenceService, view: PoolView) -> _T:
    """`price` (pool_prefill_rate or pool_prefill_speedup) of a pool by the names in its spec."""
    return price(pool_preset(isvc, view), view.resources.gpu_type, gpus=view.resources.gpus,
                 mig_profile=view.resources.mig_profile, tensor_parallel=view.vllm.tensor_parallel_size,
                 quantization=view.model.quantization)


def router_config_from_service(
    isvc: InferenceService,
    endpoints: dict[str, list[str]] | None = None,
    *,
    kv_events_port: int | None = None,
    kv_events_endpoints: dict[str, dict[str, str]] | None = None,
    model_folders: dict[str, str] | None = None,
) -> RouterConfig:
    """The router config for `isvc`. `endpoints` (pool -> base URLs) = static; None = EndpointSlice discovery.

    KV-cache events: for each pool whose replicas publish them (`isvc.publishes_kv_events`), the router
    subscribes to every replica on `kv_events_port` (default KV_EVENTS_PORT, what `render_vllm_args` renders),
    or, for a pool in `kv_events_endpoints` (pool -> replica base URL -> ZMQ endpoint: replicas sharing a host),
    on those endpoints.
    `model_folders`: pool -> the folder where the router finds that pool's model files (the operator mounts or
    fetches them into the router pod); a pool's local model path otherwise.
    """
    spec = isvc.spec
    namespace = isvc.metadata.namespace or "default"
    pools = []
    folders = model_folders or {}
    events_by_pool = kv_events_endpoints or {}
    lora = spec.lora
    for view in isvc.pools():
        folder = folders.get(view.name) or _local_folder(view.model.path)
        primary_lora = view.role == "primary" and lora is not None
        static = None if endpoints is None else list(endpoints.get(view.name, []))
        discovery = (
            None if endpoints is not None
            else KubernetesDiscovery(namespace=namespace, selector=pool_selector(isvc.metadata.name, view.name))
        )
        pools.append(
            PoolConfig(
                name=view.name,
                role=view.role,
                served_names=[view.served_name],
                model_path=folder,
                tokenizer_path=folder,
                block_size=spec.router.block_size_tokens or view.block_size,
                max_model_len=view.model.max_model_len,
                kv_offload_gib=view.vllm.kv_offload_gib,
                tensor_parallel_size=view.vllm.tensor_parallel_size,
                prefill_tokens_per_s=_priced(pool_prefill_rate, isvc, view),
                prefill_speedup=_priced(pool_prefill_speedup, isvc, view),
                dtype=view.model.dtype,
                kv_events_port=(kv_events_port or KV_EVENTS_PORT)
                if isvc.publishes_kv_events(view) and view.name not in events_by_pool else None,
                kv_events_endpoints=events_by_pool.get(view.name) if isvc.publishes_kv_events(view) else None,
                scales_from_zero=view.min_replicas == 0,
                adapters=[AdapterConfig(name=a.name, path=a.engine_path) for a in spec.adapters] if primary_lora else [],
                adapter_slots=lora.slots if primary_lora and lora is not None else 0,
                endpoints=static,
                discovery=discovery,
            )
        )
    fb = spec.fallback
    store = spec.feature_store
    return RouterConfig(
        service=isvc.metadata.name,
        namespace=namespace,
        pools=pools,
        scorers=_scorers(isvc),
        session_affinity_header=spec.router.session_affinity_header,
        burst_rearm_seconds=spec.autoscaling.interval_seconds,
        block_size=spec.router.block_size_tokens or isvc.pools()[0].block_size,
        slo=SLOConfig(ttft_p95_ms=spec.slo.ttft_p95_ms, tpot_p95_ms=spec.slo.tpot_p95_ms, e2e_p99_ms=spec.slo.e2e_p99_ms),
        fallback=FallbackConfig(
            enabled=bool(fb.pools),
            slo_burn_rate=fb.slo_burn_rate,
            max_queue_delay_ms=fb.max_queue_delay_ms,
            long_context_tokens=fb.long_context_tokens,
            sheddable_classes=list(fb.sheddable_classes),
            max_degraded_fraction=fb.max_degraded_fraction,
        ),
        feature_store=FeatureStoreConfig(
            enabled=spec.router.feature_store_lookup,
            url=store.url if store else None,
            url_env=STORE_URL_ENV if store and store.url_secret_ref else None,
            semantic_threshold=store.semantic_threshold if store else 0.92,
            lookup_timeout_ms=store.lookup_timeout_ms if store else 20.0,
        ),
        limits=LimitsConfig(
            max_request_bytes=spec.router.max_request_bytes,
            request_timeout_seconds=spec.router.request_timeout_seconds,
        ),
        tenants=TenantsConfig(
            secret_name=spec.router.api_keys_secret,
            file=TENANTS_MOUNT_PATH if spec.router.api_keys_secret else None,
            require_api_key=spec.router.api_keys_secret is not None,
            limit_share=1.0 / spec.router.replicas,
        ),
        upstream_api_key_env=UPSTREAM_API_KEY_ENV if spec.router.upstream_key_secret else None,
        outliers=spec.router.outliers.model_copy(),
        measure_prefill_rate=spec.router.measure_prefill_rate,
        sole_holder_discount=spec.router.sole_holder_discount,
        eviction_cost=spec.router.eviction_cost,
    )
