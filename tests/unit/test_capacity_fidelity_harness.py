"""The capacity-fidelity benchmark's measurements (benchmarks/capacity_fidelity.py): what it calls a replica's
capacity is one, and what it calls the model is the autoscaler's own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import capacity_fidelity  # noqa: E402
from autoscale_setup import service  # noqa: E402

from llmfleet.autoscaler.capacity import service_seconds  # noqa: E402
from llmfleet.autoscaler.seeds import seeds_for_service  # noqa: E402

PAIRS = [(1000, 100), (3000, 50), (500, 300)]


def test_poisson_draws_the_mix_without_prefix_contents() -> None:
    w = capacity_fidelity.poisson(PAIRS, rate=5.0, requests=400)
    assert len(w.requests) == 400
    arrivals = [r.arrival for r in w.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert 400 / arrivals[-1] == pytest.approx(5.0, rel=0.15)
    assert {(r.prompt_len, r.output_len) for r in w.requests} == set(PAIRS)
    assert all(not r.keys for r in w.requests)


def test_the_saturated_throughput_is_the_rate_the_replica_sustains() -> None:
    """Below the measured rate the queue stays short; above it, it grows for the whole run."""
    measured = capacity_fidelity.saturated_rps(PAIRS, model_rps=10.0, requests=1500)
    sat = measured.rps
    assert sat > 1.0
    assert measured.preemptions_per_1000 >= 0 and measured.prefill_per_prompt_token >= 1.0
    calm, _ = capacity_fidelity.at_load(PAIRS, 0.6 * sat, 1500)
    over, _ = capacity_fidelity.at_load(PAIRS, 1.4 * sat, 1500)
    assert calm < 1.0
    assert over > 10 * calm


def test_a_saturated_replica_counts_what_it_recomputes() -> None:
    """Long prompts with long outputs outgrow the KV cache: the replica preempts running requests and computes
    their prompts again (more prefill tokens than prompt tokens); short ones never do (exactly one per token)."""
    long = capacity_fidelity.saturated_rps([(100_000, 3000), (20_000, 4000)], model_rps=0.5, requests=120)
    assert long.preemptions_per_1000 > 100 and long.prefill_per_prompt_token > 1.1
    short = capacity_fidelity.saturated_rps(PAIRS, model_rps=10.0, requests=600)
    assert short.preemptions_per_1000 == 0 and short.prefill_per_prompt_token == 1.0


def test_the_model_is_the_policys_seed_at_the_mix(tmp_path: Path) -> None:
    r = capacity_fidelity.evaluate("mix", PAIRS, requests=600)
    mean_in = sum(p for p, _ in PAIRS) / 3
    mean_out = sum(o for _, o in PAIRS) / 3
    seed = seeds_for_service(service("slo", 1.0, 1))["primary"].for_mix(mean_in, mean_out, 0.0)
    assert r["modelRps"] == pytest.approx(1.0 / service_seconds(seed, 1.0, mean_in, mean_out, 0.0), rel=1e-3)
    assert r["modelOverSimulated"] == pytest.approx(r["modelRps"] / r["simulatedRps"], rel=1e-2)
    assert [x["fraction"] for x in r["loads"]] == list(capacity_fidelity.LOADS)
    assert all(x["preemptionsPer1000Requests"] >= 0 for x in r["loads"])
    assert r["saturatedPreemptionsPer1000Requests"] >= 0 and r["saturatedPrefillTokensPerPromptToken"] >= 1.0
    rates = [x["rateRps"] for x in r["loads"]]
    assert rates == sorted(rates) and rates[-1] < r["simulatedRps"]
    assert "| mix |" in capacity_fidelity.table([r])


def test_cli_writes_results_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "azure_small.csv"
    rows = [f"2023-11-16 18:00:{s:02d}.0000000,{800 + 40 * s},{60 + s}" for s in range(40)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "cf.json"
    assert capacity_fidelity.main(["--trace", str(trace), "--requests", "300", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "capacity_fidelity" and doc["results"][0]["workload"] == "azure_small"
    assert capacity_fidelity.main(["--trace", str(tmp_path / "missing.csv"), "--out", str(out)]) == 2
    assert capacity_fidelity.main(["--trace", str(trace), "--requests", "5", "--out", str(out)]) == 2
    assert capacity_fidelity.main(["--mix", "300x200", "--out", str(out)]) == 2
    assert capacity_fidelity.main(["--mix", "0:200", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "missing.csv" in err and "--requests 5" in err and "'300x200': expected IN:OUT" in err and "'0:200'" in err
    # a fixed request shape alone: every request the same, named after it
    assert capacity_fidelity.main(["--mix", "300:200", "--requests", "300", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["workload"] for r in doc["results"]] == ["fixed 300/200"]
    assert (doc["results"][0]["meanInput"], doc["results"][0]["meanOutput"]) == (300, 200)


def test_the_model_prices_a_short_prefill_batched_with_the_decodes() -> None:
    """Short prompts: a prefill alone is a whole step (overhead and weight read), batched it adds its FLOPs. Priced
    alone the model put a 100-in / 100-out replica at 0.57x the simulated one; batched it is within 10 %."""
    r = capacity_fidelity.evaluate("fixed 100/100", [(100, 100)], requests=1500)
    assert 0.9 <= r["modelOverSimulated"] <= 1.1


def test_clip_prompts_cuts_the_longest_prompts_once_per_length(tmp_path: Path) -> None:
    """`--clip-prompts N ...`: each trace once per N with its prompts cut to N tokens, named after it."""
    trace = tmp_path / "azure_small.csv"
    rows = [f"2023-11-16 18:00:{s:02d}.0000000,{800 + 40 * s},{60 + s}" for s in range(40)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "cf.json"
    assert capacity_fidelity.main(["--trace", str(trace), "--requests", "300", "--clip-prompts", "1000", "2000",
                                   "--out", str(out)]) == 0
    got = {r["workload"]: r for r in json.loads(out.read_text())["results"]}
    assert list(got) == ["azure_small clipped 1000", "azure_small clipped 2000"]
    # prompts are 800..2360 tokens: cut at 1000 every mean is below the one cut at 2000
    assert got["azure_small clipped 1000"]["meanInput"] < got["azure_small clipped 2000"]["meanInput"] <= 1580
    assert capacity_fidelity.main(["--trace", str(trace), "--clip-prompts", "0", "--out", str(out)]) == 2
