"""Recurrent sequence models: the char-RNN language model (Karpathy 2015; Graves 2013, arXiv 1308.0850)
and its variants for continuous inputs (the adding problem, images read as sequences).

    tokens (b, t) --embedding--> (b, t, d) --[RNN | LSTM | GRU] x n_layers--> (b, t, d) --head--> (b, t, vocab)

These are presets of the one LM stack (:class:`seqlab.models.lm.LM`) in its ``stacked`` layout: the recurrent
layers one after another with dropout between them (Zaremba et al. 2014), no norms or residuals, torch.nn's
initialization and a head with a bias. ``forward`` reads a whole sequence through the fused recurrent
kernels; ``step`` reads one position and carries the state, so generation costs O(1) per token.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS", "char_rnn_fields"]


def char_rnn_fields(cell: str, d_model: int, n_layers: int, dropout: float = 0.0) -> dict[str, Any]:
    """LMConfig fields of a char-RNN LM: embedding -> n_layers x ``cell`` (width d_model) -> linear head."""
    return {
        "mixer": cell,
        "mixer_config": {"forget_bias": None} if cell == "lstm" else {},  # torch.nn's init, as the original
        "layout": "stacked",
        "d_model": d_model,
        "n_layers": n_layers,
        "dropout": dropout,
        "tie_weights": False,
        "head_bias": True,
        "init": "torch",
    }


PRESETS: dict[str, dict[str, Any]] = {
    # name: config fields. Sizes are literal; `seqlab list` prints the parameter counts.
    "rnn-lm-small": char_rnn_fields("rnn", 512, 2),
    "lstm-lm-small": char_rnn_fields("lstm", 512, 2, dropout=0.1),
    "gru-lm-small": char_rnn_fields("gru", 512, 2, dropout=0.1),
    "test-rnn-lm": char_rnn_fields("rnn", 32, 1),
    "test-lstm-lm": char_rnn_fields("lstm", 32, 2),
    "test-gru-lm": char_rnn_fields("gru", 32, 1),
}
"""Family "lm" presets: the char-RNN language models."""
