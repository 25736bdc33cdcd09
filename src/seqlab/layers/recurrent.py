r"""Recurrent layers: RNN (Elman 1990), LSTM (Hochreiter & Schmidhuber 1997), GRU (Cho et al. 2014).

Notation: ``b`` batch, ``t`` time, ``H`` hidden size, ``L`` layers, ``D`` directions (1 or 2).

Every layer here is a drop-in for its ``torch.nn`` namesake: the same constructor arguments (except that
``batch_first`` defaults to True), the same parameter names, shapes and gate order, and the same state
layout ``(L * D, b, H)``, so ``ours.load_state_dict(theirs.state_dict())`` just works. On top of that:

* ``forward(x, state=None, lengths=None)``: ``lengths`` makes padded batches exact without sorting or
  packing by hand; the numbers equal ``pack_padded_sequence`` through ``torch.nn``.
* ``init_state(batch_size)`` and ``step(x_t, state)``: one position at a time (the token-mixer interface).
* Two paths. The fast path hands the whole stack to PyTorch's fused recurrent kernels (the ones
  ``torch.nn.LSTM`` calls). The reference path (``forward_ref``) is the equations below written as a loop
  over time; ``why_not_fast_path`` says why the fast path was not taken.

Equations (one layer, one direction; ``σ`` the logistic sigmoid, ``⊙`` elementwise product):

RNN:   h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)          (or relu)
LSTM:  i, f, g, o = σ, σ, tanh, σ (W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)   gates stacked [i, f, g, o]
       c_t = f ⊙ c_{t-1} + i ⊙ g        # the additive path that lets gradients flow far back
       h_t = o ⊙ tanh(c_t)
GRU:   r, z = σ (W_i{r,z} x_t + b_i{r,z} + W_h{r,z} h_{t-1} + b_h{r,z})          gates stacked [r, z, n]
       n   = tanh(W_in x_t + b_in + r ⊙ (W_hn h_{t-1} + b_hn))
       h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}

With ``lengths``, position ``t`` of sequence ``j`` is padding when ``t >= lengths[j]``: the state is held
(not updated) there and the output is zero. Holding the state also makes the reverse direction start at
each sequence's own end, because its loop meets padding first and leaves the initial state untouched.
Padded inputs are never read, so whatever fills them (even NaN) changes neither outputs nor gradients.

The reference loop is plain autograd over per-step tensor ops. Two details keep it close to the fused
kernels: the input projection W_ih x_t + b for all t is one matmul before the loop, and the loop reads it
through ``unbind`` (one autograd node) rather than ``gx[i]`` (one node per step whose backward builds a
full-size gradient: quadratic in t). Forward + backward on 2 CPU threads it takes about 1.5x the time of
torch.nn's LSTM (oneDNN's fused kernel) and about the time of its GRU and RNN
(benchmarks/results/recurrent-*.md, made by benchmarks/bench_recurrent.py).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from seqlab.layers.mixer import MixerSpec, register_mixer

State = Tensor | tuple[Tensor, Tensor]

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNCell", "State"]

logger = logging.getLogger(__name__)
_logged_reasons: set[str] = set()  # why_not_fast_path reasons already logged: each is said once


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
        if x.dim() not in (1, 2) or x.size(-1) != self.input_size:
            raise ValueError(
                f"{name} expects x of shape (b, {self.input_size}) or ({self.input_size},), "
                f"got {tuple(x.shape)}"
            )
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


# ----------------------------------------------------------------------------------------------------------
# Layers


class _RNNBase(nn.Module):
    mode: str = ""  # name of the fused kernel in torch._VF
    n_gates: int = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0.0,
        bidirectional: bool = False,
        *,
        fast_path: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if input_size <= 0 or hidden_size <= 0 or num_layers <= 0:
            raise ValueError(
                f"input_size, hidden_size and num_layers must be positive, got "
                f"{input_size}, {hidden_size}, {num_layers}"
            )
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.fast_path = fast_path
        self.last_path: Literal["fast", "ref"] | None = None  # which path the last forward took
        kw = {"device": device, "dtype": dtype}
        g = self.n_gates * hidden_size
        self._flat_names: list[str] = []
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else hidden_size * self.num_directions
            for suffix in ("", "_reverse")[: self.num_directions]:
                names = [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}"]
                setattr(self, names[0], nn.Parameter(torch.empty(g, layer_in, **kw)))
                setattr(self, names[1], nn.Parameter(torch.empty(g, hidden_size, **kw)))
                if bias:
                    names += [f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
                    setattr(self, names[2], nn.Parameter(torch.empty(g, **kw)))
                    setattr(self, names[3], nn.Parameter(torch.empty(g, **kw)))
                self._flat_names += names
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """U(-1/√H, 1/√H) for every weight and bias, as torch.nn does."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    @property
    def _flat_weights(self) -> list[Tensor]:
        return [getattr(self, n) for n in self._flat_names]

    def _layer_params(self, layer: int, reverse: bool) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        s = f"l{layer}{'_reverse' if reverse else ''}"
        if self.bias:
            return (
                getattr(self, f"weight_ih_{s}"),
                getattr(self, f"weight_hh_{s}"),
                getattr(self, f"bias_ih_{s}"),
                getattr(self, f"bias_hh_{s}"),
            )
        return getattr(self, f"weight_ih_{s}"), getattr(self, f"weight_hh_{s}"), None, None

    # ---- state -------------------------------------------------------------------------------------------

    def init_state(self, batch_size: int, device=None, dtype=None) -> State:
        """Zeros in torch.nn's layout: ``h`` (or ``(h, c)`` for LSTM) of shape (L * D, b, H)."""
        p = self.weight_ih_l0
        h = torch.zeros(
            self.num_layers * self.num_directions,
            batch_size,
            self.hidden_size,
            device=device or p.device,
            dtype=dtype or p.dtype,
        )
        return (h, h.clone()) if self.mode == "LSTM" else h

    def _check_state(self, state: State, x: Tensor, b: int, unbatched: bool) -> None:
        shape = (self.num_layers * self.num_directions, b, self.hidden_size)
        if unbatched:
            shape = (shape[0], shape[2])
        if self.mode == "LSTM" and not (isinstance(state, tuple | list) and len(state) == 2):
            raise ValueError(
                f"LSTM state must be a pair (h, c), each of shape {shape}, got {type(state).__name__}"
            )
        parts = state if self.mode == "LSTM" else (state,)
        for name, s in zip("hc", parts, strict=False):
            if not isinstance(s, Tensor) or tuple(s.shape) != shape:
                got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                layout = "num_layers * num_directions, " + ("" if unbatched else "b, ") + "hidden_size"
                raise ValueError(
                    f"{type(self).__name__} state {name} must have shape ({layout}) = {shape}, got {got}"
                )
            if s.dtype != x.dtype or s.device != x.device:
                raise ValueError(
                    f"{type(self).__name__} state {name} is {s.dtype} on {s.device} but x is "
                    f"{x.dtype} on {x.device}; move the state with .to(x)"
                )

    # ---- input checks ------------------------------------------------------------------------------------

    def _check_lengths(self, lengths: Tensor | list[int], b: int, t: int) -> Tensor | None:
        lengths = torch.as_tensor(lengths)
        integral = not (lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool)
        if lengths.dim() != 1 or lengths.numel() != b or not integral:
            raise ValueError(
                f"lengths must be an integer tensor of shape (b,) = ({b},), got "
                f"{lengths.dtype} of shape {tuple(lengths.shape)}"
            )
        if b == 0:
            return None  # an empty batch has nothing to mask
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 1:
            raise ValueError(f"every length must be at least 1, got a length of {lo}")
        if hi > t:
            raise ValueError(f"lengths cannot exceed the sequence length t={t}, got a length of {hi}")
        return lengths

    def _prepare(
        self, x: Tensor, state: State | None, lengths: Tensor | None
    ) -> tuple[Tensor, State, Tensor | None, bool]:
        """Validate the inputs of a forward; return x, state (zeros if None) and lengths, batched."""
        layout = "(b, t, input_size)" if self.batch_first else "(t, b, input_size)"
        if x.dim() not in (2, 3) or x.size(-1) != self.input_size:
            raise ValueError(
                f"{type(self).__name__} expects x of shape {layout} (or unbatched (t, input_size)) with "
                f"input_size={self.input_size}, got {tuple(x.shape)}"
            )
        unbatched = x.dim() == 2  # torch.nn also accepts a single unbatched sequence (t, input_size)
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        b, t = (x.size(0), x.size(1)) if self.batch_first else (x.size(1), x.size(0))
        if t == 0:
            raise ValueError(
                f"{type(self).__name__} needs at least one time step, got x of shape {tuple(x.shape)}"
            )
        if lengths is not None:
            lengths = self._check_lengths(lengths, b, t)
        if state is None:
            return x, self.init_state(b, x.device, x.dtype), lengths, unbatched
        self._check_state(state, x, b, unbatched)
        if unbatched:
            state = tuple(s.unsqueeze(1) for s in state) if self.mode == "LSTM" else state.unsqueeze(1)
        return x, (tuple(state) if self.mode == "LSTM" else state), lengths, unbatched

    def _finish(self, out: Tensor, state: State, unbatched: bool) -> tuple[Tensor, State]:
        if unbatched:
            out = out.squeeze(0 if self.batch_first else 1)
            state = tuple(s.squeeze(1) for s in state) if self.mode == "LSTM" else state.squeeze(1)
        return out, state

    # ---- the two paths ------------------------------------------------------------------------------------

    def why_not_fast_path(self, x: Tensor | None = None) -> str | None:
        """Why ``forward`` would use the reference path for this input, or None if the fused kernel is used."""
        if not self.fast_path:
            return "fast_path=False was set on this layer"
        if x is not None and torch.overrides.has_torch_function((x,)):
            return "the input is a tensor subclass or carries __torch_function__ overrides"
        return None

    def forward(
        self, x: Tensor, state: State | None = None, lengths: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """x (b, t, input_size) -> output (b, t, D * H), state (L * D, b, H) [or (h, c) for LSTM].

        ``lengths`` (b,), any order and device: positions at or beyond a sequence's length are padding.
        A single unbatched sequence (t, input_size) with state (L * D, H) works too, as in torch.nn.
        """
        x, state, lengths, unbatched = self._prepare(x, state, lengths)
        reason = self.why_not_fast_path(x)
        if reason is None:
            self.last_path = "fast"
            out, state = self._forward_fast(x, state, lengths)
        else:
            if self.fast_path and reason not in _logged_reasons:  # an opt-out needs no explanation
                _logged_reasons.add(reason)
                logger.info("%s takes the reference path: %s", type(self).__name__, reason)
            self.last_path = "ref"
            out, state = self._forward_ref(x, state, lengths)
        return self._finish(out, state, unbatched)

    def forward_ref(
        self, x: Tensor, state: State | None = None, lengths: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """The reference path, whatever ``fast_path`` says: the equations as a loop over time."""
        x, state, lengths, unbatched = self._prepare(x, state, lengths)
        self.last_path = "ref"
        return self._finish(*self._forward_ref(x, state, lengths), unbatched)

    def _forward_fast(self, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
        kernel = getattr(torch._VF, self.mode.lower())
        hx = state if self.mode == "LSTM" else (state,)
        args = (
            self._flat_weights,
            self.bias,
            self.num_layers,
            self.dropout,
            self.training,
            self.bidirectional,
        )
        if lengths is None:
            res = kernel(x, hx if self.mode == "LSTM" else hx[0], *args, self.batch_first)
            return res[0], ((res[1], res[2]) if self.mode == "LSTM" else res[1])
        t = x.size(1) if self.batch_first else x.size(0)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=self.batch_first, enforce_sorted=False)
        hx = tuple(s.index_select(1, packed.sorted_indices) for s in hx)  # states follow the sorted order
        res = kernel(packed.data, packed.batch_sizes, hx if self.mode == "LSTM" else hx[0], *args)
        out = PackedSequence(res[0], packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
        out, _ = pad_packed_sequence(out, batch_first=self.batch_first, total_length=t)
        final = tuple(s.index_select(1, packed.unsorted_indices) for s in res[1:])
        return out, (final if self.mode == "LSTM" else final[0])

    def _forward_ref(self, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
        x = x.transpose(0, 1) if self.batch_first else x  # (t, b, in): the loop walks the leading dimension
        t = x.size(0)
        hs = [s.unbind(0) for s in (state if self.mode == "LSTM" else (state,))]  # each L * D x (b, H)
        keep = None
        if lengths is not None:
            # keep[t, j] is True where position t is real for sequence j: (t, b, 1)
            keep = (torch.arange(t, device=x.device)[:, None] < lengths.to(x.device)[None, :]).unsqueeze(-1)
            # padding never enters the arithmetic, so whatever fills it (even NaN) cannot reach a gradient
            x = x.masked_fill(~keep, 0.0)
        finals: list[list[Tensor]] = [[] for _ in hs]
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.num_directions):
                k = layer * self.num_directions + d
                y, last = self._direction_ref(x, tuple(s[k] for s in hs), layer, d == 1, keep)
                outs.append(y)
                for f, s in zip(finals, last, strict=True):
                    f.append(s)
            x = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)  # (t, b, D * H)
            if keep is not None:
                x = x.masked_fill(~keep, 0.0)  # padded positions output zero
            if layer < self.num_layers - 1 and self.dropout > 0:
                x = F.dropout(x, self.dropout, self.training)
        out = x.transpose(0, 1) if self.batch_first else x
        new = tuple(torch.stack(f) for f in finals)  # (L * D, b, H)
        return out, (new if self.mode == "LSTM" else new[0])

    def _direction_ref(
        self, x: Tensor, state: tuple[Tensor, ...], layer: int, reverse: bool, keep: Tensor | None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One layer, one direction. x (t, b, in) -> y (t, b, H) and the final state."""
        w_ih, w_hh, b_ih, b_hh = self._layer_params(layer, reverse)
        fold = self.mode != "GRU" and self.bias  # RNN/LSTM: fold b_hh into the input projection
        gx = F.linear(x, w_ih, b_ih + b_hh if fold else b_ih)  # (t, b, in) x (in, G*H) -> (t, b, G*H)
        # unbind, not gx[i]: one autograd node for all t slices. Indexing per step would make the backward
        # build a zero-filled (t, b, G*H) gradient for every step, O(t²) time in the sequence length.
        gx_steps = gx.unbind(0)  # t x (b, G*H)
        keep_steps = keep.unbind(0) if keep is not None else None  # t x (b, 1)
        w_hh_t = w_hh.t()  # (H, G*H), transposed once here rather than at every step
        b_rec = b_hh if self.mode == "GRU" else None  # GRU: b_hn sits inside r ⊙ (...), so it cannot fold
        ys: list[Tensor] = [None] * x.size(0)  # type: ignore[list-item]
        for i in range(x.size(0) - 1, -1, -1) if reverse else range(x.size(0)):
            new = self._update(gx_steps[i], state, w_hh_t, b_rec)
            if keep_steps is not None:  # padding: hold the state
                new = tuple(torch.where(keep_steps[i], n, s) for n, s in zip(new, state, strict=True))
            ys[i] = new[0]
            state = new
        return torch.stack(ys), state

    def _update(
        self, gx: Tensor, state: tuple[Tensor, ...], w_hh_t: Tensor, b_hh: Tensor | None
    ) -> tuple[Tensor, ...]:
        """One step: gx (b, G*H), state parts (b, H) -> new state parts; the first is the output."""
        raise NotImplementedError

    # ---- one position at a time ---------------------------------------------------------------------------

    def step(self, x_t: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """One position: x_t (b, input_size) -> y_t (b, H), new state. O(1) in the number of past steps."""
        if self.bidirectional:
            raise ValueError("step() needs a unidirectional layer: a bidirectional one reads the future")
        if x_t.dim() != 2 or x_t.size(1) != self.input_size:
            raise ValueError(f"step expects x_t of shape (b, {self.input_size}), got {tuple(x_t.shape)}")
        x = x_t.unsqueeze(1) if self.batch_first else x_t.unsqueeze(0)
        y, state = self.forward(x, state)
        return (y[:, 0] if self.batch_first else y[0]), state

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if not self.batch_first:
            s += ", batch_first=False"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        if not self.fast_path:
            s += ", fast_path=False"
        return s


class RNN(_RNNBase):
    r"""Elman RNN, stacked and optionally bidirectional: h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh).

    Shapes: x (b, t, input_size) -> output (b, t, D * H), h_n (L * D, b, H). ``nonlinearity`` is
    'tanh' or 'relu'. Same arguments, parameter names and layout as torch.nn.RNN (``batch_first=True``).
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


class LSTM(_RNNBase):
    r"""LSTM (Hochreiter & Schmidhuber 1997, with the forget gate of Gers et al. 2000), stacked, optionally
    bidirectional. See the module docstring for the equations.

    Shapes: x (b, t, input_size) -> output (b, t, D * H), (h_n, c_n) each (L * D, b, H).
    Same arguments, parameter names, gate order [i, f, g, o] and layout as torch.nn.LSTM, except
    ``batch_first=True`` by default. ``proj_size`` is not supported.
    """

    mode = "LSTM"
    n_gates = 4

    def _update(self, gx, state, w_hh_t, b_hh):
        return _lstm_update(gx, state[0], state[1], w_hh_t)


class GRU(_RNNBase):
    r"""GRU (Cho et al. 2014), stacked, optionally bidirectional, in torch.nn's formulation (b_hn sits inside
    the reset product). See the module docstring for the equations.

    Shapes: x (b, t, input_size) -> output (b, t, D * H), h_n (L * D, b, H). Gate order [r, z, n].
    """

    mode = "GRU"
    n_gates = 3

    def _update(self, gx, state, w_hh_t, b_hh):
        return (_gru_update(gx, state[0], w_hh_t, b_hh),)


# ---- registration as token mixers (seqlab.layers.mixer) -------------------------------------------------


@dataclass
class RNNMixerConfig:
    nonlinearity: Literal["tanh", "relu"] = "tanh"


@dataclass
class LSTMMixerConfig:
    forget_bias: float | None = 1.0
    """Initial forget-gate bias (Gers et al. 2000; Jozefowicz et al. 2015): torch.nn's init starts with
    f ≈ σ(0) = 1/2, so memory decays as 2^-t until training opens the gate; σ(1) ≈ 0.73 lets long-range
    gradients through from the first step. None keeps torch.nn's init (the layer itself always does)."""


@dataclass
class GRUMixerConfig:
    pass


def _build_lstm(d_model: int, c: LSTMMixerConfig, *, dropout: float, device=None, dtype=None) -> LSTM:
    lstm = LSTM(d_model, d_model, device=device, dtype=dtype)
    if c.forget_bias is not None:
        with torch.no_grad():
            lstm.bias_ih_l0[d_model : 2 * d_model].fill_(c.forget_bias)  # gates stacked [i, f, g, o]
            lstm.bias_hh_l0[d_model : 2 * d_model].zero_()
    return lstm


register_mixer(
    MixerSpec(
        name="rnn",
        config=RNNMixerConfig,
        build=lambda d, c, *, dropout, device=None, dtype=None: RNN(
            d, d, nonlinearity=c.nonlinearity, device=device, dtype=dtype
        ),
        family="RNN",
        summary="Elman RNN, h_t = tanh(W x_t + U h_{t-1} + b) (Elman 1990)",
        step_cost=1.3,
    )
)
register_mixer(
    MixerSpec(
        name="lstm",
        config=LSTMMixerConfig,
        build=_build_lstm,
        family="RNN",
        summary="LSTM with its additive cell state (Hochreiter & Schmidhuber 1997)",
        step_cost=1.0,
    )
)
register_mixer(
    MixerSpec(
        name="gru",
        config=GRUMixerConfig,
        build=lambda d, c, *, dropout, device=None, dtype=None: GRU(d, d, device=device, dtype=dtype),
        family="RNN",
        summary="GRU, reset and update gates (Cho et al. 2014)",
        step_cost=1.9,
    )
)
