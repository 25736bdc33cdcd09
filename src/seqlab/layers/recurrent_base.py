r"""The machinery shared by seqlab's RNN, LSTM and GRU (``seqlab.layers.recurrent``, where the equations are).

Notation: ``b`` batch, ``t`` time, ``H`` hidden size, ``L`` layers, ``D`` directions (1 or 2), ``G`` gates.

Parameters are torch.nn's (``weight_ih_l{k}[_reverse]`` ...), the state is torch.nn's ``(L * D, b, H)``.
Two paths (``seqlab.layers.fastpath``): ``_forward_fast`` runs seqlab's fused CPU kernel for the GRU, the RNN and
the LSTM, padded batches included (``seqlab.kernels.recurrent``; ``why_not_kernel`` says when it cannot) and
otherwise the fused kernel that torch.nn calls (through ``pack_padded_sequence`` when some sequence is padded);
``_forward_ref`` loops over time, holding the state at padded positions, as the kernel does.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from seqlab.kernels.recurrent import EXTENSION, MODES, recurrent_layer
from seqlab.layers import fastpath
from seqlab.layers.checks import check_batch_size, check_dtype, check_input, check_proj_size, check_state
from seqlab.layers.cudnn_weights import flatten_cudnn_weights
from seqlab.layers.fastpath import FastPathMixin
from seqlab.layers.masks import check_lengths, mask_lengths, padding_mask
from seqlab.validation import check_positive_ints

State = Tensor | tuple[Tensor, Tensor]

__all__ = ["RNNBase", "State"]


class RNNBase(FastPathMixin, nn.Module):
    """What RNN, LSTM and GRU share: torch.nn's parameters and state layout, input checks, the two paths.

    A subclass sets ``mode`` (the fused kernel's name in ``torch._VF``), ``n_gates`` and ``_update`` (one step
    of its recurrence, from ``seqlab.layers.recurrent_cells``); see ``seqlab.layers.recurrent``.
    """

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
        proj_size: int = 0,
        *,
        fast_path: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        name = type(self).__name__
        check_positive_ints(self, ("input_size", "hidden_size", "num_layers"), prefix=f"{name}: ")
        self.proj_size = check_proj_size(name, self.mode, proj_size, hidden_size)
        h_out = proj_size or hidden_size  # what a step outputs and carries as h
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{name}: dropout must be a probability in [0, 1], got {dropout!r}")
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.fast_path = fast_path
        kw = {"device": device, "dtype": dtype}
        g = self.n_gates * hidden_size
        self._flat_names: list[str] = []
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else h_out * self.num_directions
            for suffix in ("", "_reverse")[: self.num_directions]:
                names = [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}"]
                setattr(self, names[0], nn.Parameter(torch.empty(g, layer_in, **kw)))
                setattr(self, names[1], nn.Parameter(torch.empty(g, h_out, **kw)))
                if bias:
                    names += [f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
                    setattr(self, names[2], nn.Parameter(torch.empty(g, **kw)))
                    setattr(self, names[3], nn.Parameter(torch.empty(g, **kw)))
                if proj_size:  # torch.nn's order: the projection after the biases
                    names.append(f"weight_hr_l{layer}{suffix}")
                    setattr(self, names[-1], nn.Parameter(torch.empty(proj_size, hidden_size, **kw)))
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

    def flatten_parameters(self) -> None:
        """On CUDA with cuDNN, the weights as views of one buffer, as torch.nn's RNNs do (same name, same effect):
        otherwise cuDNN copies them into one at every call and warns. Elsewhere a no-op; ``.to()`` calls it."""
        flatten_cudnn_weights(self)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.flatten_parameters()
        return out

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

    def _projection(self, layer: int, reverse: bool) -> Tensor | None:
        """The LSTM's W_hr of this layer and direction (proj_size, H), or None without a projection."""
        return getattr(self, f"weight_hr_l{layer}{'_reverse' if reverse else ''}") if self.proj_size else None

    # ---- state -------------------------------------------------------------------------------------------

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> State:
        """Zeros in torch.nn's layout: ``h`` (or ``(h, c)`` for LSTM) of shape (L * D, b, H); with an LSTM's
        ``proj_size`` P, h is (L * D, b, P). ``device`` and ``dtype`` default to the parameters'."""
        check_batch_size(type(self).__name__, batch_size)
        p = self.weight_ih_l0
        shape = (self.num_layers * self.num_directions, batch_size, self.hidden_size)
        c = torch.zeros(shape, device=device or p.device, dtype=dtype or p.dtype)
        h = c.new_zeros(*shape[:2], self.proj_size) if self.proj_size else c.clone()
        return (h, c) if self.mode == "LSTM" else h

    def _check_state(self, state: State, x: Tensor, b: int, unbatched: bool) -> None:
        """torch.nn's layout (num_layers * num_directions, b, hidden_size); unbatched without the b."""
        lead = (self.num_layers * self.num_directions,) + (() if unbatched else (b,))
        parts = {"h": (*lead, self.proj_size or self.hidden_size), "c": (*lead, self.hidden_size)}
        parts = parts if self.mode == "LSTM" else {"h": parts["h"]}
        layout = "num_layers * num_directions, " + ("" if unbatched else "b, ") + "hidden_size"
        layout += " (h: proj_size)" if self.proj_size else ""
        check_state(type(self).__name__, state, parts, x, x.dtype, layout=f"({layout})")

    # ---- input checks ------------------------------------------------------------------------------------

    def _prepare(
        self, x: Tensor, state: State | None, mask: Tensor | None, lengths: Tensor | None
    ) -> tuple[Tensor, State, Tensor | None, bool]:
        """Validate the inputs of a forward; return x, state (zeros if None) and lengths, batched."""
        layout = "(b, t, input_size)" if self.batch_first else "(t, b, input_size)"
        if not isinstance(x, Tensor) or x.dim() not in (2, 3) or x.size(-1) != self.input_size:
            raise ValueError(
                f"{type(self).__name__} expects x of shape {layout} (or unbatched (t, input_size)) with "
                f"input_size={self.input_size}, got {tuple(x.shape) if isinstance(x, Tensor) else type(x)}"
            )
        check_dtype(type(self).__name__, x, self.weight_ih_l0)
        unbatched = x.dim() == 2  # torch.nn also accepts a single unbatched sequence (t, input_size)
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        b, t = (x.size(0), x.size(1)) if self.batch_first else (x.size(1), x.size(0))
        if t == 0:
            raise ValueError(
                f"{type(self).__name__} needs at least one time step, got x of shape {tuple(x.shape)}"
            )
        if mask is not None and lengths is not None:
            raise ValueError("give the padding as mask or as lengths, not both")
        if mask is not None:
            lengths = mask_lengths(mask, b, t, unbatched)
        elif lengths is not None:
            lengths = check_lengths(lengths, b, t)
        if state is None:
            return x, self.init_state(b, device=x.device, dtype=x.dtype), lengths, unbatched
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
        if (reason := super().why_not_fast_path(x)) is not None:
            return reason
        if x is not None and torch.overrides.has_torch_function((x,)):  # the fused kernel would bypass them
            return "the input is a tensor subclass or carries __torch_function__ overrides"
        return None

    def forward(
        self,
        x: Tensor,
        state: State | None = None,
        mask: Tensor | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, State]:
        """x (b, t, input_size) -> output (b, t, D * H), state (L * D, b, H) [or (h, c) for LSTM].

        ``mask`` (b, t) boolean, True at real positions, padding on the right; or ``lengths`` (b,), any order
        and device: positions at or beyond a sequence's length are padding. A single unbatched sequence
        (t, input_size) with state (L * D, H) works too, as in torch.nn (its mask, if any, is (t,)).
        """
        x, state, lengths, unbatched = self._prepare(x, state, mask, lengths)
        if self._take_fast_path(x):
            return self._finish(*self._forward_fast(x, state, lengths), unbatched)
        return self._finish(*self._forward_ref(x, state, lengths), unbatched)

    def forward_ref(
        self,
        x: Tensor,
        state: State | None = None,
        mask: Tensor | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, State]:
        """The reference path, whatever ``fast_path`` says: the equations as a loop over time."""
        x, state, lengths, unbatched = self._prepare(x, state, mask, lengths)
        return self._finish(*self._forward_ref(x, state, lengths), unbatched)

    def why_not_kernel(self, x: Tensor, lengths: Tensor | None = None) -> str | None:
        """Why the fast path would call torch.nn's fused kernel rather than seqlab's (on CPU), or None when it
        calls seqlab's."""
        if self.mode not in MODES:
            return f"seqlab's recurrent kernel covers {', '.join(MODES)}, not {self.mode}"
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
            return f"seqlab's recurrent kernel takes float32 or float64 on CPU, got {x.dtype} on {x.device}"
        # CPU autocast lists torch's LSTM among its lower-precision ops (not its GRU or RNN)
        if self.mode == "LSTM" and torch.is_autocast_enabled("cpu"):
            dtype = torch.get_autocast_dtype("cpu")
            return f"under CPU autocast the LSTM takes torch.nn's kernel, which autocast runs in {dtype}"
        # switched off (SEQLAB_DISABLE_KERNELS), or a failed build (warned once)
        if (reason := EXTENSION.unbuilt_reason()) is not None:
            return f"seqlab's recurrent kernel: {reason}"
        return None

    def _forward_fast(self, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
        reason = self.why_not_kernel(x, lengths)
        if reason is None:
            return self._forward_kernel(x, state, lengths)
        key = (type(self).__qualname__, reason)
        if self.mode in MODES and key not in fastpath._logged:  # said once, like FastPathMixin's reasons
            fastpath._logged.add(key)
            logging.getLogger(type(self).__module__).info(
                "%s uses torch.nn's kernel: %s", type(self).__name__, reason
            )
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

    def _forward_kernel(self, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
        """seqlab's CPU kernel, one layer and one direction at a time; dropout between layers as torch.nn. With
        ``lengths`` the kernel holds each row's state through its padding and zeroes the output there."""
        x = x.transpose(0, 1) if self.batch_first else x  # (t, b, in): the kernel is time-major
        lstm = self.mode == "LSTM"
        order = None
        if lengths is not None:  # padded inputs never enter the arithmetic (NaN there would reach dW_ih)
            lengths = lengths.to("cpu", torch.int64)
            real = padding_mask(lengths, x.size(0)).t()[..., None]  # (t, b, 1), False at padding
            x = x.masked_fill(~real, 0.0)
            # the kernel takes the longest first: sorted once here, for every layer and direction
            order = torch.argsort(lengths, descending=True, stable=True)
            x, lengths = x.index_select(1, order), lengths[order]
            state = tuple(s.index_select(1, order) for s in state) if lstm else state.index_select(1, order)
        finals = []
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.num_directions):
                params = self._layer_params(layer, reverse=d == 1)
                k = layer * self.num_directions + d
                s0 = (state[0][k], state[1][k]) if lstm else state[k]  # (b, H), or the LSTM's (h, c)
                w_hr = self._projection(layer, reverse=d == 1)  # the LSTM's projection, or None
                y, s_n = recurrent_layer(x, s0, *params, self.mode, d == 1, lengths, w_hr)  # (t, b, H or P)
                outs.append(y)
                finals.append(s_n if lstm else (s_n,))
            x = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)  # (t, b, D * H)
            if layer < self.num_layers - 1 and self.dropout > 0:
                x = F.dropout(x, self.dropout, self.training)
        new = tuple(torch.stack(part) for part in zip(*finals, strict=True))  # each (L * D, b, H)
        if order is not None:  # back to the caller's row order
            back = torch.argsort(order)
            x, new = x.index_select(1, back), tuple(s.index_select(1, back) for s in new)
        return (x.transpose(0, 1) if self.batch_first else x), (new if lstm else new[0])

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
        """One layer, one direction. x (t, b, in) -> y (t, b, H, or proj_size) and the final state."""
        w_ih, w_hh, b_ih, b_hh = self._layer_params(layer, reverse)
        w_hr = self._projection(layer, reverse)
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
            if w_hr is not None:  # the LSTM's projection: h = W_hr (o ⊙ tanh(c)) (Sak et al. 2014)
                new = (torch.mm(new[0], w_hr.t()), new[1])
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
        check_input(
            f"{type(self).__name__}.step", x_t, self.input_size, self.weight_ih_l0, step=True, what="x_t"
        )
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
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if not self.fast_path:
            s += ", fast_path=False"
        return s
