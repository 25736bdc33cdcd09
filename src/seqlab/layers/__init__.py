"""Layers: primitives with explicit arguments. Every sequence layer is a token mixer (see docs/design.md)."""

from seqlab.layers import attention_mixer  # noqa: F401  (registers the "attention" token mixer)
from seqlab.layers.attention import (
    KVCache,
    MultiheadAttention,
    SelfAttention,
    scaled_dot_product_attention,
    scaled_dot_product_attention_ref,
)
from seqlab.layers.linear_attention import LinearAttention
from seqlab.layers.mamba2 import Mamba2
from seqlab.layers.mingru import MinGRU
from seqlab.layers.mixer import (
    MixerSpec,
    TokenMixer,
    create_mixer,
    list_mixers,
    make_mixer_config,
    mixer_spec,
    register_mixer,
)
from seqlab.layers.mlp import MLP, SwiGLU
from seqlab.layers.norms import LayerNorm, RMSNorm
from seqlab.layers.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
)
from seqlab.layers.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from seqlab.layers.rnn_attention import AdditiveAttention, LuongAttention
from seqlab.layers.scan import selective_scan, selective_scan_ref
from seqlab.layers.ssm import S4D, Mamba
from seqlab.layers.transformer_blocks import TransformerDecoderLayer, TransformerEncoderLayer

__all__ = [
    "GRU",
    "LSTM",
    "MLP",
    "RNN",
    "S4D",
    "AdditiveAttention",
    "GRUCell",
    "KVCache",
    "LSTMCell",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "LinearAttention",
    "LuongAttention",
    "Mamba",
    "Mamba2",
    "MinGRU",
    "MixerSpec",
    "MultiheadAttention",
    "RMSNorm",
    "RNNCell",
    "RotaryEmbedding",
    "SelfAttention",
    "SinusoidalPositionalEncoding",
    "SwiGLU",
    "TokenMixer",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "create_mixer",
    "list_mixers",
    "make_mixer_config",
    "mixer_spec",
    "register_mixer",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_ref",
    "selective_scan",
    "selective_scan_ref",
]
