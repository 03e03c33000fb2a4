"""The training-MFU benchmark's report: the printed table, the targets of one session's runs and the fp8 / bf16 loss
plot (benchmarks/train_mfu.py writes the JSON they read)."""

from __future__ import annotations

import statistics
from pathlib import Path


def baselines(rows: list[dict]) -> dict[str, dict]:
    """The one-GPU llmfleet run with default settings per (config, session): the denominator of scaling
    efficiency, taken on the same machine as the multi-GPU run it divides."""
    return {(r["config"], r.get("session")): r for r in rows
            if r.get("mode") == "llmfleet" and r["nproc"] == 1 and "error" not in r and r.get("accum", 1) == 1
            and r.get("compile", True) and r.get("raf", True) and not r.get("env")}


def _pct(v: float | None) -> str:
    return f"{v:6.1%}" if v is not None else "   n/a"


def print_table(rows: list[dict]) -> None:
    base = baselines(rows)
    hdr = f"{'session':14} {'case':28} {'GPUs':>4} {'mb':>7} {'step s':>7} {'tok/s':>9} {'tok/s/GPU':>9} {'MFU':>6} " \
          f"{'causal':>6} {'HFU':>6} {'mem GiB':>7} {'scaling':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r.get("superseded"):
            continue
        if "error" in r:
            print(f"{str(r.get('session')):14} {r['case']:28} {r['nproc']:>4}  FAILED: "
                  f"{r['error'].strip().splitlines()[-1][:80]}")
            continue
        b = base.get((r["config"], r.get("session")))
        scale = r["tokensPerSecondPerGpu"] / b["tokensPerSecondPerGpu"] if b and r["nproc"] > 1 else None
        mb = f"{r.get('microBatch', r['mb'])}x{r.get('gradAccumulation', r.get('accum', 1))}"
        print(f"{str(r.get('session')):14} {r['case']:28} {r['nproc']:>4} {mb:>7} {r['stepSeconds']:7.3f} "
              f"{r['tokensPerSecond']:9.0f} {r['tokensPerSecondPerGpu']:9.0f} {_pct(r['mfu'])} "
              f"{_pct(r.get('mfuCausal'))} {_pct(r['hfu'])} {r['memoryPeakGiB']:7.1f} "
              f"{(f'{scale:7.1%}' if scale else '      -')}")
    for r in rows:
        if "trace" in r:
            t = r["trace"]
            print(f"trace {r['case']}: compute {t['shares']['compute']:.0%}, NCCL {t['shares']['comm']:.0%} "
                  f"(exposed {t['shares']['commExposed']:.0%}), idle {t['shares']['idle']:.0%}; {t['diagnosis']}")


TAIL = 20  # convergence: compare the mean loss of the last TAIL steps (one step's loss is noisy)


def targets(runs: dict[str, dict]) -> dict[str, object]:
    """The targets from one session's rows (None where a case is missing or failed)."""
    ok = {k: v for k, v in runs.items() if "error" not in v}

    def tps(case: str) -> float | None:
        return ok[case]["tokensPerSecond"] if case in ok else None

    def ratio(a: str, b: str) -> float | None:
        x, y = tps(a), tps(b)
        return x / y if x and y else None

    out: dict[str, object] = {
        "llmfleetBf16Mfu": ok["llmfleet-bf16"]["mfu"] if "llmfleet-bf16" in ok else None,
        "llmfleetBf16OverPlain": ratio("llmfleet-bf16", "plain-bf16"),
        "llmfleetBf16OverPlainMb8": ratio("llmfleet-bf16", "plain-bf16-mb8"),
        "llmfleetFp8OverPlainBf16": ratio("llmfleet-fp8", "plain-bf16"),
        "llmfleetBf16OverTorchtitanBf16": ratio("llmfleet-bf16", "torchtitan-bf16"),
        "llmfleetFp8OverTorchtitanFp8": ratio("llmfleet-fp8", "torchtitan-fp8"),
    }
    if "conv-bf16" in ok and "conv-fp8" in ok:
        a = statistics.fmean(ok["conv-bf16"]["losses"][-TAIL:])
        b = statistics.fmean(ok["conv-fp8"]["losses"][-TAIL:])
        out.update(convergenceSteps=len(ok["conv-bf16"]["losses"]), convergenceBf16Loss=a, convergenceFp8Loss=b,
                   convergenceFp8OverBf16=b / a - 1)
    return out


def plot(doc: dict, png: Path) -> None:
    """The conv-bf16 and conv-fp8 loss curves overlaid (raw and a 10-step moving average)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for case, color in (("conv-bf16", "tab:blue"), ("conv-fp8", "tab:orange")):
        losses = doc["runs"][case]["losses"]
        steps = range(1, len(losses) + 1)
        avg = [statistics.fmean(losses[max(0, i - 9):i + 1]) for i in range(len(losses))]
        ax.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(steps, avg, color=color, label=f"{case.removeprefix('conv-')} (last {TAIL} steps: "
                                               f"{statistics.fmean(losses[-TAIL:]):.3f})")
    ax.set_xlabel("optimizer step (16,384 tokens)")
    ax.set_ylabel("training loss (cross-entropy, nats/token)")
    ax.set_yscale("log")
    ax.set_title("0.9B reference model on BPE-tokenized Python stdlib source, one H200, same seed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
