"""TrainingJob: FSDP2 training or distillation of a Llama-style decoder on N GPU workers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, model_validator

from llmfleet.api.common import (
    DNS_SUBDOMAIN_PATTERN,
    NODE_SELECTOR_DESCRIPTION,
    TOLERATIONS_DESCRIPTION,
    ApiModel,
    Condition,
    NodeSelector,
    ObjectMeta,
    StatusModel,
    Toleration,
    cel_rules,
)
from llmfleet.api.contracts import TRAINING_METRICS_PORT
from llmfleet.api.lora import LORA_RANKS
from llmfleet.api.storage import DataUri, OutputUri, SourceUri, StorageSpec, parse_uri


class ModelShape(ApiModel):
    """A Llama-style decoder: RMSNorm, RoPE, SwiGLU, MHA/GQA/MQA chosen by kvHeads."""

    model_config = cel_rules(
        ("!has(self.hidden) || !has(self.heads) || self.hidden % self.heads == 0", "hidden must be divisible by heads"),
        ("!has(self.heads) || !has(self.kvHeads) || self.heads % self.kvHeads == 0",
         "heads must be divisible by kvHeads (GQA groups)"),
    )

    family: Literal["llama"] = Field(default="llama", description="Architecture family; only Llama-style decoders.")
    layers: int = Field(default=2, ge=1, le=256, description="Number of transformer blocks.")
    hidden: int = Field(default=128, ge=8, le=65536, description="Model width d.")
    heads: int = Field(default=4, ge=1, le=512, description="Query heads.")
    kv_heads: int | None = Field(
        default=None, ge=1, le=512,
        description="Key/value heads: equal to heads is MHA, 1 is MQA, in between is GQA. Defaults to heads.",
    )
    ffn: int | None = Field(default=None, ge=8, description="SwiGLU hidden size; defaults to the Llama rule (8/3·d rounded to 256).")
    vocab: int = Field(default=4096, ge=16, le=1_048_576, description="Vocabulary size.")
    seq_len: int = Field(default=256, ge=8, le=1_048_576, description="Training sequence length in tokens.")
    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base frequency.")
    sliding_window: int | None = Field(
        default=None, ge=1, description="Sliding-window (sparse) attention width in tokens; uses FlexAttention where available."
    )
    tie_embeddings: bool = Field(default=False, description="Share the input embedding and output projection weights.")

    @model_validator(mode="after")
    def _check_shape(self) -> ModelShape:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.n_kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kvHeads ({self.n_kv_heads})")
        if (self.hidden // self.heads) % 2:
            raise ValueError("head dimension (hidden/heads) must be even for RoPE")
        return self

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_dim(self) -> int:
        if self.ffn:
            return self.ffn
        return 256 * ((int(8 * self.hidden / 3) + 255) // 256)


class DataSpec(ApiModel):
    """Tokenized training data (written by `llmfleet data prepare`)."""

    path: DataUri = Field(
        min_length=1, description="Token shards with a manifest.json: pvc://claim/path, s3://bucket/prefix or a "
        "local folder."
    )
    tokenizer: SourceUri | None = Field(
        default=None, description="Tokenizer folder or tokenizer.json: pvc://, s3://, hf:// or a local path; copied into "
        "exported models."
    )


class LRSchedule(ApiModel):
    """Learning-rate schedule: linear warmup then decay."""

    peak: float = Field(default=3e-4, gt=0, le=1, description="Peak learning rate.")
    min: float = Field(default=3e-5, ge=0, le=1, description="Final learning rate.")
    warmup_steps: int = Field(default=10, ge=0, description="Linear warmup steps.")
    decay: Literal["cosine", "linear", "constant"] = Field(default="cosine", description="Shape of the decay after warmup.")


class Float8Spec(ApiModel):
    """torchao float8 training of the transformer blocks' linear layers (precision: fp8)."""

    scaling: Literal["tensorwise", "rowwise"] = Field(
        default="tensorwise",
        description="Scale granularity: tensorwise (one scale per tensor, fastest) or rowwise (one per row; "
                    "more robust to outliers, slower on H100/H200).",
    )
    fsdp_all_gather: bool = Field(
        default=True,
        description="Under FSDP2, all-gather the weights in float8 (half the bytes of bf16); tensorwise scaling only.",
    )


