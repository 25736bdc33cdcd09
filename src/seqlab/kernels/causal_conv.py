"""Mamba's causal depthwise convolution and the SiLU after it in one C++ pass each way (``causal_conv.cpp``).

``causal_conv_silu(x, state, weight, bias)`` is ``silu(conv1d(cat(state, x)))`` with one kernel of width k per
channel, computed on the (b, t, c) layout the block's projections produce: no transposes to (b, c, t), no padded
copy, no separate SiLU. ``state`` holds the k − 1 inputs before the sequence, (b, k − 1, c), oldest first;
``weight`` is (k, c), tap j reading k − 1 − j steps back; the backward returns gradients for all four. A backward
with ``create_graph=True`` differentiates :func:`causal_conv_silu_ref` (torch ops) instead, so second
derivatives are exact too. :class:`seqlab.layers.mamba.Mamba` calls it on its fast path when the kernel builds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason, with_spaced_rows

__all__ = ["EXTENSION", "causal_conv_silu", "causal_conv_silu_ref", "why_not_kernel"]

EXTENSION = CppExtension(
    "causal_conv",
    "causal convolution kernel",
    "Mamba's convolution uses torch's conv1d instead",
    headers=("vec_math.h",),
    openmp=True,
    label="causal conv (Mamba)",
)


def causal_conv_silu_ref(x: Tensor, state: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The same function through torch's conv1d: x (b, t, c), state (b, k-1, c), weight (k, c) -> (b, t, c)."""
    full = torch.cat([state, x], dim=1).transpose(1, 2)  # (b, c, k - 1 + t)
    kernel = weight.t().unsqueeze(1)  # (c, 1, k): conv1d's depthwise layout
    return F.silu(F.conv1d(full, kernel, bias, groups=x.size(-1))).transpose(1, 2)


class _CausalConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state, weight, bias):
        ctx.save_for_backward(x, state, weight, bias)
        return EXTENSION.load().forward(x, state, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, state, weight, bias = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the torch-op reference
            with torch.enable_grad():
                inputs = [t for t in (x, state, weight, bias) if t is not None]
                y = causal_conv_silu_ref(x, state, weight, bias)
                grads = iter(torch.autograd.grad(y, inputs, grad, create_graph=True, allow_unused=True))
                return tuple(None if t is None else next(grads) for t in (x, state, weight, bias))
        dx, ds, dw, db = EXTENSION.load(even_if_disabled=True).backward(
            grad.contiguous(), x, state, weight, bias
        )
        return dx, ds, dw, (db if bias is not None else None)


def why_not_kernel(x: Tensor) -> str | None:
    """None when :func:`causal_conv_silu` would run the kernel for x, else why not."""
    return cpu_float_reason(x) or EXTENSION.unbuilt_reason()


def causal_conv_silu(x: Tensor, state: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """silu(causal depthwise conv) of x (b, t, c) after state (b, k-1, c), weight (k, c), bias (c,) -> (b, t, c)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"causal_conv_silu: x must be a floating tensor (the kernel takes float32 or float64, other floating "
            f"dtypes run torch's conv1d), got {got}"
        )
    if x.dim() == 3 and x.size(1) == 0:
        raise ValueError(
            f"causal_conv_silu needs x (b, t, c) with t >= 1 positions, got shape {tuple(x.shape)}"
        )
    if bias is not None and (bias.dtype != x.dtype or bias.device != x.device):
        raise ValueError(
            f"causal_conv_silu: the bias must have x's dtype and device ({x.dtype}, {x.device}), got "
            f"{bias.dtype} on {bias.device}"
        )
    if why_not_kernel(x) is not None:
        return causal_conv_silu_ref(x, state, weight, bias)
    if x.dim() == 3:  # the kernel reads rows with a stride (a view of in_proj's output), not any layout
        x = with_spaced_rows(x)
    bias = None if bias is None else bias.contiguous()  # a view of every other element, an expanded one
    return _CausalConvSilu.apply(x, state.contiguous(), weight.contiguous(), bias)
