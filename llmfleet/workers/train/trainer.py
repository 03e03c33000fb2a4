"""The Trainer: builds the parallelized model, runs the loop, reports metrics, checkpoints and exports."""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from llmfleet.api.contracts import now_iso
from llmfleet.api.trainingjob import TrainingJobSpec
from llmfleet.plan.training import hardware_flops_per_token, model_flops_per_token
from llmfleet.util.net import free_port
from llmfleet.workers.train import float8, microbatch
from llmfleet.workers.train import metrics as fl
from llmfleet.workers.train.checkpoint import Checkpointer
from llmfleet.workers.train.data import TokenData
from llmfleet.workers.train.graceful import StopRequest
from llmfleet.workers.train.model import ModelArgs, Transformer
from llmfleet.workers.train.parallelize import build_mesh, parallelize

log = logging.getLogger("llmfleet.train")


def init_distributed() -> tuple[int, int, int, torch.device]:
    """Rank, world size, local rank and device; a lone process (no torchrun) becomes a world of one."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available() and os.environ.get("LLMFLEET_DEVICE", "") != "cpu"
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        # NCCL for the collectives of training, gloo for DCP's CPU-side coordination (async save).
        backend = "cuda:nccl,cpu:gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, device_id=device if use_cuda else None)
    return rank, world, local, device


def lr_lambda(spec: TrainingJobSpec) -> Any:
    lr = spec.optimization.lr
    total, warm = spec.optimization.steps, lr.warmup_steps
    floor = lr.min / lr.peak

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if lr.decay == "constant" or total <= warm:
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total - warm))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if lr.decay == "cosine" else 1 - progress
        return floor + (1 - floor) * shape

    return f


class Trainer:
    def __init__(self, spec: TrainingJobSpec) -> None:
        self.spec = spec
        # First: a SIGTERM during set-up (loading a teacher can take minutes) must not kill the process either.
        self.stop = StopRequest()
        self.stop.install()
        self.rank, self.world, self.local_rank, self.device = init_distributed()
        opt = spec.optimization
        seqs_per_rank, rest = divmod(opt.global_batch_tokens, spec.model.seq_len * self.world)
        if rest or (opt.micro_batch != "auto" and seqs_per_rank % opt.micro_batch):
            raise ValueError(f"globalBatchTokens ({opt.global_batch_tokens}) is not a multiple of microBatch x "
                             f"seqLen x world size ({opt.micro_batch} x {spec.model.seq_len} x {self.world})")
        self.seqs_per_rank = seqs_per_rank
        self.micro_batch = 1 if opt.micro_batch == "auto" else opt.micro_batch  # the probe may raise it
        self.accum = seqs_per_rank // self.micro_batch
        emulate = os.environ.get("LLMFLEET_FLOAT8_EMULATE") == "1"  # CPU tests of the fp8 path only
        if opt.precision == "fp8":
            float8.check_device(self.device, emulate=emulate)
        if opt.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(opt.seed)
        self.args = ModelArgs.from_shape(spec.model)
        self.data = TokenData.open(spec.data.path, spec.model.seq_len, opt.seed)

        self.mesh = build_mesh(self.device.type, self.world, spec.fsdp.replicate_groups)
        param_dtype = torch.float32 if opt.precision == "fp32" else torch.bfloat16
        # Without FSDP (a world of one) mixed precision comes from autocast: fp32 weights, bf16 matmuls
        # (fp8 ones in the float8 linears, which run under the same autocast).
        self.autocast = self.world == 1 and param_dtype == torch.bfloat16
        fp8 = opt.precision == "fp8"
        # LLMFLEET_RESIDUAL_BF16=0 keeps the one-device residual stream in fp32 (to measure what bf16 buys).
        self.residual_bf16 = os.environ.get("LLMFLEET_RESIDUAL_BF16", "1") != "0"
        lora = spec.lora if spec.method == "lora" else None
        if lora is not None:
            # The base model's weights (frozen) plus LoRA updates, wrapped before sharding: FSDP2 shards the
            # frozen and the trainable parameters of a block together and reduces gradients of the trainable only.
            from llmfleet.workers.train.export import load_hf
            from llmfleet.workers.train.lora import apply_lora

            model = load_hf(lora.base_model, dtype=torch.float32, device=self.device)
            self.args = model.args
            apply_lora(model, lora.rank, lora.alpha, lora.targets)
        else:
            with torch.device("meta"):
                model = Transformer(self.args)
        if self.data.vocab > self.args.vocab:
            raise ValueError(f"data vocabulary ({self.data.vocab}) exceeds the model's vocabulary ({self.args.vocab})")
        self.model = parallelize(
            model, self.mesh, activation_checkpointing=opt.activation_checkpointing, compile=opt.compile,
            param_dtype=param_dtype, reshard_after_forward=spec.fsdp.reshard_after_forward,
            float8_scaling=opt.float8.scaling if fp8 else None, float8_all_gather=opt.float8.fsdp_all_gather,
            float8_emulate=emulate,
            residual_dtype=torch.bfloat16 if self.autocast and self.residual_bf16 else None,
        )
        # Float8 all-gather (FSDP2, tensorwise): the weights' scales are computed once after each optimizer step.
        self.float8_precompute = (fp8 and self.world > 1 and opt.float8.scaling == "tensorwise"
                                  and opt.float8.fsdp_all_gather)
        if lora is None:
            self.model.to_empty(device=self.device)
            self.model.init_weights(opt.seed)

        trainable = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in trainable if p.ndim >= 2]
        no_decay = [p for p in trainable if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(groups, lr=opt.lr.peak, betas=(0.9, 0.95), eps=1e-8,
                                           fused=fused, foreach=None if fused else True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(spec))
        # Gradient clipping folded into fused AdamW: the clip factor goes in as the optimizer's grad_scale
        # (the kernel divides each gradient by it while it reads it), which saves a read + write of every
        # gradient. Plain tensors only (one device, no FSDP DTensors); LLMFLEET_CLIP_IN_OPTIMIZER=0 turns it off.
        self.clip_in_optimizer = (fused and self.world == 1
                                  and os.environ.get("LLMFLEET_CLIP_IN_OPTIMIZER", "1") != "0")

        self.teacher: Transformer | None = None
        if spec.distillation:
            from llmfleet.workers.train.export import load_hf

            self.teacher = load_hf(spec.distillation.teacher, dtype=param_dtype, device=self.device).eval()
            self.teacher.requires_grad_(False)
            if self.teacher.args.vocab != self.args.vocab:
                raise ValueError(f"teacher vocabulary ({self.teacher.args.vocab}) differs from the student's "
                                 f"({self.args.vocab})")

        self.ckpt_root = Path(spec.checkpoint.uri)
        if self.rank == 0:
            self.ckpt_root.mkdir(parents=True, exist_ok=True)
        self.checkpointer = Checkpointer(self.ckpt_root, spec.checkpoint.keep, spec.checkpoint.async_save, self.rank)
        self.step = 0
        self._save_s = 0.0  # duration of the last save (its synchronous part): the stop's flush estimate
        self._saved_step: int | None = None
        self.peak = fl.peak_tflops(
            torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None, spec.metrics.peak_tflops
        )
        self.flops_token = model_flops_per_token(spec.model)
        self.hw_flops_token = hardware_flops_per_token(spec.model, activation_checkpointing=opt.activation_checkpointing)
        self.metrics = fl.TrainMetrics(self.rank)
        self.status: dict[str, Any] = {
            "step": 0, "totalSteps": opt.steps, "loss": None, "tokensPerSecond": None, "mfu": None, "hfu": None,
            "lastCheckpoint": None, "stragglers": [], "done": False, "worldSize": self.world,
            "microBatch": self.micro_batch, "gradAccumulation": self.accum, "precision": opt.precision,
        }
        self.history: list[dict[str, Any]] = []
        # Straggler detection measures per-rank local work (data loading + optimizer step), not wall time:
        # synchronous collectives make every rank's wall time equal to the slowest rank's.
        self._local_host_s = 0.0
        self._opt_events: list[tuple[Any, Any]] = []
        slow = os.environ.get("LLMFLEET_SLOW_RANK")  # "RANK:SECONDS", fault injection for tests
        self._slow_rank = (int(slow.split(":")[0]), float(slow.split(":")[1])) if slow else None
        self.server: fl.MetricsServer | None = None
        port_env = os.environ.get("LLMFLEET_METRICS_PORT")
        port = int(port_env) if port_env is not None else spec.metrics.port + self.local_rank
        if port >= 0:
            self.server = fl.MetricsServer(self.metrics, port if port == 0 else port,
                                           status=(lambda: dict(self.status)) if self.rank == 0 else None)

    # ------------------------------------------------------------------ state
    def resume(self) -> bool:
        state = self.checkpointer.load_latest(self.model, self.optimizer)
        if state is None:
            return False
        self.step = int(state["step"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._saved_step = self.step
        self.status.update(step=self.step, lastCheckpoint=self.checkpointer.last)
        if self.rank == 0:
            log.info("resumed from %s at step %d (saved by %s ranks, now %d)", self.checkpointer.last, self.step,
                     state.get("world_size"), self.world)
        return True

    def save(self) -> None:
        state = {"step": self.step, "scheduler": self.scheduler.state_dict(), "world_size": self.world,
                 "samples": self.step * self.spec.optimization.global_batch_tokens // self.spec.model.seq_len}
        t0 = time.perf_counter()
        self.checkpointer.save(self.step, self.model, self.optimizer, state)
        self._save_s = time.perf_counter() - t0
        self._saved_step = self.step
        self.metrics.checkpoints.inc()
        self.status["lastCheckpoint"] = self.checkpointer.last

    def _stop_agreed(self) -> bool:
        """Whether any rank got SIGTERM: a one-element all-reduce on the CPU (gloo), so no GPU sync."""
        flag = torch.tensor([1.0 if self.stop.requested else 0.0])
        if self.world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def _stop_now(self, save_checkpoints: bool) -> None:
        """Flush a checkpoint of the current step (unless the last save will not fit in the time left: then
        the previous checkpoint stands), wait for in-flight saves, and say so in the status."""
        self.checkpointer.wait()
        remaining = self.stop.remaining_s()
        flushed = False
        if save_checkpoints and self._saved_step != self.step:
            if self._save_s * 1.5 < remaining:
                self.save()
                self.checkpointer.wait()
                flushed = True
            elif self.rank == 0:
                log.warning("no time to save step %d (last save took %.1f s, %.1f s left): resuming from %s",
                            self.step, self._save_s, remaining, self.checkpointer.last)
        self.status["stopped"] = {
            "reason": self.stop.signal or "SIGTERM", "step": self.step, "checkpoint": self.checkpointer.last,
            "checkpointStep": self._saved_step, "flushed": flushed,
            "at": now_iso(),
        }
        if self.rank == 0:
            log.info("stopped at step %d on %s; resume from %s", self.step, self.status["stopped"]["reason"],
                     self.checkpointer.last)

    def _publish(self) -> None:
        if self.rank != 0:
            return
        self.status["updatedAt"] = now_iso()
        fl.write_status(self.ckpt_root, self.status)

    # ------------------------------------------------------------------ loop
    def _loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self._loss_inner(tokens, targets)

    def _loss_inner(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.teacher is None or self.spec.distillation is None:
            return self.model(tokens, targets), None
        d = self.spec.distillation
        logits = self.model(tokens).float()
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        with torch.no_grad():
            t_logits = self.teacher(tokens).float()
        t_logp = F.log_softmax(t_logits / d.temperature, dim=-1).view(-1, logits.shape[-1])
        s_logp = F.log_softmax(logits / d.temperature, dim=-1).view(-1, logits.shape[-1])
        kl = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean")  # KL(teacher || student) per token
        loss = d.alpha * kl * d.temperature**2 + (1 - d.alpha) * ce
        return loss, kl.detach()

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        opt = self.spec.optimization
        loss_sum = torch.zeros((), device=self.device)
        kl_sum: torch.Tensor | None = None
        for micro in range(self.accum):
            t0 = time.perf_counter()
            with torch.profiler.record_function("llmfleet.data"):
                x, y = self.data.batch(self.step, micro, micro_batch=self.micro_batch, accum=self.accum,
                                       rank=self.rank, world=self.world)
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                if self._slow_rank and self._slow_rank[0] == self.rank:
                    time.sleep(self._slow_rank[1])  # fault injection (LLMFLEET_SLOW_RANK) for straggler tests
            self._local_host_s += time.perf_counter() - t0
            if self.accum > 1 and hasattr(self.model, "set_requires_gradient_sync"):
                # Reduce-scatter gradients once per step, on the last micro-batch.
                self.model.set_requires_gradient_sync(micro == self.accum - 1)  # type: ignore[operator]
            loss, kl = self._loss(x, y)
            (loss / self.accum).backward()  # type: ignore[no-untyped-call]
            loss_sum += loss.detach() / self.accum
            if kl is not None:
                kl_sum = (kl / self.accum) if kl_sum is None else kl_sum + kl / self.accum
        norm = self._clip(opt.grad_clip)
        # The optimizer step is purely local work (no collective): timing it per rank exposes a slow device
        # that FSDP's per-layer collectives would otherwise hide (fast ranks just wait for it).
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            self.optimizer.step()
            end.record()
            self._opt_events.append((start, end))
        else:
            t0 = time.perf_counter()
            self.optimizer.step()
            self._local_host_s += time.perf_counter() - t0
        if self.float8_precompute:
            float8.precompute_scales(self.model)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, norm, kl_sum

    def _clip(self, max_norm: float) -> torch.Tensor:
        """Global gradient norm (multi-tensor kernels) and clipping to max_norm (0 = no clipping)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if max_norm > 0:
            if self.clip_in_optimizer:
                # fused AdamW divides every gradient by grad_scale as it reads it: 1 / clip coefficient.
                self.optimizer.grad_scale = torch.clamp(norm / max_norm, min=1.0)  # type: ignore[attr-defined]
            else:
                torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), max_norm, norm)
        if hasattr(norm, "full_tensor"):  # FSDP: a DTensor of partial norms -> the global norm
            norm = norm.full_tensor()
        return norm

    def _probe_step(self, mb: int) -> None:
        """One forward + backward at micro-batch mb on random tokens (microBatch auto's probe)."""
        gen = torch.Generator(device=self.device).manual_seed(0)
        tokens = torch.randint(0, self.args.vocab, (mb, self.args.seq_len + 1), device=self.device, generator=gen)
        loss, _ = self._loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()  # type: ignore[no-untyped-call]

    def choose_micro_batch(self) -> microbatch.ProbeResult:
        """microBatch auto: probe once (before the first step), then fix micro-batch and accumulation."""
        state_bytes = 2.0 * sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() * 4 for p in self.model.parameters()
        )  # AdamW's exp_avg and exp_avg_sq in fp32, not allocated until the first step

        def agree(v: int) -> int:
            t = torch.tensor([v], device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            return int(t.item())

        result = microbatch.probe(self._probe_step, self.seqs_per_rank, self.device, state_bytes, agree, self.world)
        self.optimizer.zero_grad(set_to_none=True)
        self.micro_batch, self.accum = result.micro_batch, self.seqs_per_rank // result.micro_batch
        self.status.update(microBatch=self.micro_batch, gradAccumulation=self.accum, microBatchReason=result.reason)
        if self.rank == 0:
            log.info("microBatch auto: %d x %d accumulation (%s)", self.micro_batch, self.accum, result.reason)
        return result

    def train(self, save_checkpoints: bool = True) -> list[dict[str, Any]]:
        """Run to spec.optimization.steps; returns one history entry per step (rank 0 also appends them to
        <checkpoint uri>/train_log.jsonl). save_checkpoints=False is for benchmarks."""
        spec, opt = self.spec, self.spec.optimization
        prof_spec = spec.profiling
        prof: Any = None
        fail_at = int(os.environ.get("LLMFLEET_FAIL_AT_STEP", "-1"))  # fault injection for resume tests
        tokens_per_step = opt.global_batch_tokens
        pending: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        window_start, window_steps = time.perf_counter(), 0
        if opt.micro_batch == "auto" and "microBatchReason" not in self.status:
            self.choose_micro_batch()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        while self.step < opt.steps:
            if prof_spec and self.step == prof_spec.start_step:
                prof = self._start_profiler()
            loss, norm, kl = self.train_step()
            self.step += 1
            window_steps += 1
            pending.append((self.step, loss, norm, kl))
            if prof is not None and prof_spec and self.step >= prof_spec.start_step + prof_spec.steps:
                self._stop_profiler(prof)
                prof = None
            last = self.step == opt.steps
            if self.step % spec.metrics.log_every == 0 or last or self.step == fail_at:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                elapsed = time.perf_counter() - window_start
                self._report(pending, elapsed / window_steps, tokens_per_step)
                pending, window_start, window_steps = [], time.perf_counter(), 0
            if save_checkpoints and (self.step % spec.checkpoint.interval == 0 or last):
                self.save()
                window_start = time.perf_counter()  # keep checkpoint time out of step time
            self._publish()
            if self.step == fail_at:
                self.checkpointer.wait()
                log.warning("LLMFLEET_FAIL_AT_STEP=%d: exiting without cleanup", fail_at)
                os._exit(17)
            if self.step < opt.steps and self._stop_agreed():
                if pending:  # report the steps of the open logging window before leaving
                    self._report(pending, (time.perf_counter() - window_start) / window_steps, tokens_per_step)
                    pending = []
                self._stop_now(save_checkpoints)
                break
        if prof is not None:
            self._stop_profiler(prof)
        self.checkpointer.wait()
        return self.history

    def _report(self, pending: list[Any], step_time: float, tokens_per_step: int) -> None:
        # One collective for the window: losses, norms, KLs (summed) and every rank's step time (gathered).
        vals = torch.stack([torch.stack([p[1], p[2].to(p[1].dtype),
                                         p[3] if p[3] is not None else torch.zeros((), device=self.device)])
                            for p in pending]).float()
        dist.all_reduce(vals, op=dist.ReduceOp.SUM)
        vals = (vals / self.world).cpu()
        n = len(pending)
        local = self._local_host_s + sum(a.elapsed_time(b) for a, b in self._opt_events) / 1e3
        self._local_host_s, self._opt_events = 0.0, []
        times = [torch.zeros(2, device=self.device) for _ in range(self.world)]
        dist.all_gather(times, torch.tensor([step_time, local / n], device=self.device))
        step_times = [float(t[0].item()) for t in times]
        local_times = [float(t[1].item()) for t in times]
        # Ignore differences below 2% of a step: timer noise on tiny local sections.
        slow = fl.stragglers(local_times, self.spec.metrics.straggler_factor, min_gap=0.02 * max(step_times))
        slowest = max(step_times)
        tps = tokens_per_step / slowest
        per_device = tps / self.world
        mfu = fl.utilization(self.flops_token, per_device, self.peak)
        hfu = fl.utilization(self.hw_flops_token, per_device, self.peak)
        if self.device.type == "cuda":
            mem = float(torch.cuda.max_memory_allocated(self.device))
        else:
            mem = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        lr = self.scheduler.get_last_lr()[0]
        for (step, *_), row in zip(pending, vals.tolist(), strict=True):
            entry = {"step": step, "loss": row[0], "gradNorm": row[1], "lr": lr, "stepTime": step_time,
                     "tokensPerSecond": tps, "mfu": mfu, "hfu": hfu, "memoryPeakBytes": mem, "stepTimes": step_times,
                     "localTimes": local_times, "stragglers": slow}
            if self.teacher is not None:
                entry["kl"] = row[2]
            self.history.append(entry)
        m = self.metrics
        m.step.set(self.step)
        m.loss.set(vals[-1, 0].item())
        m.grad_norm.set(vals[-1, 1].item())
        m.tokens_per_second.set(tps)
        m.step_seconds.set(step_time)
        m.mfu.set(mfu or 0.0)
        m.hfu.set(hfu or 0.0)
        m.memory_bytes.set(mem)
        m.lr.set(lr)
        m.stragglers.set(len(slow))
        m.tokens.inc(tokens_per_step // self.world * len(pending))
        if self.teacher is not None:
            m.kl.set(vals[-1, 2].item())
        self.status.update(step=self.step, loss=vals[-1, 0].item(), tokensPerSecond=tps, mfu=mfu, hfu=hfu,
                           stragglers=slow, stepTime=step_time, gradNorm=vals[-1, 1].item(), memoryPeakBytes=mem)
        if self.rank == 0:
            with (self.ckpt_root / "train_log.jsonl").open("a") as f:
                for e in self.history[-len(pending):]:
                    f.write(json.dumps(e) + "\n")
            log.info("step %d loss %.4f tok/s %.0f step %.3fs mfu %s%s", self.step, vals[-1, 0].item(), tps,
                     step_time, f"{mfu:.3f}" if mfu is not None else "n/a",
                     f" stragglers {slow}" if slow else "")

    # ------------------------------------------------------------------ profiling
    def _trace_dir(self) -> Path:
        p = self.spec.profiling
        return Path(p.path) if p and p.path else self.ckpt_root / "traces"

    def _start_profiler(self) -> Any:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        prof = profile(activities=acts, record_shapes=False, with_stack=False)
        prof.start()
        return prof

    def _stop_profiler(self, prof: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof.stop()
        out = self._trace_dir()
        out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out / f"trace-rank{self.rank}.json"))

    # ------------------------------------------------------------------ finish
    def export(self) -> Path | None:
        """Gather the full model and write spec.output (export.export_trained); None without spec.output."""
        from llmfleet.workers.train.export import export_trained

        written = export_trained(self.spec, self.model, self.args, rank=self.rank, work_dir=self.ckpt_root)
        if written is None:
            return None
        out, target = written
        if self.rank == 0:
            self.status["exported"] = target
        return out

    @property
    def stopped(self) -> bool:
        """Stopped early by a signal (the status says where; the process exits 0 and resumes later)."""
        return "stopped" in self.status

    def close(self, done: bool) -> None:
        self.status["done"] = done
        self._publish()
        if self.server is not None:
            self.server.close()
        if dist.is_initialized():
            dist.destroy_process_group()
