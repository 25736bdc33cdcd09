"""GELU through a vectorized C++ kernel (``activations.cpp``): exact (``F.gelu(x)``, x Φ(x): BERT, ViT) and with
the tanh approximation (``F.gelu(x, approximate="tanh")``: GPT-2's ``gelu_new``).

:func:`gelu` and :func:`gelu_tanh` give torch's values to a few float32 ulps (the exact form computes Φ(x) from
erfc and is more accurate than torch's 1 + erf(x/√2) in the negative tail; the tanh form's sigmoid x σ(2z)
rounds differently from ½ x (1 + tanh z)) with an autograd backward of their own. They take the kernel for
contiguous float32/float64/bfloat16 CPU tensors when it builds (bfloat16, what ``torch.autocast`` gives on the
CPU, is computed in float32 and rounded once), and ``F.gelu`` otherwise (other devices, dtypes, layouts, or no
compiler: then once, a warning). A backward with ``create_graph=True`` (double backward) differentiates
``F.gelu`` itself, so second derivatives are exact too.

The bias forms (:func:`gelu_bias`) take a linear layer's product before its bias and add the bias inside the
kernel; their backward gives the bias gradient in the same pass (``seqlab.layers.mlp.MLP`` uses them).

Measured in ``benchmarks/bench_gpt.py`` (the GPT training rows): torch's CPU kernel for the tanh approximation
runs about 5x slower than its erf GELU, which made GELU about a sixth of a GPT-2 training step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason

__all__ = ["EXTENSION", "gelu", "gelu_bias", "gelu_bias_ready", "gelu_tanh"]

EXTENSION = CppExtension(
    "activations",
    "GELU kernel",
    "GELU uses torch's kernel instead",
    headers=("vec_math.h",),
    openmp=True,
    label="GELU",
)

_TORCH = {True: "tanh", False: "none"}  # F.gelu's approximate= for each form
_FORMS = {v: k for k, v in _TORCH.items()}  # and back: approximate= -> the tanh form?


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tanh: bool) -> Tensor:
        ctx.save_for_backward(x)
        ctx.tanh = tanh
        ext = EXTENSION.load()
        return ext.forward(x) if tanh else ext.erf_forward(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward that autograd can differentiate again
            with torch.enable_grad():
                y = F.gelu(x, approximate=_TORCH[ctx.tanh])
                return torch.autograd.grad(y, x, grad, create_graph=True)[0], None
        ext, grad = EXTENSION.load(even_if_disabled=True), grad.to(x.dtype).contiguous()  # the forward ran it
        return (ext.backward(grad, x) if ctx.tanh else ext.erf_backward(grad, x)), None


def _kernel_takes(x: Tensor) -> bool:
    return cpu_float_reason(x, bf16=True) is None and x.is_contiguous() and EXTENSION.unbuilt_reason() is None


def _check_floating(owner: str, x) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{owner}: x must be a floating tensor, got {got}")


def gelu_tanh(x: Tensor) -> Tensor:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³))), elementwise, any shape; x floating (else a ValueError)."""
    _check_floating("gelu_tanh", x)
    return _Gelu.apply(x, True) if _kernel_takes(x) else F.gelu(x, approximate="tanh")


def gelu(x: Tensor) -> Tensor:
    """x Φ(x), Φ the standard normal CDF, elementwise, any shape; x floating (else a ValueError)."""
    _check_floating("gelu", x)
    return _Gelu.apply(x, False) if _kernel_takes(x) else F.gelu(x)


class _GeluBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p: Tensor, b: Tensor, tanh: bool) -> Tensor:
        ctx.save_for_backward(p, b)
        ctx.tanh = tanh
        ext = EXTENSION.load()
        return ext.bias_forward(p, b) if tanh else ext.erf_bias_forward(p, b)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        p, b = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True, as in _Gelu
            with torch.enable_grad():
                y = F.gelu(p + b, approximate=_TORCH[ctx.tanh])
                return (*torch.autograd.grad(y, (p, b), grad, create_graph=True), None)
        ext, grad = EXTENSION.load(even_if_disabled=True), grad.contiguous()
        du, db = ext.bias_backward(grad, p, b) if ctx.tanh else ext.erf_bias_backward(grad, p, b)
        return du, db, None


def gelu_bias_ready(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether ``gelu_bias`` runs its fused kernel on the product of x with a linear layer's weight: float32 or
    float64 CPU tensors of one dtype, outside CPU autocast (whose bf16 products take ``gelu``/``gelu_tanh``)."""
    return (
        bias is not None
        and x.dtype == weight.dtype == bias.dtype
        and cpu_float_reason(x) is None
        and not torch.is_autocast_enabled("cpu")
        and EXTENSION.unbuilt_reason() is None
    )


def gelu_bias(p: Tensor, b: Tensor, approximate: str = "none") -> Tensor:
    """GELU(p + b) for a linear layer's product p (..., n) before its bias b (n,), in one pass (``approximate``
    as ``F.gelu``'s: 'none' or 'tanh'); the backward gives b's gradient (the column sums) in the pass that gives
    p's. Where the kernel does not take p, b: GELU(p + b) through :func:`gelu` or :func:`gelu_tanh`."""
    if approximate not in _FORMS:
        raise ValueError(f"approximate must be 'none' or 'tanh' (as F.gelu's), got {approximate!r}")
    if not (p.is_floating_point() and b.is_floating_point()) or b.dim() != 1 or b.size(0) != p.size(-1):
        raise ValueError(
            f"gelu_bias expects a float product p (..., n) and a float bias b (n,); got p {p.dtype} "
            f"{tuple(p.shape)} and b {b.dtype} {tuple(b.shape)}"
        )
    tanh = _FORMS[approximate]
    if p.numel() == 0:  # nothing to compute (a zero-width layer): the empty result, through torch's ops
        return (gelu_tanh if tanh else gelu)(p + b)
    if cpu_float_reason(p) is None and p.dtype == b.dtype and EXTENSION.unbuilt_reason() is None:
        flat = p.reshape(-1, p.size(-1)).contiguous()  # (rows, n); p itself when p is a contiguous matrix
        return _GeluBias.apply(flat, b.contiguous(), tanh).view(p.shape)
    return (gelu_tanh if tanh else gelu)(p + b)
