"""LayerNorm over the last dimension through a C++ kernel (``layer_norm.cpp``), forward and backward.

:func:`layer_norm` is ``F.layer_norm(x, (n,), weight, bias, eps)`` with the same values (float32: within a few
ulps; the row sums are added in a different order) and an autograd backward of its own. It takes the kernel for
contiguous float32/float64 CPU tensors with a weight when the kernel builds, and ``F.layer_norm`` otherwise
(other devices, dtypes, layouts, no weight, or no compiler: then once, a warning). A backward with
``create_graph=True`` (double backward) differentiates ``F.layer_norm`` itself.

Why: torch's CPU LayerNorm backward costs about 150 ns per row of 60 floats; at the lab's width a Mamba LM spent
4% of its training step in it (benchmarks/bench_scan_kernel.py). Rows of ``WIDE_ROWS`` (128) values or more go
to torch, which is as fast there inside a whole training step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason

__all__ = ["EXTENSION", "WIDE_ROWS", "layer_norm", "why_not_kernel"]

# From this width on torch's kernel is as fast or faster inside whole training steps (in-process A/B of the
# ViT and GPT benchmarks' steps with either LayerNorm: equal at width 128, batch 128; 3-5% of the step faster at
# width 128, batch 16, and at width 256), although this kernel's backward alone is 1.4-2x torch's there: the
# Python autograd function around it costs tens of microseconds a call, which narrow rows repay.
WIDE_ROWS = 128

EXTENSION = CppExtension(
    "layer_norm",
    "LayerNorm kernel",
    "LayerNorm uses torch's kernel instead",
    headers=("vec_math.h",),
    openmp=True,
    label="LayerNorm",
)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
        y, mean, rstd = EXTENSION.load().forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward that autograd can differentiate again
            with torch.enable_grad():
                inputs = [t for t in (x, weight, bias) if t is not None]
                y = F.layer_norm(x, (x.size(-1),), weight, bias, ctx.eps)
                grads = iter(torch.autograd.grad(y, inputs, grad, create_graph=True))
                return next(grads), next(grads), (next(grads) if bias is not None else None), None
        dx, dw, db = EXTENSION.load(even_if_disabled=True).backward(grad.contiguous(), x, weight, mean, rstd)
        return dx, dw, (db if bias is not None else None), None


def why_not_kernel(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> str | None:
    """None when :func:`layer_norm` would run the kernel for these tensors, else why not."""
    if (reason := cpu_float_reason(x)) is not None:
        return reason
    if weight is None:
        return "the kernel needs a weight (elementwise_affine=True)"
    if any(t is not None and (t.dtype != x.dtype or t.device != x.device) for t in (weight, bias)):
        return "weight and bias must share x's dtype and device"
    if not x.is_contiguous() or x.dim() == 0 or x.numel() == 0:
        return "x is not a contiguous, non-empty tensor"
    if x.size(-1) >= WIDE_ROWS:
        return f"rows of {WIDE_ROWS} or more values run as fast or faster through torch's LayerNorm"
    if torch.compiler.is_compiling():
        return "torch.compile is tracing"
    return EXTENSION.unbuilt_reason()


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """(x − mean) / sqrt(var + eps) ⊙ weight + bias over the last dimension of x; any leading shape. x is
    floating with at least one dimension, eps a finite number > 0 (else a ValueError)."""
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() == 0:
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"layer_norm: x must be a floating tensor (..., n) of at least one dimension, got {got}"
        )
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"layer_norm: eps must be a positive finite number, got {eps!r}")
    if why_not_kernel(x, weight, bias) is not None:
        return F.layer_norm(x, (x.size(-1),), weight, bias, eps)
    return _LayerNorm.apply(x, weight.contiguous(), None if bias is None else bias.contiguous(), float(eps))
