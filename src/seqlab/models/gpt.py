r"""Decoder-only Transformer language models: GPT-2 (Radford et al. 2019) by default, Llama-style on request.

Notation: ``b`` batch, ``t`` time, ``d`` d_model, ``h`` query heads, ``g`` key/value heads, ``k`` head dim,
``v`` vocabulary.

    x_0 = E[tokens] + P[positions]                        (learned positions; none with RoPE)
    x_l = x_{l-1} + Attn(Norm(x_{l-1}))                    causal self-attention, pre-norm
    x_l = x_l + MLP(Norm(x_l))                             GELU(tanh) MLP, or SwiGLU
    logits = Norm(x_L) Eᵀ                                  head tied to the token embedding (or untied)

GPT-2 shape (the default): learned absolute positions, LayerNorm with bias (eps 1e-5), GELU with the tanh
approximation, biases on every projection, tied head, and GPT-2's initialization: N(0, 0.02) for weights and
embeddings, zero biases, and the projections that write into the residual stream (attention ``out_proj``,
the MLP's second layer) at N(0, 0.02 / √(2 n_layers)), so that the residual's variance does not grow with
depth (GPT-2 paper, section 2.3). Llama-style (Touvron et al. 2023, arXiv 2302.13971): ``position="rope"``,
``norm="rmsnorm"``, ``mlp="swiglu"``, ``bias=False``, ``tie_weights=False``, ``n_kv_heads`` < ``n_heads``.

Attention is :class:`seqlab.layers.attention.MultiheadAttention` (causal, SDPA fast path, KV cache, RoPE).
The state of the model is the list of the layers' KV caches; ``step`` feeds one token through them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from seqlab.layers.attention import KVCache, MultiheadAttention
from seqlab.layers.mlp import MLP, SwiGLU
from seqlab.layers.norms import make_norm
from seqlab.layers.positional import LearnedPositionalEmbedding, RotaryEmbedding
from seqlab.models.generation import generate
from seqlab.models.gpt_decode import StaticCacheDecoder, why_not_fast_decode
from seqlab.models.init import normal_init_

__all__ = ["GPT", "PRESETS", "GPTBlock", "GPTConfig"]

_CHOICES = {
    "norm": ("layernorm", "rmsnorm"),
    "mlp": ("gelu_tanh", "gelu", "relu", "swiglu"),
    "position": ("learned", "rope", "none"),
}


@dataclass
class GPTConfig:
    vocab_size: int = 256
    max_seq_len: int = 256
    """Longest context: the size of the learned position table (and the limit of generation with it)."""
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None means n_heads (plain multi-head), 1 multi-query."""
    d_model: int = 128
    head_dim: int | None = None
    """Per-head width; None means d_model // n_heads."""
    d_ff: int | None = None
    """Hidden width of the MLP; None means 4 * d_model."""
    mlp: Literal["gelu_tanh", "gelu", "relu", "swiglu"] = "gelu_tanh"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-5
    position: Literal["learned", "rope", "none"] = "learned"
    rope_base: float = 10000.0
    bias: bool = True
    """Biases on the attention and MLP projections and on the LayerNorms (GPT-2: yes; Llama: no)."""
    tie_weights: bool = True
    """Share the token embedding with the output head (GPT-2: yes; Llama 2/3: no)."""
    dropout: float = 0.0
    """Dropout on the embeddings, the attention weights and the residual branches (training only)."""

    def __post_init__(self):
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("vocab_size", "max_seq_len", "n_layers", "n_heads", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}, or set head_dim"
            )
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if kv < 1 or self.n_heads % kv:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def k(self) -> int:
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim


class GPTBlock(nn.Module):
    """x + Attn(Norm(x)), then x + MLP(Norm(x)) (pre-norm). Carries one layer's KV cache."""

    def __init__(self, c: GPTConfig, rope: RotaryEmbedding | None, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.norm1 = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw)
        self.attn = MultiheadAttention(
            c.d_model,
            c.n_heads,
            c.n_kv_heads,
            head_dim=c.head_dim,
            bias=c.bias,
            dropout=c.dropout,
            causal=True,
            rope=rope,
            **kw,
        )
        self.norm2 = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw)
        if c.mlp == "swiglu":
            self.mlp = SwiGLU(c.d_model, c.ff_width, bias=c.bias, **kw)
        else:
            self.mlp = MLP(c.d_model, c.ff_width, activation=c.mlp, bias=c.bias, **kw)
        self.drop = nn.Dropout(c.dropout)

    def residual_projections(self) -> list[nn.Linear]:
        """The layers that write into the residual stream (GPT-2 scales their initialization)."""
        return [self.attn.out_proj, self.mlp.down if isinstance(self.mlp, SwiGLU) else self.mlp.fc2]

    def forward(self, x: Tensor, state: KVCache | None = None, need_weights: bool = False):
        out = self.attn(self.norm1(x), state=state, need_weights=need_weights)  # (b, t, d), cache[, weights]
        x = x + self.drop(out[0])
        x = x + self.drop(self.mlp(self.norm2(x)))  # (b, t, d)
        return (x, out[1], out[2]) if need_weights else (x, out[1])


