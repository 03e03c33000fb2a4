"""A Llama-style decoder in one brief file: RMSNorm, RoPE, SwiGLU, MHA/GQA/MQA by kv_heads.

Module and parameter names follow Hugging Face's LlamaForCausalLM (minus the `model.` prefix) so export is
a rename, not a permutation: RoPE uses the same rotate-half convention.
Attention goes through scaled_dot_product_attention (flash / memory-efficient kernels, never an S x S matrix
in memory) or, with a sliding window, FlexAttention with a block-sparse mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.models import embedding_params, total_params


@dataclass(frozen=True)
class ModelArgs:
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 384
    vocab: int = 4096
    seq_len: int = 256
    rope_theta: float = 10000.0
    sliding_window: int | None = None
    tie_embeddings: bool = False
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_shape(cls, shape: ModelShape) -> ModelArgs:
        return cls(
            layers=shape.layers, hidden=shape.hidden, heads=shape.heads, kv_heads=shape.n_kv_heads,
            ffn=shape.ffn_dim, vocab=shape.vocab, seq_len=shape.seq_len, rope_theta=shape.rope_theta,
            sliding_window=shape.sliding_window, tie_embeddings=shape.tie_embeddings,
        )

    def shape(self) -> ModelShape:
        """The API's ModelShape of these args (what the planner's parameter and FLOPs formulas take)."""
        return ModelShape(
            layers=self.layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads, ffn=self.ffn,
            vocab=self.vocab, seq_len=self.seq_len, rope_theta=self.rope_theta, sliding_window=self.sliding_window,
            tie_embeddings=self.tie_embeddings,
        )

    def num_params(self, include_embedding: bool = True) -> int:
        shape = self.shape()
        n = total_params(shape)
        return n if include_embedding else n - embedding_params(shape)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In fp32 like HF Llama, so exported models produce the same logits.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cache(args: ModelArgs, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, args.head_dim, 2, device=device).float() / args.head_dim))
    t = torch.arange(args.seq_len, device=device).float()
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, S, D); cos/sin: (S, D)."""
    cos, sin = cos[: x.shape[2]].to(x.dtype), sin[: x.shape[2]].to(x.dtype)
    return x * cos + _rotate_half(x) * sin


def sliding_window_mask(window: int, seq_len: int, device: torch.device) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return create_block_mask(mask_mod, None, None, seq_len, seq_len, device=str(device))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = args.heads, args.kv_heads, args.head_dim
        self.q_proj = nn.Linear(args.hidden, args.heads * args.head_dim, bias=False)
        self.k_proj = nn.Linear(args.hidden, args.kv_heads * args.head_dim, bias=False)
        self.v_proj = nn.Linear(args.hidden, args.kv_heads * args.head_dim, bias=False)
        self.o_proj = nn.Linear(args.heads * args.head_dim, args.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block_mask: Any = None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # GQA/MQA: the kernels share each K/V head across its group of query heads (no repeated K/V copies).
        gqa = self.kv_heads != self.heads
        if isinstance(block_mask, torch.Tensor):  # CPU fallback (FlexAttention has no CPU backward)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=block_mask, enable_gqa=gqa)
        elif block_mask is not None:
            from torch.nn.attention.flex_attention import flex_attention

            o = cast(torch.Tensor, flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa))  # type: ignore[redundant-cast]
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return cast(torch.Tensor, self.o_proj(o.transpose(1, 2).reshape(b, s, -1)))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden, args.ffn, bias=False)
        self.up_proj = nn.Linear(args.hidden, args.ffn, bias=False)
        self.down_proj = nn.Linear(args.ffn, args.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden, args.norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden, args.norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block_mask: Any = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, block_mask)
        return cast(torch.Tensor, x + self.mlp(self.post_attention_layernorm(x)))


def cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Output projection + mean token cross-entropy in fp32."""
    logits = F.linear(h, weight)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def norm_cross_entropy(h: torch.Tensor, norm: RMSNorm, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Final norm + output projection + cross-entropy: compiled as one region by parallelize. The norm belongs
    here rather than after the last block: run eagerly it is seven fp32 kernels over the (tokens x hidden)
    activations forward and more backward: 0.9 % of a one-GPU fp8 step on the 0.9B reference model (H200)."""
    return cross_entropy(norm(h), weight, targets)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab, args.hidden)
        self.layers = nn.ModuleList([Block(args) for _ in range(args.layers)])
        self.norm = RMSNorm(args.hidden, args.norm_eps)
        self.lm_head = nn.Linear(args.hidden, args.vocab, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_cache(args)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._block_mask: Any = None
        self.loss_fn = norm_cross_entropy  # parallelize.apply_compile swaps in a compiled version

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic init (also after `to_empty` from the meta device): N(0, 0.02), residual outputs
        scaled by 1/sqrt(2L) as in GPT-2, norms to one, RoPE tables recomputed."""
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.args.layers)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=out_std)
            else:
                nn.init.normal_(p, std=std)
        buf_cos, buf_sin = cast(torch.Tensor, self.rope_cos), cast(torch.Tensor, self.rope_sin)
        cos, sin = rope_cache(self.args, device=buf_cos.device)
        buf_cos.copy_(cos)
        buf_sin.copy_(sin)
        torch.random.set_rng_state(gen_state)

    def hidden_states(self, tokens: torch.Tensor, final_norm: bool = True) -> torch.Tensor:
        """The last block's output, after the final norm unless `final_norm` is False."""
        h = self.embed_tokens(tokens)
        mask = None
        if self.args.sliding_window and self.args.sliding_window < tokens.shape[1]:
            s = tokens.shape[1]
            if self._block_mask is None or self._block_mask.shape[-1] != s:
                if tokens.device.type == "cuda":
                    self._block_mask = sliding_window_mask(self.args.sliding_window, s, tokens.device)
                else:  # a dense boolean band: only for CPU tests and tiny models
                    i = torch.arange(s, device=tokens.device)
                    diff = i[:, None] - i[None, :]
                    self._block_mask = (diff >= 0) & (diff < self.args.sliding_window)
            mask = self._block_mask
        for layer in self.layers:
            h = layer(h, self.rope_cos, self.rope_sin, mask)
        return cast(torch.Tensor, self.norm(h)) if final_norm else h

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, S, V), or the mean cross-entropy when targets are given."""
        if targets is not None:
            return self.loss_fn(self.hidden_states(tokens, final_norm=False), self.norm, self.lm_head.weight, targets)
        return cast(torch.Tensor, self.lm_head(self.hidden_states(tokens)))
