r"""Bahdanau's additive attention score in one C++ pass forward and one back (``additive_score.cpp``).

From the projected query q = W_q s (b, d) or (b, t, d), the projected keys k = W_k h + bias (b, s, d) and the
score vector v (d,):

    e[b, (i,) j] = Σ_c v_c tanh(q[b, (i,) c] + k[b, j, c])        -> (b, s) or (b, t, s)

:func:`additive_scores` is :class:`seqlab.layers.AdditiveAttention`'s score (RNNsearch's decoder, Show, Attend
and Tell's): PyTorch's ops write q + k and its tanh as (b, [t,] s, d) tensors, read them back for the product
with v and keep the tanh for the backward, where the kernel holds the sum and the tanh in registers and its
backward recomputes them. :func:`additive_scores_ref` is the same in PyTorch ops, the path for other devices and
dtypes (bfloat16 under autocast included), for a kernel that cannot be built, and for a backward with
``create_graph=True``, which differentiates it so that second derivatives are exact too. float32 computes tanh
from ``vec_math.h``'s exp (absolute error below 2.5e-7), float64 with the C library's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason

__all__ = ["EXTENSION", "additive_scores", "additive_scores_ref", "why_not_kernel"]

EXTENSION = CppExtension(
    "additive_score",
    "additive attention kernel",
    "additive attention scores run as PyTorch ops instead",
    headers=("vec_math.h",),
    openmp=True,
    label="additive attention",
)


def additive_scores_ref(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """vᵀ tanh(q + k) in PyTorch ops: q (b, d) or (b, t, d), k (b, s, d), v (d,) -> (b, s) or (b, t, s)."""
    u = q.unsqueeze(-2) + (k.unsqueeze(1) if q.dim() == 3 else k)  # (b, [t,] s, d)
    return F.linear(torch.tanh(u), v[None]).squeeze(-1)  # as a Linear(d, 1) layer computes it


class _AdditiveScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        ctx.save_for_backward(q, k, v)
        return EXTENSION.load().forward(q, k, v)  # (b, t, s)

    @staticmethod
    def backward(ctx, de: Tensor):
        q, k, v = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the reference
            wanted = [t for t, need in zip((q, k, v), ctx.needs_input_grad, strict=True) if need]
            with torch.enable_grad():
                got = iter(torch.autograd.grad(additive_scores_ref(q, k, v), wanted, de, create_graph=True))
            return tuple(next(got) if need else None for need in ctx.needs_input_grad)
        return tuple(EXTENSION.load(even_if_disabled=True).backward(de.contiguous(), q, k, v))  # dq, dk, dv


def why_not_kernel(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """None when :func:`additive_scores` runs the kernel for these inputs, else why it runs PyTorch's ops."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if (reason := cpu_float_reason(x)) is not None:
            return reason.replace(" x ", f" {name} ")
    if not q.dtype == k.dtype == v.dtype:
        return f"q, k and v have the dtypes {q.dtype}, {k.dtype} and {v.dtype}"
    if q.numel() == 0 or k.numel() == 0:
        return "empty sizes go to torch"
    if torch.compiler.is_compiling():  # torch.compile traces the reference's ops
        return "torch.compile is tracing"
    return EXTENSION.unbuilt_reason()


def additive_scores(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """e = vᵀ tanh(q + k) (the module docstring): q (b, d) or (b, t, d), k (b, s, d), v (d,) -> (b, s) or
    (b, t, s), through the kernel where :func:`why_not_kernel` says so, else :func:`additive_scores_ref`. A
    ValueError names the expected and the given shapes when they do not fit."""
    if not (q.dim() in (2, 3) and k.dim() == 3 and v.dim() == 1):
        raise ValueError(
            "additive_scores takes q (b, d) or (b, t, d), k (b, s, d) and v (d,), got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if k.size(0) != q.size(0) or k.size(-1) != q.size(-1) or v.size(0) != q.size(-1):
        raise ValueError(
            f"additive_scores: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must agree in the "
            "batch (first) and the attention width (last)"
        )
    if why_not_kernel(q, k, v) is not None:
        return additive_scores_ref(q, k, v)
    one = q.dim() == 2
    e = _AdditiveScores.apply((q.unsqueeze(1) if one else q).contiguous(), k.contiguous(), v.contiguous())
    return e.squeeze(1) if one else e
