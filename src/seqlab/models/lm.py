"""The language-model backbone shared by every token mixer.

    tokens (b, t) -> embedding -> n_layers x [x + mixer(norm(x)); x + mlp(norm(x))] -> norm -> head -> logits

A token mixer moves information between positions (attention, a recurrence, a state-space scan); the channel
mixer (an MLP) works on each position alone. Swapping the mixer gives an LSTM LM, a Mamba LM, a Transformer
LM... at parameter counts that can be matched, which is what ``seqlab compare`` relies on. Residuals are
pre-norm (GPT-2, Radford et al. 2019): the residual stream itself is never normalized, which keeps deep
stacks trainable without warm-up tricks.

Every mixer speaks one interface (see docs/design.md):

    y, state = mixer(x, state)          # x (b, t, d) -> y (b, t, d)
    state = mixer.init_state(b)
    y_t, state = mixer.step(x_t, state)  # x_t (b, d) -> y_t (b, d)

``MIXERS`` maps a mixer name to a builder ``(config) -> nn.Module``; a new family registers itself there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from seqlab.layers.attention import SelfAttention
from seqlab.layers.linear_attention import LinearAttention
from seqlab.layers.mlp import MLP, SwiGLU
from seqlab.layers.norms import make_norm
from seqlab.layers.positional import RotaryEmbedding
from seqlab.layers.recurrent import GRU, LSTM, RNN
from seqlab.layers.ssm import S4D, Mamba
from seqlab.models.generation import generate


@dataclass
class LMConfig:
    mixer: str = "lstm"
    """Token mixer, a key of MIXERS: 'rnn', 'lstm', 'gru', ..."""
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    d_ff: int | None = None
    """Hidden width of the channel mixer; None means 4 * d_model, 0 means no channel mixer."""
    mlp: str = "gelu"
    """Channel mixer: 'gelu', 'relu' (MLP) or 'swiglu'."""
    norm: str = "layernorm"
    """'layernorm' or 'rmsnorm'."""
    dropout: float = 0.0
    tie_weights: bool = True
    """Share the embedding with the output head (Press & Wolf 2017)."""
    d_input: int | None = None
    """If set, inputs are float features (b, t, d_input) read through a linear layer instead of token ids."""
    d_output: int | None = None
    """Output size of the head; None means vocab_size."""
    max_seq_len: int = 1024
    """Longest context for mixers that need one (positions, KV cache); recurrent mixers ignore it."""
    n_heads: int = 4
    n_kv_heads: int | None = None
    window: int | None = None
    """Attention: sliding-window size (each position sees itself and the window - 1 before); None: all."""
    rope_base: float = 10000.0
    """Attention: the RoPE base θ (Su et al. 2021); 10000 as in the paper and Llama 2, 500000 in Llama 3."""
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | None = None
    """Mamba: rank of the Δ projection; None means ceil(d_model / 16), as in the paper."""
    norm_eps: float | None = None
    """Epsilon of every norm; None means the norm's default (1e-5 LayerNorm, 1e-6 RMSNorm). HF Mamba: 1e-5."""

    def __post_init__(self):
        if self.mixer not in MIXERS:
            raise ValueError(f"unknown mixer {self.mixer!r}; known mixers: {', '.join(sorted(MIXERS))}")
        for name in ("vocab_size", "d_model", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.mlp not in ("gelu", "relu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu', 'relu' or 'swiglu', got {self.mlp!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.tie_weights and (self.d_input is not None or self.d_output is not None):
            self.tie_weights = False  # nothing to tie: inputs or outputs are not the vocabulary

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff


def _lstm_mixer(d_model: int) -> LSTM:
    """An LSTM mixer whose forget gate starts open: bias +1 (Gers et al. 2000; Jozefowicz et al. 2015).

    torch.nn's init (all biases U(-1/√H, 1/√H)) starts with f ≈ σ(0) = 1/2, so memory decays as 2^-t until
    training opens the gate; starting at σ(1) ≈ 0.73 lets long-range gradients through from step one. The
    layer itself keeps torch.nn's init, so that it stays a drop-in; only this backbone mixer deviates.
    """
    lstm = LSTM(d_model, d_model)
    with torch.no_grad():
        lstm.bias_ih_l0[d_model : 2 * d_model].fill_(1.0)  # gates stacked [i, f, g, o]
        lstm.bias_hh_l0[d_model : 2 * d_model].zero_()
    return lstm


MIXERS: dict[str, Callable[[LMConfig], nn.Module]] = {
    "rnn": lambda c: RNN(c.d_model, c.d_model),
    "lstm": lambda c: _lstm_mixer(c.d_model),
    "gru": lambda c: GRU(c.d_model, c.d_model),
    # causal softmax attention; RoPE inside, so the backbone needs no absolute positions; state: a KV cache
    "attention": lambda c: SelfAttention(
        c.d_model,
        c.n_heads,
        c.n_kv_heads,
        bias=False,
        dropout=c.dropout,
        causal=True,
        window=c.window,
        rope=RotaryEmbedding(c.d_model // c.n_heads, base=c.rope_base),
    ),
    # causal linear attention (elu + 1 features); state: (S, z), O(1) per step
    "linear-attention": lambda c: LinearAttention(c.d_model, c.n_heads, causal=True),
    "s4d": lambda c: S4D(c.d_model, c.d_state, dropout=c.dropout),
    "mamba": lambda c: Mamba(c.d_model, c.d_state, c.d_conv, c.expand, dt_rank=c.dt_rank),
}


class Block(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)). Carries the mixer's state."""

    def __init__(self, config: LMConfig):
        super().__init__()
        c = config
        self.norm1 = make_norm(c.norm, c.d_model, eps=c.norm_eps)
        self.mixer = MIXERS[c.mixer](c)
        self.drop = nn.Dropout(c.dropout)
        self.norm2 = self.mlp = None
        if c.ff_width > 0:
            self.norm2 = make_norm(c.norm, c.d_model, eps=c.norm_eps)
            if c.mlp == "swiglu":
                self.mlp = SwiGLU(c.d_model, c.ff_width, dropout=c.dropout)
            else:
                self.mlp = MLP(c.d_model, c.ff_width, activation=c.mlp, dropout=c.dropout)

    def _channel(self, x: Tensor) -> Tensor:
        return x if self.mlp is None else x + self.mlp(self.norm2(x))

    def forward(self, x: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        y, state = self.mixer(self.norm1(x), state)  # (b, t, d)
        return self._channel(x + self.drop(y)), state

    def step(self, x_t: Tensor, state: Any) -> tuple[Tensor, Any]:
        y, state = self.mixer.step(self.norm1(x_t), state)  # (b, d)
        return self._channel(x_t + y), state


class LM(nn.Module):
    """The mixer backbone as a causal language model (or a sequence model over features)."""

    family = "lm"

    def __init__(self, config: LMConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        if c.d_input is None:
            self.embed = nn.Embedding(c.vocab_size, c.d_model)
        else:
            self.embed = nn.Linear(c.d_input, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = make_norm(c.norm, c.d_model, eps=c.norm_eps)
        self.head = nn.Linear(c.d_model, c.d_output or c.vocab_size, bias=False)
        if c.d_input is None:  # N(0, 0.02) as GPT-2: with tied weights, N(0, 1) would start with huge logits
            nn.init.normal_(self.embed.weight, std=0.02)
        if c.tie_weights:
            self.head.weight = self.embed.weight
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    def _embed(self, x: Tensor) -> Tensor:
        c = self.config
        if c.d_input is None and x.is_floating_point():
            raise ValueError(f"expected token ids (integer tensor), got {x.dtype}; set d_input for features")
        if c.d_input is not None and x.size(-1) != c.d_input:
            raise ValueError(f"expected features of shape (..., d_input={c.d_input}), got {tuple(x.shape)}")
        return self.drop(self.embed(x))

    def forward(self, x: Tensor, state: list | None = None, return_state: bool = False):
        """x (b, t) token ids [or (b, t, d_input)] -> logits (b, t, vocab) [and the per-layer states]."""
        h = self._embed(x)  # (b, t, d)
        states = [None] * len(self.blocks) if state is None else state
        new = []
        for block, s in zip(self.blocks, states, strict=True):
            h, s = block(h, s)
            new.append(s)
        logits = self.head(self.norm(h))  # (b, t, d) -> (b, t, vocab)
        return (logits, new) if return_state else logits

    def init_state(self, batch_size: int) -> list:
        return [b.mixer.init_state(batch_size) for b in self.blocks]

    def step(self, x_t: Tensor, state: list | None = None) -> tuple[Tensor, list]:
        """x_t (b,) token ids [or (b, d_input)] -> logits (b, vocab), new states."""
        h = self._embed(x_t)  # (b, d)
        states = self.init_state(h.size(0)) if state is None else state
        new = []
        for block, s in zip(self.blocks, states, strict=True):
            h, s = block.step(h, s)
            new.append(s)
        return self.head(self.norm(h)), new

    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        return generate(self, prompt_ids, max_new_tokens, temperature, top_k, top_p, generator)


PRESETS = {
    "test-lm-lstm": {"mixer": "lstm", "d_model": 32, "n_layers": 2},
    "test-lm-gru": {"mixer": "gru", "d_model": 32, "n_layers": 2},
    "test-lm-rnn": {"mixer": "rnn", "d_model": 32, "n_layers": 2},
    "test-lm-attention": {"mixer": "attention", "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2},
    "test-lm-linear-attention": {"mixer": "linear-attention", "d_model": 32, "n_layers": 2, "n_heads": 4},
}
