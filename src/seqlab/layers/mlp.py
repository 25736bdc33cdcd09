"""Channel mixers: the position-wise feed-forward network of the Transformer (Vaswani et al. 2017, eq. 2) and
the gated SwiGLU variant (Shazeer 2020, arXiv 2002.05202) used by Llama-style decoders.

    MLP(x)    = W_2 act(W_1 x + b_1) + b_2                    act = ReLU (2017) or GELU (GPT-2, BERT)
    SwiGLU(x) = W_down (SiLU(W_gate x) ⊙ W_up x)             no biases, as in Llama
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.kernels.activations import gelu, gelu_bias, gelu_bias_ready, gelu_tanh
from seqlab.layers.checks import check_last_axis
from seqlab.layers.fastpath import hook_reason
from seqlab.layers.linear import Linear, linear
from seqlab.validation import check_dropout, check_positive_ints

# gelu, gelu_tanh: F.gelu(x) and F.gelu(x, approximate="tanh") through seqlab's vectorized kernel on the CPU
# (seqlab.kernels.activations)
ACTIVATIONS = {"relu": F.relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": F.silu}  # by their config names
_GELU = {"gelu": "none", "gelu_tanh": "tanh"}  # F.gelu's approximate= for the activations with a bias kernel


class MLP(nn.Module):
    """x (..., d_model) -> (..., d_model) through a hidden layer of width d_ff."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: Literal["relu", "gelu", "gelu_tanh", "silu"] = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.d_model, self.d_ff, self.dropout = d_model, d_ff, dropout
        check_positive_ints(self, ("d_model", "d_ff"), prefix="MLP: ")
        check_dropout(self, prefix="MLP: ")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.fc1 = Linear(d_model, d_ff, bias=bias, device=device, dtype=dtype)
        self.fc2 = Linear(d_ff, d_model, bias=bias, device=device, dtype=dtype)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        check_last_axis("MLP", x, self.fc1.weight, self.d_model)
        return self.drop(self.fc2(self.hidden(x)))  # (.., d) -> (.., d_ff) -> (.., d)

    def hidden(self, x: Tensor) -> Tensor:
        """act(W_1 x + b_1): (.., d) -> (.., d_ff). GELU (either form) on the CPU in float32/float64 takes the
        product without its bias and adds the bias inside the GELU kernel (one pass fewer each way; the bias
        gradient comes out of the GELU's backward)."""
        fc1 = self.fc1
        if (
            self.activation in _GELU
            and gelu_bias_ready(x, fc1.weight, fc1.bias)
            and hook_reason([("fc1", fc1)]) is None
        ):
            return gelu_bias(linear(x, fc1.weight), fc1.bias, _GELU[self.activation])
        return ACTIVATIONS[self.activation](fc1(x))


class SwiGLU(nn.Module):
    """x (..., d_model) -> (..., d_model): W_down (SiLU(W_gate x) ⊙ W_up x)."""

    def __init__(
        self, d_model: int, d_ff: int, bias: bool = False, dropout: float = 0.0, device=None, dtype=None
    ):
        super().__init__()
        self.d_model, self.d_ff, self.dropout = d_model, d_ff, dropout
        check_positive_ints(self, ("d_model", "d_ff"), prefix="SwiGLU: ")
        check_dropout(self, prefix="SwiGLU: ")
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate = Linear(d_model, d_ff, **kw)
        self.up = Linear(d_model, d_ff, **kw)
        self.down = Linear(d_ff, d_model, **kw)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        check_last_axis("SwiGLU", x, self.gate.weight, self.d_model)
        return self.drop(self.down(F.silu(self.gate(x)) * self.up(x)))
