"""Model (GQA, sliding window, HF export round trip), data positions, metrics server and trace analyzer."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from llmfleet.workers.train.data import TokenData, prepare
from llmfleet.workers.train.model import ModelArgs, Transformer

TINY = ModelArgs(layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=97, seq_len=32)


def _model(args: ModelArgs = TINY) -> Transformer:
    m = Transformer(args)
    m.init_weights(0)
    return m


def test_gqa_forward_shapes_and_causality() -> None:
    m = _model()
    x = torch.randint(0, 97, (2, 32))
    logits = m(x)
    assert logits.shape == (2, 32, 97)
    y = x.clone()
    y[:, 20:] = (y[:, 20:] + 1) % 97  # changing later tokens must not change earlier logits
    torch.testing.assert_close(m(y)[:, :20], logits[:, :20])


def test_gqa_attention_equals_repeated_kv_heads() -> None:
    """The kernels' native GQA (no K/V copies) computes what attention over repeated K/V heads computes."""
    import torch.nn.functional as F

    from llmfleet.workers.train.model import apply_rope

    attn = _model().layers[0].self_attn
    x = torch.randn(2, 32, 64)
    cos, sin = _model().rope_cos, _model().rope_sin

    def heads(proj: torch.nn.Module, n: int) -> torch.Tensor:
        return proj(x).view(2, 32, n, 16).transpose(1, 2)

    q, k = apply_rope(heads(attn.q_proj, 4), cos, sin), apply_rope(heads(attn.k_proj, 2), cos, sin)
    v = heads(attn.v_proj, 2)
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), is_causal=True)
    torch.testing.assert_close(attn(x, cos, sin), attn.o_proj(o.transpose(1, 2).reshape(2, 32, 64)))


def test_residual_stream_cast_to_bf16() -> None:
    """One device under autocast: blocks see a bf16 residual stream, the embedding still gets fp32 gradients."""
    from llmfleet.workers.train.parallelize import cast_residual_stream

    m = _model()
    cast_residual_stream(m, torch.bfloat16)
    seen: list[torch.dtype] = []
    m.layers[0].register_forward_pre_hook(lambda _mod, args: seen.append(args[0].dtype))
    x = torch.randint(0, 97, (2, 33))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    assert seen == [torch.bfloat16]
    assert m.embed_tokens.weight.grad is not None and m.embed_tokens.weight.grad.dtype == torch.float32
    assert torch.isfinite(loss)


