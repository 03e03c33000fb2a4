"""`llmfleet plan`: roofline, KV-cache capacity, attention cost, training FLOPs and replicas at an SLO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from llmfleet.api.contracts import INPUT_TEXT_ENCODING

if TYPE_CHECKING:
    from llmfleet.api.trainingjob import ModelShape


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f} GiB"


def _render(rep: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    m, g = rep["model"], rep["gpu"]
    t = Table(title=f"{m['params'] / 1e9:.2f}B params, {m['attention']} on {g['name']} "
                    f"(ridge {g['ridgePointFlopPerByte']} FLOP/B)")
    for c in ("phase", "FLOPs", "HBM bytes", "FLOP/B", "bound", "roofline time"):
        t.add_column(c)
    for key, ph in rep["roofline"].items():
        if key == "decodeComputeBoundBatch":
            continue
        t.add_row(key, f"{ph['flops']:.3e}", f"{ph['bytes']:.3e}", f"{ph['intensity']:.1f}", ph["bound"],
                  f"{ph['time_s'] * 1e3:.2f} ms")
    con.print(t)
    cb = rep["roofline"]["decodeComputeBoundBatch"]
    con.print("decode turns compute-bound at batch: " + ", ".join(
        f"{k}: {'never' if v is None else f'{v:.0f}'}" for k, v in cb.items()))
    t = Table(title="KV cache")
    for c in ("KV dtype", "bytes/token", "pool", "tokens", "blocks", "sequences"):
        t.add_column(c)
    for dt, kv in rep["kvCache"]["byDtype"].items():
        t.add_row(dt, f"{kv['kv_bytes_per_token']:,.0f}", _gib(kv["kv_pool_bytes"]), f"{kv['tokens']:,}",
                  f"{kv['blocks']:,} x {kv['block_size']}", f"{kv['sequences']:,} x {kv['tokens_per_sequence']}")
    con.print(t)
    con.print("KV bytes/token by attention: " + "; ".join(
        f"{n} ({v['kvHeads']} kv heads): bf16 {v['bf16']:,.0f}, fp8 {v['fp8']:,.0f}, int4 {v['int4']:,.0f}"
        for n, v in rep["kvCache"]["byAttention"].items()))
    h = rep["kvCache"].get("hostTier")
    if h:
        con.print(f"host KV tier {h['gib']:g} GiB: {h['tokens']:,} tokens ({h['blocks']:,} x {h['block_size']}); loading a "
                  f"token back {h['load_s_per_token'] * 1e6:.2f} us over the {g['host_link_gbs']:g} GB/s host link vs "
                  f">= {h['recompute_s_per_token'] * 1e6:.2f} us to recompute it ({h['recompute_over_load']:.1f}x)")
    a = rep["attention"]
    con.print(f"attention at S={a['seq_len']} (one layer, all heads): materialized {_gib(a['materialized_bytes'])} "
              f"HBM traffic, {_gib(a['materialized_memory'])} score matrix; fused {_gib(a['fused_bytes'])} traffic, "
              f"{a['fused_memory'] / 2**20:.2f} MiB state (query tile {a['block_rows']} rows)")
    tr = rep["training"]
    f = tr["fsdpMemoryPerGPU"]
    con.print(f"FSDP memory/GPU (shard {f['shard_size']}): params {_gib(f['params_bytes'])}, grads "
              f"{_gib(f['grads_bytes'])}, Adam {_gib(f['optimizer_bytes'])}, gathered {_gib(f['gathered_bytes'])}, "
              f"activations {_gib(f['activation_bytes'])} = {_gib(f['totalBytes'])} "
              f"({'fits' if f['fitsInHBM'] else 'does NOT fit'})")
    c = tr["fsdpCommPerStep"]
    con.print(f"FSDP traffic/GPU/step: {_gib(c['bytes_per_gpu'])} = {c['comm_s'] * 1e3:.1f} ms on the interconnect vs "
              f"{c['compute_s'] * 1e3:.1f} ms of compute at 50% MFU (ratio {c['ratio']:.2f})")
    if "utilization" in tr:
        u = tr["utilization"]
        con.print(f"training: {u['model_flops_per_token'] / 1e9:.2f} GFLOP/token, {u['achieved_tflops_per_gpu']:.1f} "
                  f"TFLOP/s/GPU, MFU {u['mfu']:.1%}, HFU {u['hfu']:.1%}")
    con.print(f"[bold]replicas needed: {rep['replicas']['needed']}[/bold]")
    for line in rep["replicas"]["reasoning"]:
        con.print(f"  - {line}")


def _overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        if "=" not in it:
            raise ValueError(f"--gpu-override expects key=value, got {it!r}")
        k, v = it.split("=", 1)
        out[k.strip()] = None if v.strip().lower() == "none" else float(v)
    return out


def _shape(path: Path) -> ModelShape:
    """`--shape`: the file's shape (`plan.models.load_shape`), its problem in one line naming the option."""
    from llmfleet.plan.models import load_shape

    try:
        return load_shape(path)
    except ValueError as e:
        raise ValueError(f"--shape {e}") from None


