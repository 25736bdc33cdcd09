"""GELU with the tanh approximation (GPT-2's ``gelu_new``) through a vectorized C++ kernel (``activations.cpp``).

:func:`gelu_tanh` is ``F.gelu(x, approximate="tanh")`` with the same values (float32: within a few ulps; the
sigmoid form x σ(2z) of ½ x (1 + tanh z) rounds differently) and an autograd backward of its own. It takes the
kernel for contiguous float32/float64/bfloat16 CPU tensors when the kernel builds (bfloat16, what
``torch.autocast`` gives on the CPU, is computed in float32 and rounded once), and ``F.gelu`` otherwise (other
devices, dtypes, layouts, or no compiler: then once, a warning). A backward with ``create_graph=True`` (double
backward) differentiates ``F.gelu`` itself, so second derivatives are exact too.

Measured in ``benchmarks/bench_gpt.py`` (the GPT training rows): torch's CPU kernel for this approximation
runs about 5x slower than its erf GELU, which made GELU about a sixth of a GPT-2 training step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason

__all__ = ["EXTENSION", "gelu_tanh", "gelu_tanh_bias", "gelu_tanh_bias_ready"]

EXTENSION = CppExtension(
    "activations",
    "GELU (tanh) kernel",
    "GELU with the tanh approximation uses torch's kernel instead",
    headers=("vec_math.h",),
    openmp=True,
)


class _GeluTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return EXTENSION.load().forward(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward that autograd can differentiate again
            with torch.enable_grad():
                y = F.gelu(x, approximate="tanh")
                return torch.autograd.grad(y, x, grad, create_graph=True)[0]
        return EXTENSION.load().backward(grad.to(x.dtype).contiguous(), x)


def gelu_tanh(x: Tensor) -> Tensor:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³))), elementwise, any shape."""
    if cpu_float_reason(x, bf16=True) is None and x.is_contiguous() and EXTENSION.unbuilt_reason() is None:
        return _GeluTanh.apply(x)
    return F.gelu(x, approximate="tanh")


class _GeluTanhBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(p, b)
        return EXTENSION.load().bias_forward(p, b)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        p, b = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True, as in _GeluTanh
            with torch.enable_grad():
                y = F.gelu(p + b, approximate="tanh")
                return torch.autograd.grad(y, (p, b), grad, create_graph=True)
        du, db = EXTENSION.load().bias_backward(grad.contiguous(), p, b)
        return du, db


def gelu_tanh_bias_ready(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether ``gelu_tanh_bias`` runs its fused kernel on the product of x with a linear layer's weight: float32
    or float64 CPU tensors of one dtype, outside CPU autocast (whose bf16 products take ``gelu_tanh``)."""
    return (
        bias is not None
        and x.dtype == weight.dtype == bias.dtype
        and cpu_float_reason(x) is None
        and not torch.is_autocast_enabled("cpu")
        and EXTENSION.unbuilt_reason() is None
    )


def gelu_tanh_bias(p: Tensor, b: Tensor) -> Tensor:
    """gelu_tanh(p + b) for a linear layer's product p (..., n) before its bias b (n,), in one pass; the backward
    gives b's gradient (the column sums) in the pass that gives p's. Where ``gelu_tanh_bias_ready`` is false,
    ``gelu_tanh(p + b)``."""
    if cpu_float_reason(p) is None and p.dtype == b.dtype and EXTENSION.unbuilt_reason() is None:
        if p.dim() == 2:
            return _GeluTanhBias.apply(p.contiguous(), b.contiguous())
        return _GeluTanhBias.apply(p.reshape(-1, p.size(-1)).contiguous(), b.contiguous()).view(p.shape)
    return gelu_tanh(p + b)
