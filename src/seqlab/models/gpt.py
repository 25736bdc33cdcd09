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

GPT is not a model class of its own: it is :class:`seqlab.models.lm.LM` with the attention mixer, and these
are its presets (family "lm"). Attention is :class:`seqlab.layers.attention.MultiheadAttention` (causal, SDPA
fast path, KV cache, RoPE); the state is the list of the layers' KV caches.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS", "gpt_fields"]


def gpt_fields(
    d_model: int,
    n_layers: int,
    n_heads: int,
    max_seq_len: int,
    vocab_size: int = 256,
    **fields: Any,
) -> dict[str, Any]:
    """LMConfig fields of a GPT-2-shaped decoder; ``fields`` override (e.g. dropout, or Llama's options)."""
    mixer = {"n_heads": n_heads, "bias": True, "rope": False, **fields.pop("mixer_config", {})}
    return {
        "mixer": "attention",
        "mixer_config": mixer,
        "vocab_size": vocab_size,
        "max_seq_len": max_seq_len,
        "d_model": d_model,
        "n_layers": n_layers,
        "position": "learned",
        "mlp": "gelu_tanh",
        "norm": "layernorm",
        "norm_eps": 1e-5,
        "init": "gpt2",
        "tie_weights": True,
        **fields,
    }


_LLAMA = {
    "mixer_config": {"n_kv_heads": 2, "bias": False, "rope": True},
    "d_ff": 64,
    "position": "none",
    "norm": "rmsnorm",
    "norm_eps": 1e-6,
    "mlp": "swiglu",
    "bias": False,
    "tie_weights": False,
}

# GPT-2 sizes from Radford et al. 2019 (table 2) with the 50,257-token BPE vocabulary and 1,024 positions;
# GPT-3 175B from Brown et al. 2020 (arXiv 2005.14165, table 2.1), 2,048 positions (its alternating sparse
# attention changes no parameter count).
_GPT2 = {"vocab_size": 50257, "max_seq_len": 1024}
PRESETS: dict[str, dict[str, Any]] = {
    "test-gpt": gpt_fields(32, 2, 4, 64),
    "test-gpt-llama": gpt_fields(32, 2, 4, 64, **_LLAMA),
    "gpt-tiny": gpt_fields(192, 6, 6, 256, dropout=0.1),
    "gpt2": gpt_fields(768, 12, 12, **_GPT2),
    "gpt2-medium": gpt_fields(1024, 24, 16, **_GPT2),
    "gpt2-large": gpt_fields(1280, 36, 20, **_GPT2),
    "gpt2-xl": gpt_fields(1600, 48, 25, **_GPT2),
    "gpt3-175b": gpt_fields(12288, 96, 96, 2048, vocab_size=50257),
}
"""Family "lm" presets: GPT-2's shape (learned positions, biases, tanh GELU, tied head, GPT-2 init)."""
