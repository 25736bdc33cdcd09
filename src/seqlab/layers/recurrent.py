r"""Recurrent layers: RNN (Elman 1990), LSTM (Hochreiter & Schmidhuber 1997), GRU (Cho et al. 2014).

Notation: ``b`` batch, ``t`` time, ``H`` hidden size, ``L`` layers, ``D`` directions (1 or 2).

Every layer here is a drop-in for its ``torch.nn`` namesake: the same constructor arguments (except that
``batch_first`` defaults to True), the same parameter names, shapes and gate order, and the same state
layout ``(L * D, b, H)``, so ``ours.load_state_dict(theirs.state_dict())`` just works. The cells (one step,
``RNNCell``, ``LSTMCell``, ``GRUCell``) live in ``seqlab.layers.recurrent_cells`` and are re-exported here.
On top of torch.nn:

* ``forward(x, state=None, mask=None, *, lengths=None)``, the token-mixer interface: ``mask`` (b, t) boolean,
  True at real positions, padding on the right (whatever ``batch_first`` says, the mask is batch-first).
  ``lengths`` (b,) is the same information as ``pack_padded_sequence`` takes it; give one or the other.
  Padded batches are exact without sorting or packing by hand: the numbers equal ``pack_padded_sequence``
  through ``torch.nn``, and each sequence's outputs and final state equal those of the sequence run alone.
* ``init_state(batch_size, *, device=None, dtype=None)`` and ``step(x_t, state)``: one position at a time.
* Two paths (``seqlab.layers.fastpath``). The fast path runs RNN, GRU and LSTM on CPU through seqlab's fused
  kernel (``seqlab.kernels.recurrent``, compiled on first use, padded batches too: it holds a row's state
  through its padding, and an LSTM's projection; ``why_not_kernel`` says when it is not used) and everything
  else (CUDA, a failed build) through PyTorch's fused recurrent kernels, the
  ones ``torch.nn`` calls (oneDNN's for the LSTM on CPU). The reference path (``forward_ref``, or
  ``fast_path=False``) is the equations below written as a loop over time; ``why_not_fast_path`` says why
  the fast path is not taken.

Equations (one layer, one direction; ``σ`` the logistic sigmoid, ``⊙`` elementwise product):

RNN:   h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)          (or relu)
LSTM:  i, f, g, o = σ, σ, tanh, σ (W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)   gates stacked [i, f, g, o]
       c_t = f ⊙ c_{t-1} + i ⊙ g        # the additive path that lets gradients flow far back
       h_t = o ⊙ tanh(c_t)              # with proj_size: h_t = W_hr (o ⊙ tanh(c_t)) (Sak et al. 2014)
GRU:   r, z = σ (W_i{r,z} x_t + b_i{r,z} + W_h{r,z} h_{t-1} + b_h{r,z})          gates stacked [r, z, n]
       n   = tanh(W_in x_t + b_in + r ⊙ (W_hn h_{t-1} + b_hn))
       h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}

With a mask, position ``t`` of sequence ``j`` is padding when ``mask[j, t]`` is False (``t >= lengths[j]``):
the state is held (not updated) there and the output is zero. Holding the state also makes the reverse
direction start at each sequence's own end, because its loop meets padding first and leaves the initial
state untouched. Padded inputs are never read, so whatever fills them (even NaN) changes neither outputs
nor gradients. Every sequence needs at least one real position.

The reference loop is plain autograd over per-step tensor ops. Two details keep it close to the fused
kernels: the input projection W_ih x_t + b for all t is one matmul before the loop, and the loop reads it
through ``unbind`` (one autograd node) rather than ``gx[i]`` (one node per step whose backward builds a
full-size gradient: quadratic in t). Forward + backward on 2 CPU threads it takes about 1.5x the time of
torch.nn's LSTM (oneDNN's fused kernel) and about the time of its GRU and RNN
(benchmarks/results/recurrent-*.md, made by benchmarks/bench_recurrent.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.layers.recurrent_base import RNNBase, State
from seqlab.layers.recurrent_cells import (
    GRUCell,
    LSTMCell,
    RNNCell,
    _gru_update,
    _lstm_update,
    _rnn_update,
)
from seqlab.validation import check_choices, check_positive_ints

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNBase", "RNNCell", "State"]


class RNN(RNNBase):
    r"""Elman RNN, stacked and optionally bidirectional: h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh).

    Shapes: x (b, t, input_size) -> output (b, t, D * H), h_n (L * D, b, H). ``nonlinearity`` is
    'tanh' or 'relu'. Same arguments, parameter names and layout as torch.nn.RNN (``batch_first=True``).

    Examples::

        >>> rnn = RNN(3, 5, num_layers=2)
        >>> y, h = rnn(torch.randn(2, 7, 3), mask=torch.tensor([[True] * 7, [True] * 4 + [False] * 3]))
        >>> y.shape, h.shape
        (torch.Size([2, 7, 5]), torch.Size([2, 2, 5]))
    """

    n_gates = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: Literal["tanh", "relu"] = "tanh",
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0.0,
        bidirectional: bool = False,
        **kwargs,
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        self.mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(
            input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, **kwargs
        )

    def _update(self, gx, state, w_hh_t, b_hh):
        return (_rnn_update(gx, state[0], w_hh_t, self.nonlinearity == "relu"),)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s + (", nonlinearity='relu'" if self.nonlinearity == "relu" else "")


class LSTM(RNNBase):
    r"""LSTM (Hochreiter & Schmidhuber 1997, with the forget gate of Gers et al. 2000), stacked, optionally
    bidirectional. See the module docstring for the equations.

    Shapes: x (b, t, input_size) -> output (b, t, D * H), (h_n, c_n) each (L * D, b, H).
    Same arguments, parameter names, gate order [i, f, g, o] and layout as torch.nn.LSTM, except
    ``batch_first=True`` by default. ``proj_size=P`` (LSTMP, Sak et al. 2014) projects each step's output,
    h_t = W_hr (o ⊙ tanh(c_t)) with ``weight_hr_l{k}`` (P, H): the output is (b, t, D * P), h_n (L * D, b, P),
    c_n stays (L * D, b, H), and the next layer reads D * P inputs (torch.nn's layout). On the CPU it runs on
    seqlab's kernel (each step's projection one more product, dW_hr one product after the loop), elsewhere on
    torch.nn's.

    Examples::

        >>> lstm = LSTM(3, 5, bidirectional=True)
        >>> y, (h, c) = lstm(torch.randn(2, 7, 3), lengths=torch.tensor([7, 4]))
        >>> y.shape, h.shape, c.shape
        (torch.Size([2, 7, 10]), torch.Size([2, 2, 5]), torch.Size([2, 2, 5]))
    """

    mode = "LSTM"
    n_gates = 4

    def _update(self, gx, state, w_hh_t, b_hh):
        return _lstm_update(gx, state[0], state[1], w_hh_t)


class GRU(RNNBase):
    r"""GRU (Cho et al. 2014), stacked, optionally bidirectional, in torch.nn's formulation (b_hn sits inside
    the reset product). See the module docstring for the equations.

    Shapes: x (b, t, input_size) -> output (b, t, D * H), h_n (L * D, b, H). Gate order [r, z, n].

    Examples::

        >>> gru = GRU(3, 5)
        >>> y_t, h = gru.step(torch.randn(2, 3), gru.init_state(2))
        >>> y_t.shape, h.shape
        (torch.Size([2, 5]), torch.Size([1, 2, 5]))
    """

    mode = "GRU"
    n_gates = 3

    def _update(self, gx, state, w_hh_t, b_hh):
        return (_gru_update(gx, state[0], w_hh_t, b_hh),)


# ---- registration as token mixers (seqlab.layers.mixer) -------------------------------------------------


@dataclass
class RNNMixerConfig:
    nonlinearity: Literal["tanh", "relu"] = "tanh"

    def __post_init__(self):
        check_choices(self)


@dataclass
class LSTMMixerConfig:
    forget_bias: float | None = 1.0
    """Initial forget-gate bias (Gers et al. 2000; Jozefowicz et al. 2015): torch.nn's init starts with
    f ≈ σ(0) = 1/2, so memory decays as 2^-t until training opens the gate; σ(1) ≈ 0.73 lets long-range
    gradients through from the first step. None keeps torch.nn's init (the layer itself always does)."""
    cell_size: int | None = None
    """The cell's width H; None: d_model. Wider than d_model, the block is an LSTMP (Sak et al. 2014, for speech):
    H cells whose o ⊙ tanh(c) a projection W_hr brings back to d_model, the width the block carries and outputs
    (``LSTM(d_model, cell_size, proj_size=d_model)``): more memory per step for fewer recurrent weights than an
    LSTM of width H."""

    def __post_init__(self):
        v = self.forget_bias
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
            raise ValueError(f"forget_bias must be a finite number or None, got {v!r}")
        check_positive_ints(self, ("cell_size",), allow_none=True)