def test_final_norm_runs_inside_the_compiled_loss_region() -> None:
    """The loss function gets the last block's output and the final norm (so compile fuses the norm with the
    LM head and cross-entropy), and the loss equals norm -> LM head -> cross-entropy done step by step."""
    from llmfleet.workers.train.model import cross_entropy
    from llmfleet.workers.train.parallelize import apply_compile

    torch.manual_seed(0)
    model = Transformer(ModelArgs(layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=128, seq_len=16))
    model.init_weights(0)
    with torch.no_grad():
        model.norm.weight.mul_(torch.linspace(0.5, 1.5, 32))  # a norm that is not the identity scale
    x, y = torch.randint(0, 128, (2, 16)), torch.randint(0, 128, (2, 16))
    seen: list[tuple[torch.Tensor, object]] = []
    loss_fn = model.loss_fn

    def spy(h: torch.Tensor, norm: object, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append((h, norm))
        return loss_fn(h, norm, weight, targets)  # type: ignore[arg-type]

    model.loss_fn = spy
    loss = model(x, y)
    (h, norm), = seen
    assert norm is model.norm
    assert torch.allclose(h, model.hidden_states(x, final_norm=False))
    expected = cross_entropy(model.norm(model.hidden_states(x, final_norm=False)), model.lm_head.weight, y)
    assert torch.allclose(loss, expected)
    assert torch.allclose(expected, cross_entropy(model.hidden_states(x), model.lm_head.weight, y))
    model.loss_fn = loss_fn
    apply_compile(model)
    assert torch.allclose(model(x, y), expected, atol=1e-5)


def test_sliding_window_equals_full_attention_when_window_covers_sequence() -> None:
    full = _model()
    wide = Transformer(ModelArgs(**{**TINY.__dict__, "sliding_window": 32}))
    wide.load_state_dict(full.state_dict())
    x = torch.randint(0, 97, (1, 32))
    torch.testing.assert_close(wide(x), full(x))


def test_sliding_window_limits_context() -> None:
    args = ModelArgs(**{**TINY.__dict__, "sliding_window": 4})
    m = Transformer(args)
    m.load_state_dict(_model().state_dict())
    x = torch.randint(0, 97, (1, 32))
    y = x.clone()
    y[:, 0] = (y[:, 0] + 1) % 97  # token 0 is outside every window from position 8 on (2 layers x 4)
    torch.testing.assert_close(m(y)[:, 8:], m(x)[:, 8:])
    assert not torch.allclose(m(y)[:, 1], m(x)[:, 1])


def test_export_hf_round_trip(tmp_path: Path) -> None:
    from llmfleet.workers.train.export import export_hf, load_hf

    m = _model()
    export_hf(m.state_dict(), TINY, tmp_path / "hf", dtype=torch.float32)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
    back = load_hf(tmp_path / "hf")
    x = torch.randint(0, 97, (1, 16))
    torch.testing.assert_close(back(x), m(x))


def _data(tmp_path: Path, n_tokens: int = 5000) -> Path:
    src = tmp_path / "a.txt"
    src.write_bytes(bytes(np.random.default_rng(0).integers(32, 127, n_tokens, dtype=np.uint8)))
    prepare([str(src)], tmp_path / "data", tokenizer="bytes")
    return tmp_path / "data"


def test_prepare_writes_manifest_and_uint16_shards(tmp_path: Path) -> None:
    folder = _data(tmp_path)
    man = json.loads((folder / "manifest.json").read_text())
    assert man["dtype"] == "uint16" and man["vocab"] == 257 and man["tokens"] == 5001
    assert np.fromfile(folder / man["shards"][0]["file"], dtype=np.uint16)[-1] == 256  # <eos>


def test_prepare_rejects_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        prepare([str(tmp_path / "nope*.txt")], tmp_path / "out")


def _rows(data: TokenData, step: int, world: int, accum: int, mb: int) -> list[tuple[int, ...]]:
    rows = []
    for rank in range(world):
        for micro in range(accum):
            x, _ = data.batch(step, micro, micro_batch=mb, accum=accum, rank=rank, world=world)
            rows.extend(tuple(r.tolist()) for r in x)
    return rows


def test_ranks_get_disjoint_batches_and_world_size_does_not_change_a_step(tmp_path: Path) -> None:
    data = TokenData.open(_data(tmp_path), seq_len=16, seed=3)
    two = _rows(data, step=2, world=2, accum=2, mb=2)
    assert len(set(two)) == len(two) == 8  # disjoint across ranks and micro-batches
    one = _rows(data, step=2, world=1, accum=4, mb=2)
    assert sorted(one) == sorted(two)  # the same global batch with one rank
    assert set(two).isdisjoint(_rows(data, step=3, world=2, accum=2, mb=2))


def test_targets_are_inputs_shifted(tmp_path: Path) -> None:
    data = TokenData.open(_data(tmp_path), seq_len=16, seed=0)
    x, y = data.batch(0, 0, micro_batch=1, accum=1, rank=0, world=1)
    assert torch.equal(x[0, 1:], y[0, :-1])


def test_metrics_server_serves_prometheus_and_status() -> None:
    from llmfleet.workers.train.metrics import MetricsServer, TrainMetrics

    m = TrainMetrics(rank=0)
    m.mfu.set(0.5)
    server = MetricsServer(m, 0, status=lambda: {"step": 3, "done": False})
    try:
        base = f"http://127.0.0.1:{server.port}"
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert 'llmfleet_train_mfu{rank="0"} 0.5' in text
        assert json.loads(urllib.request.urlopen(base + "/status", timeout=5).read()) == {"step": 3, "done": False}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/nope", timeout=5)
        assert err.value.code == 404
    finally:
        server.close()


def _gpu_trace(tmp_path: Path, comm_overlap: bool) -> Path:
    ev = [{"ph": "X", "name": "ProfilerStep#5", "cat": "user_annotation", "ts": 0, "dur": 1000, "pid": 1, "tid": 1}]
    ev.append({"ph": "X", "name": "sm90_xmma_gemm_bf16", "cat": "kernel", "ts": 0, "dur": 400, "pid": 0, "tid": 7})
    ev.append({"ph": "X", "name": "triton_poi_fused_add", "cat": "kernel", "ts": 400, "dur": 100, "pid": 0, "tid": 7})
    start = 100 if comm_overlap else 500
    ev.append({"ph": "X", "name": "ncclDevKernel_AllGather_RING_LL", "cat": "kernel", "ts": start, "dur": 400,
               "pid": 0, "tid": 8})
    path = tmp_path / f"t{comm_overlap}.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_analyzer_gpu_overlap_and_diagnosis(tmp_path: Path) -> None:
    from llmfleet.workers.train.analyze import analyze_trace

    s = analyze_trace(_gpu_trace(tmp_path, comm_overlap=True))
    assert s.device == "gpu" and s.window_ms == pytest.approx(1.0)
    assert s.comm_ms == pytest.approx(0.4) and s.comm_overlapped_ms == pytest.approx(0.4)
    assert s.idle_ms == pytest.approx(0.5)
    exposed = analyze_trace(_gpu_trace(tmp_path, comm_overlap=False))
    assert exposed.comm_exposed_ms == pytest.approx(0.4)
    assert exposed.diagnosis.startswith("communication-bound")


def test_token_stream_slices_across_shard_edges() -> None:
    from llmfleet.workers.train.data import TokenStream

    parts = [np.arange(0, 5), np.arange(5, 7), np.arange(7, 20)]
    stream = TokenStream(parts)
    assert len(stream) == 20
    assert stream[3:9].tolist() == list(range(3, 9))
    assert stream[5:7].tolist() == [5, 6]
    assert stream[0:20].tolist() == list(range(20))