class GPT(nn.Module):
    """Decoder-only causal LM following seqlab's model protocol (see ``seqlab.models.lm``):

    ``model(ids (b, t)) -> logits (b, t, v)``; ``model(ids, state, return_state=True) -> (logits, state)``;
    ``init_state(b)``; ``step(ids (b,), state) -> (logits (b, v), state)``; ``generate(...)``;
    ``attention_maps(ids, layers)`` -> {layer: weights (b, h, t, t)}.
    """

    family = "gpt"

    def __init__(self, config: GPTConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model, **kw)
        self.pos_embed = (
            LearnedPositionalEmbedding(c.max_seq_len, c.d_model, **kw) if c.position == "learned" else None
        )
        rope = RotaryEmbedding(c.k, base=c.rope_base, device=device) if c.position == "rope" else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(GPTBlock(c, rope, **kw) for _ in range(c.n_layers))
        self.norm = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False, **kw)
        if c.tie_weights:
            self.head.weight = self.tok_embed.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialization (see the module docstring); norms start at weight 1, bias 0."""
        normal_init_(self, std=0.02)
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            for proj in block.residual_projections():
                nn.init.normal_(proj.weight, std=resid_std)

    def _embed(self, ids: Tensor, offset: int) -> Tensor:
        if ids.is_floating_point():
            raise ValueError(f"expected token ids (an integer tensor), got {ids.dtype}")
        h = self.tok_embed(ids)  # (b, t) -> (b, t, d)
        if self.pos_embed is not None:
            h = self.pos_embed(h, offset)  # + P[offset : offset + t]
        return self.drop(h)

    def forward(self, ids: Tensor, state: list[KVCache] | None = None, return_state: bool = False):
        """ids (b, t) -> logits (b, t, v) [and the per-layer KV caches]."""
        if ids.dim() != 2:
            raise ValueError(f"expected token ids of shape (b, t), got {tuple(ids.shape)}")
        offset = 0 if not state else int(state[0].pos)
        h = self._embed(ids, offset)  # (b, t, d)
        states = [None] * len(self.blocks) if state is None else state
        new = []
        for block, s in zip(self.blocks, states, strict=True):
            h, s = block(h, s)
            new.append(s)
        logits = self.head(self.norm(h))  # (b, t, d) -> (b, t, v)
        return (logits, new) if return_state else logits

    @property
    def context_limit(self) -> int | None:
        """Positions the model can hold: max_seq_len with learned positions, unbounded with RoPE."""
        return self.config.max_seq_len if self.pos_embed is not None else None

    def init_state(self, batch_size: int) -> list[KVCache]:
        """Empty KV caches, one per layer."""
        return [b.attn.init_state(batch_size) for b in self.blocks]

    def step(self, ids: Tensor, state: list[KVCache] | None = None) -> tuple[Tensor, list[KVCache]]:
        """ids (b,) -> logits (b, v): one position through the KV caches (O(t) attention per step)."""
        state = self.init_state(ids.size(0)) if state is None else state
        logits, state = self.forward(ids[:, None], state, return_state=True)  # (b, 1, v)
        return logits[:, 0], state

    @torch.no_grad()
    def attention_maps(self, ids: Tensor, layers: list[int] | None = None) -> dict[int, Tensor]:
        """The attention weights (b, h, t, t) of the chosen layers (all by default) for ids (b, t)."""
        n = len(self.blocks)
        layers = list(range(n)) if layers is None else layers
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has {n} layers (0 ... {n - 1})")
        h = self._embed(ids, 0)
        maps = {}
        for i, block in enumerate(self.blocks):
            if i in layers:
                h, _, w = block(h, need_weights=True)
                maps[i] = w
            else:
                h, _ = block(h)
            if i >= max(layers, default=-1):
                break
        return maps

    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        fast: bool = True,
    ) -> Tensor:
        """Prompt (b, t) or (t,) -> prompt + continuation; ``temperature=0`` is greedy.

        With learned positions the context slides past ``max_seq_len`` (see ``seqlab.models.generation``).
        ``fast`` decodes through :class:`seqlab.models.gpt_decode.StaticCacheDecoder` (the same arithmetic on
        preallocated buffers, without the modules' overhead) unless ``why_not_fast_decode`` names a reason
        (hooks, swapped-in parts); ``fast=False`` steps through ``self.step``.
        """
        model = self
        if fast and why_not_fast_decode(self) is None:
            t = prompt_ids.size(-1) if prompt_ids.dim() else 1
            model = StaticCacheDecoder(self, capacity=t + max(max_new_tokens, 1))
        return generate(model, prompt_ids, max_new_tokens, temperature, top_k, top_p, generator)


# GPT-2 sizes from Radford et al. 2019 (table 2) with the 50,257-token BPE vocabulary and 1,024 positions;
# GPT-3 175B from Brown et al. 2020 (arXiv 2005.14165, table 2.1), 2,048 positions (its alternating sparse
# attention changes no parameter count).
_GPT2 = {"vocab_size": 50257, "max_seq_len": 1024}
PRESETS = {
    "test-gpt": {"d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 64},
    "test-gpt-llama": {
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "d_ff": 64,
        "max_seq_len": 64,
        "position": "rope",
        "norm": "rmsnorm",
        "norm_eps": 1e-6,
        "mlp": "swiglu",
        "bias": False,
        "tie_weights": False,
    },
    "gpt-tiny": {"d_model": 192, "n_layers": 6, "n_heads": 6, "max_seq_len": 256, "dropout": 0.1},
    "gpt2": {**_GPT2, "d_model": 768, "n_layers": 12, "n_heads": 12},
    "gpt2-medium": {**_GPT2, "d_model": 1024, "n_layers": 24, "n_heads": 16},
    "gpt2-large": {**_GPT2, "d_model": 1280, "n_layers": 36, "n_heads": 20},
    "gpt2-xl": {**_GPT2, "d_model": 1600, "n_layers": 48, "n_heads": 25},
    "gpt3-175b": {"vocab_size": 50257, "max_seq_len": 2048, "d_model": 12288, "n_layers": 96, "n_heads": 96},
}
