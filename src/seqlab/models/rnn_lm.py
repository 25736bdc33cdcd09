"""Recurrent sequence models: the char-RNN language model (Karpathy 2015; Graves 2013, arXiv 1308.0850)
and its variants for continuous inputs (the adding problem, images read as sequences).

    tokens (b, t) --embedding--> (b, t, d) --[RNN | LSTM | GRU] x n_layers--> (b, t, d) --head--> (b, t, vocab)

Everything is batch-first. ``forward`` reads a whole sequence through the fused recurrent kernel; ``step``
reads one position and carries the state, so generation costs O(1) per token whatever came before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from seqlab.layers.recurrent import GRU, LSTM, RNN, State
from seqlab.models.generation import generate


@dataclass
class RNNLMConfig:
    cell: Literal["rnn", "lstm", "gru"] = "lstm"
    """Which recurrence: Elman RNN (tanh), LSTM or GRU."""
    vocab_size: int = 256
    d_model: int = 256
    """Embedding width and hidden size of every recurrent layer."""
    n_layers: int = 2
    dropout: float = 0.0
    """Dropout on the embedding, between recurrent layers and before the head (Zaremba et al. 2014)."""
    tie_weights: bool = False
    """Share the embedding matrix with the output head (Press & Wolf 2017)."""
    d_input: int | None = None
    """If set, inputs are float features (b, t, d_input) read through a linear layer instead of token ids."""
    d_output: int | None = None
    """Output size of the head; None means vocab_size (next-token logits)."""

    def __post_init__(self):
        if self.cell not in ("rnn", "lstm", "gru"):
            raise ValueError(f"cell must be 'rnn', 'lstm' or 'gru', got {self.cell!r}")
        for name in ("vocab_size", "d_model", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.tie_weights and (self.d_input is not None or self.d_output is not None):
            raise ValueError(
                "tie_weights needs token inputs and next-token outputs (d_input = d_output = None)"
            )


_CELLS = {"rnn": RNN, "lstm": LSTM, "gru": GRU}


class RNNLM(nn.Module):
    """Embedding -> stacked recurrent layers -> linear head. See the module docstring."""

    family = "rnn_lm"

    def __init__(self, config: RNNLMConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        if c.d_input is None:
            self.embed = nn.Embedding(c.vocab_size, c.d_model, **kw)
        else:
            self.embed = nn.Linear(c.d_input, c.d_model, **kw)
        self.drop = nn.Dropout(c.dropout)
        self.rnn = _CELLS[c.cell](c.d_model, c.d_model, num_layers=c.n_layers, dropout=c.dropout, **kw)
        self.head = nn.Linear(c.d_model, c.d_output or c.vocab_size, **kw)
        if c.tie_weights:
            self.head.weight = self.embed.weight

    def _embed(self, x: Tensor) -> Tensor:
        c = self.config
        if c.d_input is None:
            if x.dtype not in (torch.long, torch.int, torch.int16, torch.uint8):
                raise ValueError(
                    f"expected token ids (integer tensor), got {x.dtype}; set d_input for features"
                )
        elif x.size(-1) != c.d_input:
            raise ValueError(f"expected features of shape (..., d_input={c.d_input}), got {tuple(x.shape)}")
        return self.drop(self.embed(x))

    def forward(self, x: Tensor, state: State | None = None, return_state: bool = False):
        """x (b, t) token ids [or (b, t, d_input) features] -> logits (b, t, vocab) [and the state]."""
        h, state = self.rnn(self._embed(x), state)  # (b, t, d)
        logits = self.head(self.drop(h))  # (b, t, d) -> (b, t, vocab)
        return (logits, state) if return_state else logits

    def init_state(self, batch_size: int) -> State:
        return self.rnn.init_state(batch_size)

    def step(self, x_t: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """x_t (b,) token ids [or (b, d_input)] -> logits (b, vocab), new state. O(1) per position."""
        h, state = self.rnn.step(self._embed(x_t), state)  # (b, d)
        return self.head(h), state

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
    # name: config fields. Sizes are literal; `seqlab list` prints the parameter counts.
    "rnn-lm-small": {"cell": "rnn", "d_model": 512, "n_layers": 2},
    "lstm-lm-small": {"cell": "lstm", "d_model": 512, "n_layers": 2, "dropout": 0.1},
    "gru-lm-small": {"cell": "gru", "d_model": 512, "n_layers": 2, "dropout": 0.1},
    "test-rnn-lm": {"cell": "rnn", "d_model": 32, "n_layers": 1},
    "test-lstm-lm": {"cell": "lstm", "d_model": 32, "n_layers": 2},
    "test-gru-lm": {"cell": "gru", "d_model": 32, "n_layers": 1},
}
