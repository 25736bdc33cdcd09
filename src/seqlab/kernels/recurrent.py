r"""Fused CPU kernels for one layer, one direction of a tanh/ReLU RNN, a GRU or an LSTM (the C++ is
``recurrent.cpp``).

Notation: ``t`` time, ``b`` batch, ``H`` hidden size, ``G`` = gates × H (H for the RNN, 3H for the GRU, 4H for
the LSTM). Everything here is time-major: x (t, b, in), out (t, b, H); the equations, parameter layout and gate
orders [r, z, n] and [i, f, g, o] are torch.nn's (see ``seqlab.layers.recurrent``). The LSTM carries (h, c);
with a projection ``w_hr`` (P, H) (torch.nn's ``proj_size``) its h is W_hr (o ⊙ tanh(c)), P wide.

    forward   gx = x W_ih^T + b_ih                          one matmul over all t*b rows
              per step: W_hh h_{s-1} (+ b_hh) as one matmul, then one fused loop over the gates -> h_s
    backward  per step, in reverse: one fused loop for the gate gradients, one matmul for dL/dh_{s-1};
              then dW_ih, dW_hh, the biases and dx as one matmul (or sum) each over all steps
              (dW_hh: over every step but the one that read h0, plus that step's small product)

The C++ is compiled on first use with ``torch.utils.cpp_extension.load`` (g++ and ninja; 30 to 50 s on 2
cores) and cached across processes in ``$TORCH_EXTENSIONS_DIR/seqlab``, else ``$XDG_CACHE_HOME/seqlab/kernels``
(``~/.cache/seqlab/kernels``), in a folder named after the instruction set and a hash of the source and flags,
so an edited source builds afresh. ``build_info()`` says how long the build (or the cached load) took. When
the kernel cannot be built, ``load_recurrent_kernel()`` warns once and returns None, and the layers keep
torch.nn's fused kernels (oneDNN's for the LSTM).

Float32 uses a vectorizable polynomial exp for σ and tanh (absolute error below 1e-7); float64 uses the C
library's exp and tanh, so it matches torch.nn to rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from seqlab.kernels.extension import CppExtension

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "GATES",
    "MODES",
    "build_info",
    "check_layer_args",
    "load_recurrent_kernel",
    "recurrent_layer",
    "recurrent_layer_ref",
]

MODES = {"RNN_TANH": 0, "RNN_RELU": 1, "GRU": 2, "LSTM": 3}  # the layer's mode -> the kernel's
GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}  # G / H
EXTENSION = CppExtension(
    "recurrent",
    "fused recurrent kernel",
    "GRU, RNN and LSTM use torch.nn's fused kernels instead",
    headers=("vec_math.h",),
    openmp=True,  # the larger steps' brgemm calls, one per thread
    label="GRU / RNN / LSTM",
)


def load_recurrent_kernel() -> ModuleType | None:
    """The compiled kernel, built on the first call of the process; None (after one warning) if it cannot be."""
    return EXTENSION.load()


def build_info() -> dict | None:
    """After ``load_recurrent_kernel()``: ``{"seconds", "cached", "directory"}``, or ``{"error"}``; None before."""
    return EXTENSION.build_info()


class _RecurrentLayer(torch.autograd.Function):
    """One layer, one direction, through the compiled kernel; the backward is the kernel's own."""

    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode: int, reverse: bool, lengths):
        """-> out (t, b, R), h_n (b, R), and for the LSTM (c0 given) c_n (b, H); R = H, or the projected LSTM's
        P (``w_hr`` (P, H)). With ``lengths`` the kernel's out holds each row's state through its padding (what
        the steps read); the output is zero there."""
        kernel = load_recurrent_kernel()
        x_in, h0_in = x, h0  # as given: a double backward differentiates the reference through them
        h0 = h0.contiguous()
        # (t, b, R), the saved gates, x as the kernel read it, the projected LSTM's m_s (t, b, H)
        out, ws, x, ms = kernel.forward(x, h0, w_ih, w_hh, b_ih, b_hh, mode, reverse, c0, lengths, w_hr)
        ctx.save_for_backward(x, h0, c0, w_ih, w_hh, out, ws, x_in, h0_in, b_ih, b_hh, lengths, w_hr, ms)
        ctx.mode, ctx.reverse, ctx.has_bias = mode, reverse, b_ih is not None
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: the kernel skips it
        # the last step of the recurrence (a row's state is held through any padding after its last real one)
        last = 0 if reverse else -1
        h_n = out[last].clone()  # (b, H)
        if lengths is not None:
            out = out.masked_fill(_padding(lengths, out.size(0))[..., None], 0.0)  # (t, b, H), a new tensor
        if c0 is None:
            return out, h_n
        return out, h_n, ws[last, :, 4 * c0.size(1) :].clone()  # c_n: the saved c of the last step

    @staticmethod
    def backward(ctx, grad_out, grad_hn, grad_cn=None):
        x, h0, c0, w_ih, w_hh, out, ws, x_in, h0_in, b_ih, b_hh, lengths, w_hr, ms = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that autograd can differentiate again
            inputs = (x_in, h0_in, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
            return _backward_through_ref(ctx, inputs, (grad_out, grad_hn, grad_cn), lengths)
        saved = (x, h0, c0, w_ih, w_hh, out, ws, x_in, lengths, w_hr, ms)
        return _backward_kernel(ctx, (grad_out, grad_hn, grad_cn), *saved)


def _padding(lengths: Tensor, t: int) -> Tensor:
    """(t, b) boolean, True at the padded positions s >= lengths[j] (time-major, as the kernel's tensors)."""
    return torch.arange(t, device=lengths.device)[:, None] >= lengths[None, :]


def _backward_kernel(ctx, grads, x, h0, c0, w_ih, w_hh, out, ws, x_in, lengths, w_hr, ms):
    """The kernel's own first-order backward (grad mode is off): the adjoint recurrence, fused. dL/dx comes in
    x_in's layout where the kernel can write it so (no copy when autograd adds it to a batch-first input's)."""
    need_dx = ctx.needs_input_grad[0]
    grad_out, grad_hn, grad_cn = grads
    dx, dh0, dw_ih, dw_hh, db_ih, db_hh, dc0, dw_hr = EXTENSION.load(even_if_disabled=True).backward(
        grad_out,
        grad_hn,
        grad_cn,
        x,
        h0,
        w_ih,
        w_hh,
        out,
        ws,
        ctx.mode,
        ctx.reverse,
        ctx.has_bias,
        x_in if need_dx else None,
        c0,
        lengths,  # padded steps pass dL/dh unchanged and ignore dL/dout there (the output is zero)
        w_hr,
        ms,
    )
    biases = (db_ih, db_hh) if ctx.has_bias else (None, None)
    return (
        (dx if need_dx else None),
        dh0,
        (dc0 if c0 is not None else None),
        dw_ih,
        dw_hh,
        *biases,
        (dw_hr if w_hr is not None else None),
        None,
        None,
        None,
    )


def _backward_through_ref(ctx, inputs, grads, lengths):
    """A differentiable backward (double backward, gradient penalties): recompute the layer with
    :func:`recurrent_layer_ref` on the same inputs and let autograd build the gradients' own graph."""
    names = {v: k for k, v in MODES.items()}
    x, h0, c0, *params, w_hr = inputs
    wanted = [t for t, need in zip(inputs, ctx.needs_input_grad, strict=False) if need]
    with torch.enable_grad():
        out, state = recurrent_layer_ref(
            x, h0 if c0 is None else (h0, c0), *params, names[ctx.mode], ctx.reverse, lengths, w_hr
        )
        outputs = (out, *(state if c0 is not None else (state,)))
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=False) if g is not None]
        grads = iter(
            torch.autograd.grad(
                [o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=True, allow_unused=True
            )
        )
    return (*(next(grads) if need else None for need in ctx.needs_input_grad[:8]), None, None, None)


def _shape(v) -> str:
    return str(tuple(v.shape)) if isinstance(v, Tensor) else type(v).__name__


def check_layer_args(x, h0, w_ih, w_hh, b_ih, b_hh, mode, w_hr=None) -> None:
    """A ValueError naming the expected and the given unless the arguments are what :func:`recurrent_layer`'s
    kernel reads: ``mode`` one of :data:`MODES`; x (t, b, in) with t >= 1, float32 or float64 on the CPU; h0
    (b, H), for the LSTM a pair (h0, c0) of that shape; w_ih (G, in), w_hh (G, H) with G = :data:`GATES` x H;
    both biases (G,) or both None; the LSTM's projection ``w_hr`` (P, H) or None, with h0 (b, P) and w_hh
    (G, P) then; all of x's dtype and device. Shapes and dtypes only: no value is read."""
    if mode not in MODES:
        raise ValueError(f"recurrent_layer: mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if w_hr is not None and mode != "LSTM":
        raise ValueError(f"recurrent_layer: only the LSTM takes a projection w_hr, got one for {mode}")
    if not isinstance(x, Tensor) or x.dim() != 3 or x.size(0) == 0:
        raise ValueError(f"recurrent_layer needs x (t, b, in) with t >= 1 steps, got shape {_shape(x)}")
    if x.dtype not in (torch.float32, torch.float64) or x.device.type != "cpu":
        raise ValueError(
            f"recurrent_layer: x must be float32 or float64 on the CPU, got {x.dtype} on {x.device}"
        )
    if (b_ih is None) != (b_hh is None):
        given, missing = ("b_ih", "b_hh") if b_hh is None else ("b_hh", "b_ih")
        raise ValueError(
            f"recurrent_layer: give both biases b_ih and b_hh or neither, got {given} and {missing}=None"
        )
    b = x.size(1)
    states = {"h0": h0}
    if mode == "LSTM":
        if not isinstance(h0, tuple | list) or len(h0) != 2:
            raise ValueError(f"recurrent_layer: the LSTM's state must be a pair (h0, c0), got {_shape(h0)}")
        states = {"h0": h0[0], "c0": h0[1]}
    for name, v in states.items():
        if not isinstance(v, Tensor) or v.dim() != 2 or v.size(0) != b:
            raise ValueError(
                f"recurrent_layer: {name} must be (b, H) with x's batch b = {b}, got {_shape(v)}"
            )
    h0 = states["h0"]
    R = h0.size(1)  # the state a step carries: H, or the projection's P
    if w_hr is not None and (not isinstance(w_hr, Tensor) or w_hr.dim() != 2 or w_hr.size(0) != R):
        raise ValueError(f"recurrent_layer: w_hr must be (P, H) with P = h0's width {R}, got {_shape(w_hr)}")
    H = R if w_hr is None else w_hr.size(1)
    if "c0" in states and states["c0"].shape != (b, H):
        raise ValueError(f"recurrent_layer: c0 must be (b, H) = {(b, H)}, got {_shape(states['c0'])}")
    G = GATES[mode] * H
    expected = {"w_ih": (G, x.size(2)), "w_hh": (G, R), "b_ih": (G,), "b_hh": (G,)}
    for name, v in zip(expected, (w_ih, w_hh, b_ih, b_hh), strict=True):
        if v is None:
            continue
        if not isinstance(v, Tensor) or tuple(v.shape) != expected[name]:
            layout = "(G, in)" if name == "w_ih" else "(G, H)" if name == "w_hh" else "(G,)"
            layout = "(G, P)" if name == "w_hh" and w_hr is not None else layout
            width = f"H = {H}, P = {R}" if w_hr is not None else f"H = {H} (h0's width)"
            raise ValueError(
                f"recurrent_layer: {name} must be {layout} = {expected[name]} for {mode} with {width}, "
                f"got {_shape(v)}"
            )
    weights = (("w_ih", w_ih), ("w_hh", w_hh), ("b_ih", b_ih), ("b_hh", b_hh), ("w_hr", w_hr))
    for name, v in (*states.items(), *weights):
        if v is not None and (v.dtype != x.dtype or v.device != x.device):
            raise ValueError(
                f"recurrent_layer: {name} must have x's dtype and device ({x.dtype}, {x.device}), "
                f"got {v.dtype} on {v.device}"
            )


def recurrent_layer(
    x: Tensor,
    h0: Tensor | tuple[Tensor, Tensor],
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None,
    b_hh: Tensor | None,
    mode: str,
    reverse: bool = False,
    lengths: Tensor | None = None,
    w_hr: Tensor | None = None,
) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
    """x (t, b, in), h0 (b, H) -> out (t, b, H), h_n (b, H), differentiable in every tensor argument; for the
    LSTM the state is a pair, (h0, c0) -> out, (h_n, c_n), as torch.nn's LSTM carries it.

    ``w_hr`` (P, H), the LSTM's projection (torch.nn's ``proj_size``, Sak et al. 2014): each step's
    o ⊙ tanh(c) (H wide) is multiplied by it, so h0, out and h_n are P wide, c0 and c_n H wide and w_hh (G, P).

    ``lengths`` (b,) integers in [1, t] make a right-padded batch: at positions s >= lengths[j] row j's state is
    held and its output is zero, so h_n is the state after its last real position and a ``reverse`` recurrence
    starts at its own end (``pack_padded_sequence``'s numbers); each step computes its real rows only. The padded
    inputs still enter the whole-sequence products (the input projection, dW_ih): give them finite values (the
    layers zero them).

    ``mode`` is the layer's ('RNN_TANH', 'RNN_RELU', 'GRU' or 'LSTM'); the weights are torch.nn's, (G, in) and
    (G, H), the biases (G,) or both None. ``reverse`` runs the recurrence from the last step to the first (the
    backward direction of a bidirectional layer). The backward is the kernel's own; a backward with
    ``create_graph=True`` (double backward) recomputes the layer with :func:`recurrent_layer_ref` instead, so
    second derivatives are exact too, at the reference's speed.
    """
    check_layer_args(x, h0, w_ih, w_hh, b_ih, b_hh, mode, w_hr)
    lengths = _checked_lengths(lengths, x.size(0), x.size(1))
    if load_recurrent_kernel() is None:
        raise RuntimeError(f"seqlab's recurrent kernel is not available: {build_info()['error']}")
    if lengths is not None and bool((lengths[1:] > lengths[:-1]).any()):  # the kernel takes the longest first
        order = torch.argsort(lengths, descending=True, stable=True)
        back = torch.argsort(order)
        h0 = tuple(h.index_select(0, order) for h in h0) if mode == "LSTM" else h0.index_select(0, order)
        out, state = recurrent_layer(
            x.index_select(1, order), h0, w_ih, w_hh, b_ih, b_hh, mode, reverse, lengths[order], w_hr
        )
        state = (
            tuple(h.index_select(0, back) for h in state) if mode == "LSTM" else state.index_select(0, back)
        )
        return out.index_select(1, back), state
    if mode != "LSTM":
        return _RecurrentLayer.apply(x, h0, None, w_ih, w_hh, b_ih, b_hh, None, MODES[mode], reverse, lengths)
    out, h_n, c_n = _RecurrentLayer.apply(x, *h0, w_ih, w_hh, b_ih, b_hh, w_hr, MODES[mode], reverse, lengths)
    return out, (h_n, c_n)


def _checked_lengths(lengths, t: int, b: int) -> Tensor | None:
    """``lengths`` as the kernel reads them, int64 contiguous on the CPU, after a ValueError naming what came
    unless they are b integers in [1, t]; None stays None."""
    if lengths is None:
        return None
    integral = isinstance(lengths, Tensor) and not (lengths.is_floating_point() or lengths.is_complex())
    if not integral or lengths.dtype == torch.bool or lengths.shape != (b,):
        raise ValueError(
            f"recurrent_layer: lengths must be integers of shape (b,) = ({b},), got {_shape(lengths)}"
        )
    lengths = lengths.to("cpu", torch.int64).contiguous()
    if b and not (int(lengths.min()) >= 1 and int(lengths.max()) <= t):
        raise ValueError(f"recurrent_layer: every length must lie in [1, t = {t}], got {lengths.tolist()}")
    return lengths


def recurrent_layer_ref(
    x: Tensor,
    h0: Tensor | tuple[Tensor, Tensor],
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None,
    b_hh: Tensor | None,
    mode: str,
    reverse: bool = False,
    lengths: Tensor | None = None,
    w_hr: Tensor | None = None,
) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
    """``recurrent_layer`` in plain PyTorch (a loop over time, autograd for the backward), for tests."""
    gx = torch.nn.functional.linear(x, w_ih, b_ih)  # (t, b, in) x (in, G) -> (t, b, G)
    (h, c), outs = (h0 if mode == "LSTM" else (h0, None)), [None] * x.size(0)
    pad = None if lengths is None else _padding(lengths.to(x.device), x.size(0))[..., None]  # (t, b, 1)
    for s in range(x.size(0) - 1, -1, -1) if reverse else range(x.size(0)):
        h_prev, c_prev = h, c
        gh = torch.nn.functional.linear(h, w_hh, b_hh)  # (b, H) x (H, G) -> (b, G)
        if mode == "GRU":
            (x_r, x_z, x_n), (h_r, h_z, h_n) = gx[s].chunk(3, 1), gh.chunk(3, 1)
            r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
            h = torch.lerp(torch.tanh(x_n + r * h_n), h, z)  # (1 - z) ⊙ n + z ⊙ h
        elif mode == "LSTM":
            i, f, g, o = (gx[s] + gh).chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            h = h if w_hr is None else torch.nn.functional.linear(h, w_hr)  # the projection: (b, H) -> (b, P)
        else:
            h = torch.relu(gx[s] + gh) if mode == "RNN_RELU" else torch.tanh(gx[s] + gh)
        if pad is not None:  # padding: the state held, the output zero
            h = torch.where(pad[s], h_prev, h)
            c = c if c is None else torch.where(pad[s], c_prev, c)
        outs[s] = h if pad is None else h.masked_fill(pad[s], 0.0)
    return torch.stack(outs), ((h, c) if mode == "LSTM" else h)
