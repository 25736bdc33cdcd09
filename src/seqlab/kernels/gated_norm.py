"""Mamba-2's gated RMSNorm, RMSNorm(y ⊙ silu(z)) · weight over groups of channels, in one C++ pass each way.

:func:`gated_rms_norm` computes what :func:`gated_rms_norm_ref` computes with torch ops, in float32 at least:
y, z (..., d), weight (d,), ``group_size`` dividing d. Three routes, the same values:

- the C++ kernel (``gated_norm.cpp``) for contiguous float32/float64 CPU tensors of one dtype when it builds:
  one pass forward (keeping each group's 1 / rms), one recomputing pass backward (about ten elementwise torch
  passes each way otherwise: a tenth of the lab's Mamba-2 training step);
- :class:`_GatedRMSNorm` (torch ops, their own backward) where the kernel cannot run (CUDA, bfloat16, no
  compiler) and gradients are wanted: it saves y, z and 1 / rms instead of the ops' intermediates;
- the ops themselves without gradients.

A backward with ``create_graph=True`` (double backward) differentiates :func:`gated_rms_norm_ref`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason

__all__ = ["EXTENSION", "gated_rms_norm", "gated_rms_norm_ref", "why_not_kernel"]

EXTENSION = CppExtension(
    "gated_norm",
    "gated RMSNorm kernel",
    "Mamba-2's gated RMSNorm uses torch ops instead",
    headers=("vec_math.h",),
    openmp=True,
    label="gated RMSNorm (Mamba-2)",
)


def gated_rms_norm_ref(y: Tensor, z: Tensor, weight: Tensor, group_size: int, eps: float) -> Tensor:
    """RMSNorm(y ⊙ silu(z)) · weight over groups of ``group_size`` channels, as PyTorch ops, in float32 at least:
    y, z (..., d), weight (d,) -> (..., d). The reference of the kernel and of :class:`_GatedRMSNorm`."""
    wide = torch.promote_types(y.dtype, torch.float32)
    g = (y.to(wide) * F.silu(z.to(wide))).unflatten(-1, (-1, group_size))  # (..., groups, group_size)
    return F.rms_norm(g, (group_size,), eps=eps).flatten(-2).to(y.dtype) * weight


def _ref_grads(y, z, weight, group_size: int, eps: float, dout) -> tuple:
    """The gradients of :func:`gated_rms_norm_ref` as autograd sees them (a double backward's route)."""
    with torch.enable_grad():
        out = gated_rms_norm_ref(y, z, weight, group_size, eps)
        grads = torch.autograd.grad(out, (y, z, weight), dout, create_graph=True)
    return (*grads, None, None)


class _GatedRMSNorm(torch.autograd.Function):
    """gated_rms_norm_ref, keeping for the backward only y, z and each group's 1 / rms (the ops keep silu(z), the
    product and its normalized form besides: at a lab Mamba-2 LM's b 8, t 1024, 3.4 MB each per layer). The
    backward recomputes them: with n = g r, g = y ⊙ silu(z), r = 1 / rms(g),
        ∂L/∂n = ∂L/∂out ⊙ w,  ∂L/∂w = Σ ∂L/∂out ⊙ n,  ∂L/∂g = r (∂L/∂n - n · mean(∂L/∂n ⊙ n)),
        ∂L/∂y = ∂L/∂g ⊙ silu(z),  ∂L/∂z = ∂L/∂g ⊙ y ⊙ σ(z) (1 + z (1 - σ(z))).
    A backward with create_graph=True differentiates the reference."""

    @staticmethod
    def forward(ctx, y, z, weight, group_size: int, eps: float):
        wide = torch.promote_types(y.dtype, torch.float32)
        g = (y.to(wide) * F.silu(z.to(wide))).unflatten(-1, (-1, group_size))
        r = torch.rsqrt(g.square().mean(-1, keepdim=True) + eps)  # (..., groups, 1)
        ctx.save_for_backward(y, z, weight, r)
        ctx.group_size, ctx.eps = group_size, eps
        return (g * r).flatten(-2).to(y.dtype) * weight

    @staticmethod
    def backward(ctx, dout):
        y, z, weight, r = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: second derivatives through the reference
            return _ref_grads(y, z, weight, ctx.group_size, ctx.eps, dout)
        wide = r.dtype
        yw, zw, sg = y.to(wide), z.to(wide), torch.sigmoid(z.to(wide))
        silu = zw * sg
        n = (yw * silu).unflatten(-1, (-1, ctx.group_size)) * r  # (..., groups, group_size)
        dout = dout.to(wide)
        dn = (dout * weight.to(wide)).unflatten(-1, (-1, ctx.group_size))
        dw = (dout * n.flatten(-2)).reshape(-1, weight.numel()).sum(0)
        dg = (r * (dn - n * (dn * n).mean(-1, keepdim=True))).flatten(-2)
        dy, dz = dg * silu, dg * yw * sg * (1 + zw * (1 - sg))
        return dy.to(y.dtype), dz.to(z.dtype), dw.to(weight.dtype), None, None


class _GatedNormKernel(torch.autograd.Function):
    """The C++ kernel: saves y, z, weight and each group's 1 / rms, as :class:`_GatedRMSNorm` does."""

    @staticmethod
    def forward(ctx, y, z, weight, group_size: int, eps: float):
        out, rstd = EXTENSION.load().forward(y, z, weight, group_size, eps)
        ctx.save_for_backward(y, z, weight, rstd)
        ctx.group_size, ctx.eps = group_size, eps
        return out

    @staticmethod
    def backward(ctx, dout):
        y, z, weight, rstd = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _ref_grads(y, z, weight, ctx.group_size, ctx.eps, dout)
        dy, dz, dw = EXTENSION.load(even_if_disabled=True).backward(
            dout.contiguous(), y, z, weight, rstd, ctx.group_size
        )
        return dy, dz, dw, None, None


def why_not_kernel(y: Tensor, z: Tensor, weight: Tensor) -> str | None:
    """None when :func:`gated_rms_norm` would run the C++ kernel for these tensors, else why not."""
    if (reason := cpu_float_reason(y)) is not None:
        return reason
    if any(t.dtype != y.dtype or t.device != y.device for t in (z, weight)):
        return "z and weight must share y's dtype and device"
    if not (y.is_contiguous() and z.is_contiguous()) or y.dim() == 0 or y.numel() == 0:
        return "y and z must be contiguous, non-empty tensors"
    if torch.compiler.is_compiling():
        return "torch.compile is tracing"
    return EXTENSION.unbuilt_reason()


def gated_rms_norm(y: Tensor, z: Tensor, weight: Tensor, group_size: int, eps: float) -> Tensor:
    """RMSNorm(y ⊙ silu(z)) · weight over groups of ``group_size`` channels: y, z (..., d) of one shape, weight
    (d,), ``group_size`` dividing d -> (..., d) of y's dtype; through the C++ kernel where it runs (module
    docstring)."""
    for name, t in (("y", y), ("z", z), ("weight", weight)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"gated_rms_norm: {name} must be a floating tensor, got {got}")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"gated_rms_norm: eps must be a positive finite number, got {eps!r}")
    d = y.size(-1) if y.dim() else 0
    if z.shape != y.shape or weight.shape != (d,) or d == 0 or group_size < 1 or d % group_size:
        raise ValueError(
            f"gated_rms_norm: expected y and z of one shape (..., d), weight (d,) and group_size dividing d, got "
            f"y {tuple(y.shape)}, z {tuple(z.shape)}, weight {tuple(weight.shape)}, group_size {group_size}"
        )
    if why_not_kernel(y, z, weight) is None:
        return _GatedNormKernel.apply(y, z, weight.contiguous(), group_size, float(eps))
    if torch.is_grad_enabled():
        return _GatedRMSNorm.apply(y, z, weight, group_size, eps)
    return gated_rms_norm_ref(y, z, weight, group_size, eps)