class Optimization(ApiModel):
    """Batch sizes, steps, schedule and the compute knobs of the training loop."""

    global_batch_tokens: int = Field(default=4096, ge=1, description="Tokens per optimizer step across all ranks.")
    micro_batch: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        default=1,
        description="Sequences per rank per forward/backward; 'auto' probes once for the largest that fits with a "
                    "memory margin (a divisor of the sequences per rank per step) and reports it in status.",
    )
    steps: int = Field(default=100, ge=1, description="Optimizer steps to train.")
    lr: LRSchedule = Field(default_factory=LRSchedule, description="Learning-rate schedule.")
    weight_decay: float = Field(default=0.1, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(default=1.0, ge=0, description="Global gradient-norm clip; 0 disables.")
    precision: Literal["bf16", "fp32", "fp8"] = Field(
        default="bf16",
        description="Compute dtype: bf16 (fp32 master weights and gradient reduction), fp32, or fp8 (torchao float8 "
                    "matmuls in the transformer blocks' linear layers, everything else bf16; needs fp8 tensor cores).",
    )
    float8: Float8Spec = Field(default_factory=Float8Spec, description="float8 settings, used when precision is fp8.")
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        default="none", description="Recompute activations in backward: none, selective (every other block) or full."
    )
    compile: bool = Field(default=False, description="torch.compile each transformer block.")
    seed: int = Field(default=1234, description="Random seed (model init, data order).")
    deterministic: bool = Field(default=False, description="Use deterministic algorithms so resumed runs reproduce losses exactly.")


class FSDPSpec(ApiModel):
    """FSDP2 (fully_shard) settings."""

    reshard_after_forward: bool = Field(default=True, description="Free gathered parameters after forward (ZeRO-3); false keeps them (ZeRO-2-like).")
    replicate_groups: int = Field(
        default=1, ge=1, description="HSDP: number of replica groups; world size must be divisible by it. 1 is plain FSDP."
    )


class DistillationSpec(ApiModel):
    """Train this (student) model on a teacher's soft targets."""

    teacher: SourceUri = Field(
        min_length=1, description="Teacher model in Hugging Face format (pvc://, s3://, hf:// or a local folder), e.g. "
        "another TrainingJob's output.path."
    )
    temperature: float = Field(default=2.0, gt=0, le=100, description="Softmax temperature for KL(teacher || student).")
    alpha: float = Field(default=0.5, ge=0, le=1, description="Weight of the KL term; 1-alpha weighs the LM loss.")


LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_LORA_TARGETS: tuple[LoraTarget, ...] = ("q_proj", "v_proj")


class LoraTrainingSpec(ApiModel):
    """LoRA fine-tuning (method: lora): a frozen base model plus trained low-rank updates, exported as a PEFT
    adapter (adapter_config.json + adapter_model.safetensors) that vLLM loads."""

    base_model: str = Field(min_length=1, description="Hugging Face Llama folder whose weights are frozen and adapted; "
                            "the model shape comes from its config.json (spec.model only sets seqLen).")
    rank: int = Field(default=8, description=f"LoRA rank r (one of {', '.join(map(str, LORA_RANKS))}, the ranks vLLM serves).",
                      json_schema_extra={"enum": list(LORA_RANKS)})  # the API server refuses other ranks too
    alpha: float = Field(default=16.0, gt=0, description="LoRA alpha: the update is scaled by alpha / rank.")
    targets: list[LoraTarget] = Field(default_factory=lambda: list(DEFAULT_LORA_TARGETS), min_length=1,
                                      description="Projections that get a LoRA update.")

    @model_validator(mode="after")
    def _check(self) -> LoraTrainingSpec:
        if self.rank not in LORA_RANKS:
            raise ValueError(f"rank {self.rank} is not one of {', '.join(map(str, LORA_RANKS))} (the ranks vLLM serves)")
        return self


class CheckpointSpec(ApiModel):
    """Where and how often to save sharded checkpoints (torch.distributed.checkpoint)."""

    uri: str = Field(default="/checkpoints", min_length=1, description="Checkpoint folder (on the PVC when pvc is set).")
    pvc: str | None = Field(default=None, description="PersistentVolumeClaim mounted at the checkpoint folder.")
    interval: int = Field(default=50, ge=1, description="Save every N steps (and at the end).")
    keep: int = Field(default=2, ge=1, description="Number of checkpoints kept.")
    async_save: bool = Field(default=True, description="Save asynchronously where torch supports it.")


class WorkersSpec(ApiModel):
    """The worker pods: one torchrun per pod."""

    count: int = Field(default=1, ge=1, le=4096, description="Worker pods (nodes).")
    gpus_per_worker: int = Field(default=0, ge=0, le=16, description="GPUs per worker = processes per pod; 0 runs one CPU process (gloo).")
    gpu_type: str | None = Field(
        default=None, description="GPU model, e.g. H200: the peak FLOP/s for MFU, and a required node affinity on "
                                  "nvidia.com/gpu.product for every product name of the type unless nodeSelector is set.")
    node_selector: NodeSelector | None = Field(default=None, description=NODE_SELECTOR_DESCRIPTION)
    tolerations: list[Toleration] | None = Field(default=None, max_length=32, description=TOLERATIONS_DESCRIPTION)
    cpu: str = Field(default="4", description="CPU request per worker (Kubernetes quantity).")
    memory: str = Field(default="16Gi", description="Memory request per worker (Kubernetes quantity).")
    image: str | None = Field(default=None, description="Training image; the operator's default when omitted.")

    @property
    def world_size(self) -> int:
        return self.count * max(1, self.gpus_per_worker)


