r"""Recurrent cells, one step each: RNNCell (Elman 1990), LSTMCell (Hochreiter & Schmidhuber 1997), GRUCell
(Cho et al. 2014), drop-ins for their ``torch.nn`` namesakes, and the update functions that the layers of
``seqlab.layers.recurrent`` run in their reference loop.

Notation: ``b`` batch, ``H_in`` input size, ``H`` hidden size, ``G`` gates (1 RNN, 4 LSTM, 3 GRU).
The equations are in ``seqlab.layers.recurrent``'s module docstring; layouts and gate orders are torch.nn's.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.checks import check_dtype
from seqlab.validation import check_positive_ints

__all__ = ["GRUCell", "LSTMCell", "RNNCell"]

# ----------------------------------------------------------------------------------------------------------
# One step of each recurrence. ``gx`` (b, G*H) is the input projection W_ih x_t + b_ih, computed by the caller
# for all positions at once; for RNN and LSTM it also carries b_hh, which is then not passed here. ``w_hh_t``
# is W_hh transposed, (H, G*H), so that the recurrent product is one ``addmm`` per step.


def _rnn_update(gx: Tensor, h: Tensor, w_hh_t: Tensor, relu: bool) -> Tensor:
    pre = torch.addmm(gx, h, w_hh_t)  # W_ih x + b + W_hh h: (b, H) + (b, H) x (H, H) -> (b, H)
    return torch.relu(pre) if relu else torch.tanh(pre)


def _lstm_update(gx: Tensor, h: Tensor, c: Tensor, w_hh_t: Tensor) -> tuple[Tensor, Tensor]:
    i, f, g, o = torch.addmm(gx, h, w_hh_t).chunk(4, 1)  # (b, 4H) + (b, H) x (H, 4H) -> 4 x (b, H)
    c = torch.addcmul(f.sigmoid() * c, i.sigmoid(), g.tanh())  # c' = f ⊙ c + i ⊙ g
    return o.sigmoid() * c.tanh(), c  # h' = o ⊙ tanh(c')


def _gru_update(gx: Tensor, h: Tensor, w_hh_t: Tensor, b_hh: Tensor | None) -> Tensor:
    gh = torch.mm(h, w_hh_t) if b_hh is None else torch.addmm(b_hh, h, w_hh_t)  # (b, H) x (H, 3H) -> (b, 3H)
    x_r, x_z, x_n = gx.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(torch.addcmul(x_n, r, h_n))  # W_in x + b_in + r ⊙ (W_hn h + b_hn)
    return torch.lerp(n, h, z)  # (1 - z) ⊙ n + z ⊙ h


# ----------------------------------------------------------------------------------------------------------
# Cells


class _CellBase(nn.Module):
    n_gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        check_positive_ints(self, ("input_size", "hidden_size"), prefix=f"{type(self).__name__}: ")
        g = self.n_gates * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(g, input_size, **kw))
        self.weight_hh = nn.Parameter(torch.empty(g, hidden_size, **kw))
        if bias:
            self.bias_ih = nn.Parameter(torch.empty(g, **kw))
            self.bias_hh = nn.Parameter(torch.empty(g, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """U(-1/√H, 1/√H) for every weight and bias, as torch.nn does."""
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def _prepare(self, x: Tensor, state: Tensor | tuple[Tensor, ...] | None, n_state: int):
        """Validate x (b, H_in) or unbatched (H_in,) and the state; return x and state as (b, ...) tensors.

        Returns (x, state parts as a tuple, unbatched flag); a missing state becomes zeros.
        """
        name = type(self).__name__
        if not isinstance(x, Tensor) or x.dim() not in (1, 2) or x.size(-1) != self.input_size:
            raise ValueError(
                f"{name} expects x of shape (b, {self.input_size}) or ({self.input_size},), "
                f"got {tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}"
            )
        check_dtype(name, x, self.weight_ih)
        unbatched = x.dim() == 1
        x = x.unsqueeze(0) if unbatched else x
        shape = (x.size(0), self.hidden_size)
        if state is None:
            return x, tuple(x.new_zeros(shape) for _ in range(n_state)), unbatched
        parts = tuple(state) if n_state > 1 and isinstance(state, tuple | list) else (state,)
        want = shape[1:] if unbatched else shape
        if len(parts) != n_state or any(not isinstance(s, Tensor) or tuple(s.shape) != want for s in parts):
            got = [tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__ for s in parts]
            what = f"a pair (h, c), each of shape {want}" if n_state > 1 else f"h of shape {want}"
            raise ValueError(f"{name} expects {what}, got {got if n_state > 1 else got[0]}")
        for i, part in enumerate(parts):
            check_dtype(name, part, self.weight_ih, what="c" if i else "h")
        return x, tuple(s.unsqueeze(0) if unbatched else s for s in parts), unbatched

    def _input_projection(self, x: Tensor, fold_b_hh: bool) -> Tensor:
        """W_ih x + b_ih (+ b_hh when ``fold_b_hh``): (b, H_in) x (H_in, G*H) -> (b, G*H)."""
        bias = self.bias_ih + self.bias_hh if fold_b_hh and self.bias else self.bias_ih
        return F.linear(x, self.weight_ih, bias)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"


class RNNCell(_CellBase):
    r"""One step of an Elman RNN: h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (or relu).

    Shapes: x (b, H_in), h (b, H) -> h' (b, H); unbatched x (H_in,) and h (H,) work too.
    Layout matches torch.nn.RNNCell.
    """

    def __init__(
        self,
        input_size,
        hidden_size,
        bias=True,
        nonlinearity: Literal["tanh", "relu"] = "tanh",
        device=None,
        dtype=None,
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, device, dtype)

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        x, (h,), unbatched = self._prepare(x, h, 1)
        gx = self._input_projection(x, fold_b_hh=True)  # (b, H)
        h = _rnn_update(gx, h, self.weight_hh.t(), self.nonlinearity == "relu")
        return h.squeeze(0) if unbatched else h

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s + (", nonlinearity='relu'" if self.nonlinearity == "relu" else "")


class LSTMCell(_CellBase):
    r"""One step of an LSTM (Hochreiter & Schmidhuber, 1997).

        i, f, g, o = σ, σ, tanh, σ (W_ih x + b_ih + W_hh h + b_hh)
        c' = f ⊙ c + i ⊙ g
        h' = o ⊙ tanh(c')

    Shapes: x (b, H_in); h, c (b, H) -> (h', c') (b, H); unbatched x (H_in,) with h, c (H,) work too.
    Layout matches torch.nn.LSTMCell: weight_ih is (4H, H_in), gates stacked [i, f, g, o].
    """

    n_gates = 4

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        x, (h, c), unbatched = self._prepare(x, state, 2)
        gx = self._input_projection(x, fold_b_hh=True)  # (b, 4H)
        h, c = _lstm_update(gx, h, c, self.weight_hh.t())
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)


class GRUCell(_CellBase):
    r"""One step of a GRU (Cho et al., 2014), in torch.nn's formulation (b_hn inside the reset product).

        r, z = σ(W_i{r,z} x + b_i{r,z} + W_h{r,z} h + b_h{r,z})
        n  = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
        h' = (1 - z) ⊙ n + z ⊙ h

    Shapes: x (b, H_in), h (b, H) -> h' (b, H); unbatched x (H_in,) and h (H,) work too.
    Gates stacked [r, z, n] as in torch.nn.GRUCell.
    """

    n_gates = 3

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        x, (h,), unbatched = self._prepare(x, h, 1)
        gx = self._input_projection(x, fold_b_hh=False)  # (b, 3H); b_hn must stay inside r ⊙ (...)
        h = _gru_update(gx, h, self.weight_hh.t(), self.bias_hh)
        return h.squeeze(0) if unbatched else h