@dataclass
class GRUMixerConfig:
    pass


def _build_rnn(d_model: int, c: RNNMixerConfig, *, dropout: float, device=None, dtype=None) -> RNN:
    return RNN(d_model, d_model, nonlinearity=c.nonlinearity, device=device, dtype=dtype)


def _build_lstm(d_model: int, c: LSTMMixerConfig, *, dropout: float, device=None, dtype=None) -> LSTM:
    cells = d_model if c.cell_size is None else c.cell_size
    if cells < d_model:
        raise ValueError(
            f"cell_size={cells} must be at least d_model={d_model}: wider, the LSTM's projection brings its cells "
            "back to d_model (LSTMP); narrower has no projection to widen them (leave it unset for d_model)"
        )
    proj = d_model if cells > d_model else 0
    lstm = LSTM(d_model, cells, proj_size=proj, device=device, dtype=dtype)
    if c.forget_bias is not None:
        with torch.no_grad():
            lstm.bias_ih_l0[cells : 2 * cells].fill_(c.forget_bias)  # gates stacked [i, f, g, o]
            lstm.bias_hh_l0[cells : 2 * cells].zero_()
    return lstm


def _build_gru(d_model: int, c: GRUMixerConfig, *, dropout: float, device=None, dtype=None) -> GRU:
    return GRU(d_model, d_model, device=device, dtype=dtype)


register_mixer(
    MixerSpec(
        "rnn",
        RNNMixerConfig,
        _build_rnn,
        family="RNN",
        summary="Elman RNN, h_t = tanh(W x_t + U h_{t-1} + b) (Elman 1990)",
        year=1990,
        step_cost=0.9,  # a lab run's training step: 0.86x the LSTM's (docs/adding-a-mixer.md, section 7)
    )
)
register_mixer(
    MixerSpec(
        "lstm",
        LSTMMixerConfig,
        _build_lstm,
        family="RNN",
        summary="LSTM with its additive cell state (Hochreiter & Schmidhuber 1997)",
        year=1997,
        step_cost=1.0,  # the unit: the other mixers' costs are relative to the LSTM's
    )
)
register_mixer(
    MixerSpec(
        "gru",
        GRUMixerConfig,
        _build_gru,
        family="RNN",
        summary="GRU, reset and update gates (Cho et al. 2014)",
        year=2014,
        step_cost=0.9,  # a lab run's training step: 0.90x the LSTM's (docs/adding-a-mixer.md, section 7)
    )
)