class SchedulingSpec(ApiModel):
    """Priority and gang scheduling."""

    priority: int = Field(default=0, description="llmfleet priority; serving may suspend lower-priority jobs to get GPUs.")
    priority_class_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
                                            description="Kubernetes PriorityClass for the worker pods.")
    queue: str | None = Field(default=None, description="Kueue LocalQueue name; the Job is created suspended and Kueue admits it.")
    gang: bool = Field(default=True, description="All workers start together (Kueue or a scheduler-plugins PodGroup).")


class ProfilingSpec(ApiModel):
    """Record a torch.profiler trace per rank for a window of steps."""

    start_step: int = Field(default=5, ge=0, description="First profiled step.")
    steps: int = Field(default=2, ge=1, le=100, description="Number of profiled steps.")
    path: str | None = Field(default=None, description="Trace folder; defaults to <checkpoint uri>/traces.")


class PromotionTarget(ApiModel):
    """The serving pool that receives the exported model when the job succeeds."""

    inference_service: str = Field(min_length=1, description="InferenceService name in the same namespace.")
    pool: str = Field(default="primary", min_length=1, description="Pool name: 'primary' or a fallback pool's name.")
    adapter_name: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="method lora: the adapter is added to (or replaced in) the InferenceService's spec.adapters under "
        "this name (the TrainingJob's name when unset), instead of replacing the pool's model.",
    )


class OutputSpec(ApiModel):
    """Export of the final model in a servable Hugging Face format."""

    path: OutputUri = Field(
        min_length=1, description="Where config.json, model.safetensors and the tokenizer are written: pvc://claim/path "
        "or s3://bucket/prefix (what promotion hands the serving pool), or a local folder (llmfleet train)."
    )
    promote_to: PromotionTarget | None = Field(
        default=None, description="Roll the exported model out to this pool on success (a full model's path must then "
        "be pvc:// or s3://: the pool reads the model from there)."
    )


class MetricsSpec(ApiModel):
    """Training metrics and straggler detection."""

    port: int = Field(default=TRAINING_METRICS_PORT, ge=1024, le=65535, description="Prometheus endpoint port on every rank.")
    peak_tflops: float | None = Field(default=None, gt=0, description="Peak dense bf16 TFLOP/s per GPU for MFU; from the GPU table when omitted.")
    straggler_factor: float = Field(default=1.3, gt=1, description="Flag ranks whose step time exceeds the median by this factor.")
    log_every: int = Field(default=10, ge=1, description="Log and report every N steps.")


