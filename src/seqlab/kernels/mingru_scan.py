r"""minGRU's recurrence on the CPU in one C++ pass over the sequence each way (``mingru_scan.cpp``).

From the layer's projection ku (b, t, 2e), rows [k | u] (gate and candidate pre-activations), and h_0 (b, e):

    h_t = σ(-k_t) ⊙ h_{t-1} + σ(k_t) ⊙ g(u_t),    g(u) = u + 1/2 for u >= 0, σ(u) below

:func:`mingru_scan` returns h (b, t, e) with the kernel's own backward (gradients for ku and h_0; only the output
h is saved). It is the CPU's fast path of :class:`seqlab.layers.MinGRU`: the recurrence is elementwise, so one
sequential pass vectorized over channels does the least work on a CPU, where the log-space scan (the layer's
parallel form) spends its time in logcumsumexp. :func:`mingru_scan_ref` is the same function as a loop of
torch ops; a backward with ``create_graph=True`` differentiates it, so second derivatives are exact too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason, with_spaced_rows

__all__ = ["EXTENSION", "mingru_scan", "mingru_scan_ref", "why_not_kernel"]

EXTENSION = CppExtension(
    "mingru_scan",
    "minGRU scan kernel",
    "minGRU runs its log-space scan in PyTorch instead",
    headers=("vec_math.h",),
    openmp=True,
    label="minGRU scan",
)


def _g(u: Tensor) -> Tensor:
    """g(u) = u + 0.5 for u >= 0, σ(u) for u < 0: continuous, positive, linear growth (not saturating)."""
    return torch.where(u >= 0, u + 0.5, torch.sigmoid(u))


def mingru_scan_ref(ku: Tensor, h0: Tensor) -> Tensor:
    """The recurrence as a loop over t in torch ops: ku (b, t, 2e), h0 (b, e) -> h (b, t, e)."""
    k, u = ku.chunk(2, dim=-1)  # 2 x (b, t, e)
    z, keep, h_tilde = torch.sigmoid(k), torch.sigmoid(-k), _g(u)
    h, hs = h0, []
    for z_t, keep_t, h_tilde_t in zip(z.unbind(1), keep.unbind(1), h_tilde.unbind(1), strict=True):
        h = keep_t * h + z_t * h_tilde_t  # (b, e)
        hs.append(h)
    return torch.stack(hs, 1)


class _MinGRUScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ku, h0):
        h = EXTENSION.load().forward(ku, h0)
        ctx.save_for_backward(ku, h0, h)
        return h

    @staticmethod
    def backward(ctx, grad):
        ku, h0, h = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the torch-op reference
            with torch.enable_grad():
                inputs = [t for t, need in zip((ku, h0), ctx.needs_input_grad, strict=True) if need]
                got = iter(torch.autograd.grad(mingru_scan_ref(ku, h0), inputs, grad, create_graph=True))
                return tuple(next(got) if need else None for need in ctx.needs_input_grad)
        dku, dh0 = EXTENSION.load(even_if_disabled=True).backward(grad.contiguous(), ku, h0, h)
        return dku, dh0


def why_not_kernel(x: Tensor) -> str | None:
    """None when :func:`mingru_scan` would run the kernel for x (the projection ku), else why not."""
    if (reason := cpu_float_reason(x)) is not None:
        return reason
    if torch.compiler.is_compiling():  # the layer's log-space scan is torch ops, which torch.compile traces
        return "torch.compile is tracing"
    return EXTENSION.unbuilt_reason()


def mingru_scan(ku: Tensor, h0: Tensor) -> Tensor:
    """h (b, t, e) from ku (b, t, 2e) and h0 (b, e), through the kernel (module docstring); a ValueError naming
    the expected and the given for other shapes or dtypes, and the reference where the kernel cannot run."""
    if not isinstance(ku, Tensor) or ku.dim() != 3 or ku.size(-1) % 2 or ku.size(1) == 0:
        got = tuple(ku.shape) if isinstance(ku, Tensor) else type(ku).__name__
        raise ValueError(f"mingru_scan expects ku of shape (b, t, 2e) with t >= 1, got {got}")
    b, _, two_e = ku.shape
    if not isinstance(h0, Tensor) or tuple(h0.shape) != (b, two_e // 2):
        got = tuple(h0.shape) if isinstance(h0, Tensor) else type(h0).__name__
        raise ValueError(f"mingru_scan expects h0 of shape (b, e) = {(b, two_e // 2)}, got {got}")
    if not ku.is_floating_point() or h0.dtype != ku.dtype or h0.device != ku.device:
        raise ValueError(
            f"mingru_scan expects floating ku and h0 of one dtype and device, got {ku.dtype} on {ku.device} "
            f"and {h0.dtype} on {h0.device}"
        )
    if why_not_kernel(ku) is not None:
        return mingru_scan_ref(ku, h0)
    return _MinGRUScan.apply(with_spaced_rows(ku), h0.contiguous())
