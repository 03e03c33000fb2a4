"""`llmfleet sim run --shape`: a model no preset names, from its config.json, simulated as production would serve
it (the autoscaler seeds the pool from the shape its replicas report; the router, finding no preset, measures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmfleet.api.trainingjob import ModelShape
from llmfleet.autoscaler.capacity import DEFAULT_SEED
from llmfleet.autoscaler.policy import PolicyConfig
from llmfleet.autoscaler.seeds import seeds_for_service
from llmfleet.cli.main import app
from llmfleet.plan.models import PRESETS, load_shape
from llmfleet.sim.production import make_service, pool_specs, simulate_service
from llmfleet.sim.workload import SyntheticSpec, synthetic
from tests.unit.test_autoscaler_reported_shape import LLAMA_3_8B_CONFIG, _same_seed


def hf_config(m: ModelShape) -> dict[str, object]:
    """The keys of a Hugging Face config.json the planner reads, for shape `m`."""
    return {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": m.layers, "hidden_size": m.hidden,
            "num_attention_heads": m.heads, "num_key_value_heads": m.n_kv_heads, "intermediate_size": m.ffn_dim,
            "vocab_size": m.vocab, "max_position_embeddings": m.seq_len, "rope_theta": m.rope_theta,
            "tie_word_embeddings": m.tie_embeddings}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A model folder with Llama-3.2-1B's config.json (a fine-tune under another name, say)."""
    folder = tmp_path / "ft-1b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(PRESETS["llama-3.2-1b"])))
    return folder


def test_a_shape_file_a_model_folder_and_their_errors(config: Path, tmp_path: Path) -> None:
    assert load_shape(config) == load_shape(config / "config.json") == PRESETS["llama-3.2-1b"]
    assert hf_config(PRESETS["llama-3-8b"]).items() <= LLAMA_3_8B_CONFIG.items()  # the Hub's keys
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**LLAMA_3_8B_CONFIG, "num_local_experts": 8}))
    with pytest.raises(ValueError, match=r"moe.json: num_local_experts = 8: a mixture-of-experts"):
        load_shape(moe)
    bad = tmp_path / "shape.yaml"
    bad.write_text("layers: 0\nhidden: 64\nheads: 4\n")
    with pytest.raises(ValueError, match=r"shape.yaml: layers: Input should be greater than or equal to 1"):
        load_shape(bad)


def _summaries(args: list[str], out: Path) -> list[dict[str, Any]]:
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "30", "--rate", "3", "--replicas", "2", "--out", str(out),
                                 *args])
    assert r.exit_code == 0, r.output
    results = json.loads((out / "result.json").read_text())["results"]
    return [res["summary"] for res in results]