class TrainingJobSpec(ApiModel):
    """Desired state of a TrainingJob."""

    model_config = cel_rules(
        ("!has(self.output) || !has(self.output.promoteTo) || (has(self.method) && self.method == 'lora') || "
         "self.output.path.startsWith('pvc://') || self.output.path.startsWith('s3://')",
         "output.promoteTo needs a pvc:// or s3:// output.path (the serving pool reads the model from there)"),
    )

    model: ModelShape = Field(description="Model architecture.")
    data: DataSpec = Field(description="Training data.")
    optimization: Optimization = Field(default_factory=Optimization, description="Batching, schedule and compute settings.")
    fsdp: FSDPSpec = Field(default_factory=FSDPSpec, description="FSDP2/HSDP sharding.")
    distillation: DistillationSpec | None = Field(default=None, description="Distill from a teacher when set.")
    method: Literal["full", "lora"] = Field(default="full", description="full: train every weight; lora: train a "
                                            "LoRA adapter of spec.lora.baseModel and export it in the PEFT format.")
    lora: LoraTrainingSpec | None = Field(default=None, description="LoRA settings (method: lora).")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    workers: WorkersSpec = Field(default_factory=WorkersSpec, description="Worker pods and GPUs.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Priority, queue and gang scheduling.")
    profiling: ProfilingSpec | None = Field(default=None, description="Profile a window of steps when set.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Metrics endpoint and straggler detection.")
    output: OutputSpec | None = Field(default=None, description="Export (and optional promotion) of the trained model.")
    max_restarts: int = Field(default=3, ge=0, le=100, description="Times the workers are recreated after a failure, resuming from the last checkpoint.")
    suspend: bool = Field(default=False, description="Suspend the workers (after a checkpoint); false resumes from it.")
    storage: StorageSpec = Field(
        default_factory=StorageSpec, description="Endpoints and credentials of s3:// and hf:// locations, and their cache."
    )

    @model_validator(mode="after")
    def _check_batching(self) -> TrainingJobSpec:
        world = self.workers.world_size
        if world % self.fsdp.replicate_groups:
            raise ValueError(
                f"fsdp.replicateGroups ({self.fsdp.replicate_groups}) must divide the world size "
                f"(workers.count x gpusPerWorker = {world})"
            )
        mb = self.optimization.micro_batch
        per_step = (1 if mb == "auto" else mb) * self.model.seq_len * world
        if self.optimization.global_batch_tokens % per_step:
            raise ValueError(
                f"optimization.globalBatchTokens ({self.optimization.global_batch_tokens}) must be a multiple of "
                f"{'' if mb == 'auto' else 'microBatch x '}seqLen x world size ({per_step})"
            )
        if self.optimization.lr.min > self.optimization.lr.peak:
            raise ValueError("optimization.lr.min must not exceed optimization.lr.peak")
        if self.method == "lora" and self.lora is None:
            raise ValueError("method lora needs spec.lora (baseModel, rank, alpha, targets)")
        if self.method != "lora" and self.lora is not None:
            raise ValueError("spec.lora is set but spec.method is full; set method: lora")
        if self.method == "lora" and self.distillation is not None:
            raise ValueError("spec.distillation with method lora is not supported; distill a full model instead")
        if self.method == "lora" and self.optimization.precision == "fp8":
            raise ValueError("optimization.precision fp8 with method lora is not supported (the float8 linears are "
                             "for full training); use bf16")
        if self.output and self.output.promote_to and self.output.promote_to.adapter_name and self.method != "lora":
            raise ValueError("output.promoteTo.adapterName is for method lora (a full model replaces the pool's model)")
        out = self.output
        if out and out.promote_to and self.method != "lora" and parse_uri(out.path).scheme not in ("pvc", "s3"):
            raise ValueError(
                f"output.path {out.path!r}: promoteTo hands this location to the serving pool, so it must be pvc:// "
                "or s3:// (a local folder exists only inside the training pod)"
            )
        return self

    @property
    def sequences_per_rank(self) -> int:
        """Sequences each rank processes per optimizer step (micro-batch x accumulation steps)."""
        return self.optimization.global_batch_tokens // (self.model.seq_len * self.workers.world_size)

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step; with microBatch 'auto' the worker's probe decides (None here)."""
        mb = self.optimization.micro_batch
        if mb == "auto":
            raise ValueError("microBatch is 'auto': the worker chooses it (status.microBatch)")
        return self.sequences_per_rank // mb


TrainingPhase = Literal["Pending", "Running", "Suspended", "Restarting", "Succeeded", "Failed", "Invalid"]


class PromotionStatus(StatusModel):
    """Progress of rolling the exported model out to a serving pool."""

    inference_service: str = Field(description="Target InferenceService.")
    pool: str = Field(description="Target pool.")
    state: Literal["Pending", "RollingOut", "Succeeded", "RolledBack"] = Field(description="Rollout state.")
    message: str = Field(default="", description="Details.")


class TrainingJobStatus(StatusModel):
    """Observed state of a TrainingJob."""

    phase: TrainingPhase | None = Field(default=None, description="Lifecycle phase.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, Degraded; PromotionTarget when output.promoteTo is set (False while the InferenceService or pool does not exist).")
    observed_generation: int | None = Field(default=None, description="Generation last reconciled.")
    step: int | None = Field(default=None, description="Last completed optimizer step (rank 0).")
    loss: float | None = Field(default=None, description="Last training loss.")
    tokens_per_second: float | None = Field(default=None, description="Throughput across all ranks.")
    mfu: float | None = Field(default=None, description="Model FLOPs utilization, 0-1 (PaLM appendix B).")
    hfu: float | None = Field(default=None, description="Hardware FLOPs utilization, 0-1 (counts recomputation).")
    micro_batch: int | None = Field(
        default=None, description="Micro-batch in use (the probe's choice when spec.optimization.microBatch is auto)."
    )
    last_checkpoint: str | None = Field(default=None, description="Path of the last complete checkpoint.")
    restarts: int = Field(default=0, description="Times the workers were recreated.")
    start_time: datetime | None = Field(default=None, description="When the workers first started.")
    completion_time: datetime | None = Field(default=None, description="When the job succeeded or failed.")
    stragglers: list[int] = Field(default_factory=list, description="Ranks currently flagged as stragglers.")
    promotion: PromotionStatus | None = Field(default=None, description="Model promotion to serving, when configured.")


class TrainingJob(ApiModel):
    """A TrainingJob resource (llmfleet.io/v1alpha1)."""

    api_version: Literal["llmfleet.io/v1alpha1"] = Field(default="llmfleet.io/v1alpha1", description="API version.")
    kind: Literal["TrainingJob"] = Field(default="TrainingJob", description="Kind.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: TrainingJobSpec = Field(description="Desired state.")
    status: TrainingJobStatus | None = Field(default=None, description="Observed state.")
