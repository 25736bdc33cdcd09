"""Causal softmax attention as a token mixer of the LM stack: its config and its entry in the mixer registry
(``seqlab.layers.mixer``). The layer itself is :class:`seqlab.layers.attention.SelfAttention`."""

from __future__ import annotations

from dataclasses import dataclass

from seqlab.layers.attention import SelfAttention
from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.layers.positional import RotaryEmbedding
from seqlab.validation import check_divisible, check_positive_floats, check_positive_ints

__all__ = ["AttentionMixerConfig"]


@dataclass
class AttentionMixerConfig:
    n_heads: int = 4
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None means n_heads, 1 multi-query."""
    head_dim: int | None = None
    """Per-head width; None means d_model // n_heads."""
    bias: bool = False
    """Biases on the q, k, v and output projections (GPT-2: yes; Llama: no)."""
    window: int | None = None
    """Sliding-window size (each position sees itself and the window - 1 before); None: all."""
    rope: bool = True
    """Rotary positions inside attention (Su et al. 2021); False for a model with learned positions."""
    rope_base: float = 10000.0
    """RoPE's base θ: 10000 as in the paper and Llama 2, 500000 in Llama 3."""

    def __post_init__(self):
        check_positive_ints(self, ("n_heads",))
        check_positive_ints(self, ("n_kv_heads", "head_dim", "window"), allow_none=True)
        check_positive_floats(self, ("rope_base",))
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")


def _build_attention(d_model: int, c: AttentionMixerConfig, *, dropout: float, device=None, dtype=None):
    if c.head_dim is None:
        check_divisible(d_model, c.n_heads, ", or give head_dim")
    k = c.head_dim if c.head_dim is not None else d_model // c.n_heads
    rope = RotaryEmbedding(k, base=c.rope_base, device=device) if c.rope else None
    return SelfAttention(
        d_model,
        c.n_heads,
        c.n_kv_heads,
        head_dim=c.head_dim,
        bias=c.bias,
        dropout=dropout,
        causal=True,
        window=c.window,
        rope=rope,
        device=device,
        dtype=dtype,
    )


register_mixer(
    MixerSpec(
        "attention",
        AttentionMixerConfig,
        _build_attention,
        family="Transformer",
        summary="causal softmax attention with RoPE, GQA, sliding window and a KV cache (Vaswani et al. 2017)",
        year=2017,
        step_cost=1.2,  # a lab run's training step: 1.24x the LSTM's (docs/adding-a-mixer.md, section 7)
        width_multiple=lambda c: 2 * c.n_heads,  # heads whose width RoPE needs even
        counts_positions=True,  # KVCache.pos
    )
)