def _prompt_lengths(path: Path) -> tuple[int, ...]:
    """`--prompts`: prompt lengths in tokens, one per line (blank lines and `#` comments skipped)."""
    out = []
    for n, line in enumerate(path.read_text(encoding=INPUT_TEXT_ENCODING).splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"--prompts {path}, line {n}: {text!r} is not a prompt length (a whole number >= 1)")
        out.append(int(text))
    if not out:
        raise ValueError(f"--prompts {path}: no prompt lengths")
    return tuple(out)


def _planner_checks(resource: Any) -> list[tuple[str, str]]:
    """`llmfleet validate`: what the GPU table says a resource's GPUs cannot do (fp8 without fp8 cores on a
    TrainingJob, a MIG profile its GPU type does not have on an InferenceService pool), and model-preset
    annotations the planner does not know."""
    from llmfleet.plan.hardware import mig_profile_problem, training_precision_problems
    from llmfleet.plan.pool_presets import model_preset_problems

    kind = getattr(resource, "kind", None)
    if kind == "TrainingJob":
        return training_precision_problems(resource.spec)
    if kind == "InferenceService":
        return [(f"{p.field_path}.resources.migProfile", problem) for p in resource.pools()
                if (problem := mig_profile_problem(p.resources))] + model_preset_problems(resource)
    return []