def test_sim_run_with_a_config_simulates_that_model(config: Path, tmp_path: Path) -> None:
    """Llama-3.2-1B's config.json simulates exactly as its preset does, not as the default model."""
    shaped = _summaries(["--shape", str(config)], tmp_path / "a")
    assert shaped == _summaries(["--model", "llama-3.2-1b"], tmp_path / "b")
    assert shaped != _summaries([], tmp_path / "c")
    # a shape the tensor parallelism cannot split, and one the planner has none for: one line, exit 2
    qwen = tmp_path / "qwen.json"  # 14 heads: not over 4 GPUs, where the default model's 32 would split
    qwen.write_text(json.dumps(hf_config(PRESETS["qwen2.5-0.5b"])))
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--shape", str(qwen), "--tp", "4"])
    assert r.exit_code == 2 and "--tp: 14 attention heads do not split" in r.output
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**LLAMA_3_8B_CONFIG, "num_local_experts": 8}))
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--shape", str(moe)])
    assert r.exit_code == 2 and "--shape" in r.output and "mixture-of-experts" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_the_simulated_autoscaler_seeds_a_pool_without_a_preset_from_its_shape(config: Path, tmp_path: Path) -> None:
    shape = load_shape(config)
    isvc = make_service(model=None, replicas=1)
    assert pool_specs(isvc, shapes={"primary": shape})[0].model == shape
    assert _same_seed(seeds_for_service(isvc, {"primary": shape})["primary"],
                      seeds_for_service(make_service(model="llama-3.2-1b", replicas=1))["primary"])
    w = synthetic(SyntheticSpec(duration_s=20, rate_rps=2, tenants=2))
    res, hook = simulate_service(w, isvc, shapes={"primary": shape})
    assert hook is not None and res.summary["requests"] > 0
    cfg: PolicyConfig = hook.cfg
    assert cfg.pool("primary").seed != DEFAULT_SEED
    # replicas that report no shape (an engine without llmfleet's serving wrapper): the default seed
    _, unreported = simulate_service(w, isvc, shapes={"primary": shape}, reported=False)
    assert unreported is not None and unreported.cfg.pool("primary").seed == DEFAULT_SEED
    with pytest.raises(ValueError, match="no model preset to simulate .* and no shape given"):
        simulate_service(w, isvc)
    # the CLI: 20 req/s that two Llama-3-8B replicas serve, and one of the 1B shape
    def autoscaled(args: list[str], out: Path) -> tuple[str, dict[str, Any]]:
        r = CliRunner().invoke(app, ["sim", "run", "--duration", "120", "--rate", "20", "--autoscaler", "slo",
                                     "--replicas", "1", "--ttft-slo-ms", "1000", "--out", str(out), *args])
        assert r.exit_code == 0, r.output
        return " ".join(r.output.split()), json.loads((out / "result.json").read_text())["results"][0]["summary"]

    text, shaped = autoscaled(["--shape", str(config)], tmp_path / "a")
    assert f"1 x {config} (16 layers, width 2048)" in text and "peak replicas primary 1;" in text
    _, default = autoscaled([], tmp_path / "b")
    assert shaped["gpuSeconds"] < default["gpuSeconds"]


def test_sim_plan_and_hindsight_take_a_shape_too(config: Path, tmp_path: Path) -> None:
    def plan(args: list[str]) -> dict[str, Any]:
        r = CliRunner().invoke(app, ["sim", "plan", "--duration", "60", "--rate", "5", "--json", "-", *args])
        assert r.exit_code == 0, r.output
        return dict(json.loads(r.output))

    shaped, preset = plan(["--shape", str(config)]), plan(["--model", "llama-3.2-1b"])
    assert shaped.pop("model") == str(config) and preset.pop("model") == "llama-3.2-1b"
    assert shaped == preset and shaped["capacity"] != plan([])["capacity"]

    def hindsight(args: list[str]) -> dict[str, Any]:
        out = tmp_path / f"h{len(args)}-{args[-1][-4:] if args else ''}.json"
        r = CliRunner().invoke(app, ["sim", "hindsight", "--duration", "60", "--rate", "20", "--start-replicas", "2",
                                     "--out", str(out), *args])
        assert r.exit_code == 0, r.output
        return dict(json.loads(out.read_text()))

    shaped = hindsight(["--shape", str(config)])
    assert shaped == hindsight(["--model", "llama-3.2-1b"]) and shaped["gpuSeconds"] < hindsight([])["gpuSeconds"]
    r = CliRunner().invoke(app, ["sim", "plan", "--shape", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and r.output.count("missing.json") == 1 and "--shape" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_a_student_no_preset_names(config: Path, tmp_path: Path) -> None:
    """`--student FILE:REPLICAS`: a distilled student's shape, simulated as its preset would be, with and without the
    autoscaler (which seeds the student pool from it)."""
    def summaries(student: str, *extra: str) -> list[dict[str, Any]]:
        out = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        r = CliRunner().invoke(app, ["sim", "run", "--duration", "60", "--rate", "30", "--replicas", "1",
                                     "--student", student, "--out", str(out), *extra])
        assert r.exit_code == 0, r.output
        return [res["summary"] for res in json.loads((out / "result.json").read_text())["results"]]

    assert summaries(f"{config}:1") == summaries("llama-3.2-1b:1")
    auto = ("--autoscaler", "slo", "--ttft-slo-ms", "1000")
    assert summaries(f"{config}:1", *auto) == summaries("llama-3.2-1b:1", *auto)
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--student", f"{tmp_path / 'missing'}:1"])
    assert r.exit_code == 2 and "unknown model preset" in r.output  # no such file: read as a preset name
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers: 0\n")
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--student", f"{bad}:1"])
    assert r.exit_code == 2 and "--student" in r.output and "layers" in r.output
