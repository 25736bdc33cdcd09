"""Layers: primitives with explicit arguments. Every sequence layer is a token mixer (see docs/design.md)."""

from seqlab.layers.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNCell"]