def register(app: typer.Typer) -> None:
    from llmfleet.api.cli import RESOURCE_CHECKS
    from llmfleet.plan.hardware import GPUS
    from llmfleet.plan.models import PRESETS

    if _planner_checks not in RESOURCE_CHECKS:
        RESOURCE_CHECKS.append(_planner_checks)

    @app.command("plan", help="Roofline, KV-cache capacity, attention cost, training FLOPs/MFU and replicas at an SLO.")
    def plan(
        model: str = typer.Option("llama-3-8b", help=f"Model preset: {', '.join(PRESETS)}."),
        shape: Path | None = typer.Option(None, help="YAML/JSON ModelShape (layers, hidden, heads, kvHeads, ffn, vocab), or a Hugging "
                                                     "Face config.json; overrides --model."),
        gpu: str = typer.Option("H200", help=f"GPU profile: {', '.join(GPUS)}."),
        gpu_override: list[str] = typer.Option([], help="Override a GPU field, e.g. hbmBandwidthTBs=4.0 (repeatable)."),
        mig: str | None = typer.Option(None, help="Plan one MIG instance of this profile of --gpu per replica "
                                                  "(e.g. 3g.71gb on H200; resources.migProfile)."),
        dtype: str = typer.Option("bf16", help="Weight dtype (bf16, fp8, int4)."),
        kv_dtype: str = typer.Option("bf16", help="KV-cache dtype (bf16, fp8, int4)."),
        block_size: int = typer.Option(16, help="Paged KV block size in tokens."),
        tp: int = typer.Option(1, help="Tensor-parallel GPUs per replica."),
        host_kv_gib: float | None = typer.Option(None, help="Host-memory KV tier per replica, GiB (vLLM CPU offloading)."),
        input_tokens: int = typer.Option(2048, "--input", help="Mean prompt tokens."),
        output_tokens: int = typer.Option(256, "--output", help="Mean output tokens."),
        prompts: Path | None = typer.Option(
            None, "--prompts", help="File of prompt lengths (tokens), one per line, from a request log or a trace "
            "(e.g. `jq .input_length trace.jsonl`): replicas are planned at their mean prefill, each prompt priced "
            "on its own, instead of the mean prompt's (the mean of these lengths replaces --input)."),
        rate: float = typer.Option(10.0, help="Arrival rate, requests/s."),
        hit_rate: float = typer.Option(0.0, help="Prefix-cache hit rate of prompt tokens, 0-1."),
        ttft_ms: float = typer.Option(1000.0, help="TTFT p95 SLO, ms."),
        tpot_ms: float = typer.Option(100.0, help="TPOT p95 SLO, ms."),
        seq_len: int = typer.Option(8192, help="Sequence length for the attention-materialization comparison."),
        train_tokens_per_s: float | None = typer.Option(None, help="Measured training tokens/s (whole job) for MFU/HFU."),
        train_gpus: int = typer.Option(8, help="Training GPUs (FSDP world size)."),
        train_seq_len: int | None = typer.Option(None, help="Training sequence length (model's seqLen by default)."),
        replicate_groups: int = typer.Option(1, help="HSDP replica groups."),
        activation_checkpointing: str = typer.Option("none", help="none, selective or full."),
        json_out: Path | None = typer.Option(None, "--json", help="Write the report as JSON to this file ('-' for stdout only)."),
    ) -> None:
        import yaml

        from llmfleet.api.cli import require_number
        from llmfleet.plan.capacity import TrafficShape
        from llmfleet.plan.hardware import get_gpu
        from llmfleet.plan.models import get_model, tensor_parallel_problem
        from llmfleet.plan.report import PlanInputs, build_report

        try:
            m = _shape(shape) if shape else get_model(model)
            g = get_gpu(gpu, _overrides(gpu_override), mig=mig)
            for flag, value in (("--rate", rate), ("--ttft-ms", ttft_ms), ("--tpot-ms", tpot_ms)):
                require_number(flag, value)
            for flag, whole in (("--input", input_tokens), ("--output", output_tokens), ("--seq-len", seq_len),
                                ("--block-size", block_size), ("--tp", tp), ("--train-gpus", train_gpus),
                                ("--train-seq-len", train_seq_len), ("--replicate-groups", replicate_groups)):
                if whole is not None:
                    require_number(flag, whole, 1, inclusive=True)
            if tp_problem := tensor_parallel_problem(m, tp):
                raise ValueError(f"--tp: {tp_problem}")
            if train_tokens_per_s is not None:
                require_number("--train-tokens-per-s", train_tokens_per_s, inclusive=True)
            if not 0.0 <= hit_rate <= 1.0:
                raise ValueError(f"--hit-rate must be within [0, 1], got {hit_rate:g}")
            sample = _prompt_lengths(prompts) if prompts else ()
            if sample:
                input_tokens = max(1, round(sum(sample) / len(sample)))
            w = TrafficShape(input_tokens, output_tokens, rate, hit_rate, ttft_ms / 1e3, tpot_ms / 1e3)
            rep = build_report(m, g, w, PlanInputs(
                weight_dtype=dtype, kv_dtype=kv_dtype, block_size=block_size, tensor_parallel=tp,
                attention_seq_len=seq_len, train_tokens_per_s=train_tokens_per_s, train_gpus=train_gpus,
                train_seq_len=train_seq_len, replicate_groups=replicate_groups,
                activation_checkpointing=activation_checkpointing, host_kv_gib=host_kv_gib,
                prompts=sample))
        except (ValueError, OSError, yaml.YAMLError) as e:
            typer.echo(f"llmfleet plan: {str(e).splitlines()[0]}", err=True)
            raise typer.Exit(2) from None
        if json_out is not None and str(json_out) == "-":
            typer.echo(json.dumps(rep, indent=2))
            return
        _render(rep)
        if json_out is not None:
            json_out.write_text(json.dumps(rep, indent=2))
