"""Scaled dot-product attention for short sequences on the CPU through a C++ kernel (``attention.cpp``).

:func:`attention` is ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` for q, k, v
(b, h, t, d) with the same values (float32: within a few ulps; the sums run in another order) and an autograd
backward of its own that recomputes the probabilities from the saved log-sum-exp, as flash attention does. Its
output is a (b, h, t_q, d) view of a (b, t_q, h, d) tensor, so merging the heads afterwards is free, and its
input gradients come back in that layout too.

It takes what it was written for, and :func:`why_not_kernel` says why not otherwise (then
:func:`seqlab.layers.sdpa.scaled_dot_product_attention` calls torch): float32/float64 CPU tensors, as many key
heads as query heads, no mask other than the causal one (with t_q == t_k), no dropout, a head dim that is a
multiple of 16 floats (8 doubles) up to 256, up to 2,048 keys, whose scores for a block of 24 queries are
held in one buffer so that the softmax is exact in two passes, and at least 32 queries (decoding steps, with
one query each, run faster in torch's kernel: transposing the keys once per call costs as much as the step).

Measured in ``benchmarks/bench_attention_kernel.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason

__all__ = ["EXTENSION", "MAX_KEYS", "attention", "why_not_kernel"]

EXTENSION = CppExtension(
    "attention",
    "attention kernel",
    "attention uses torch's scaled_dot_product_attention instead",
    headers=("vec_math.h",),
    openmp=True,
)

MAX_KEYS = 2048  # the key length up to which a block's scores stay in one buffer
MAX_HEAD_DIM = 256
MIN_QUERIES = 32  # below this torch's kernel is faster: decoding steps (t_q = 1) go to torch


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
        out, lse = EXTENSION.load().forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward that autograd can differentiate again
            with torch.enable_grad():
                y = _written_out(q, k, v, ctx.causal, ctx.scale)
                return (*torch.autograd.grad(y, (q, k, v), grad, create_graph=True), None, None)
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        dq, dk, dv = EXTENSION.load().backward(grad, q, k, v, out, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def _written_out(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
    """softmax(scale q kᵀ + M) v in plain torch ops (twice differentiable, unlike torch's fused CPU kernels)."""
    s = torch.matmul(q, k.transpose(-2, -1)) * scale  # (b, h, t_q, t_k)
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def why_not_kernel(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool
) -> str | None:
    """None when :func:`attention` would run the kernel for these arguments, else why not."""
    if (reason := cpu_float_reason(q)) is not None:
        return reason
    if mask is not None:
        return "the kernel takes no mask (only the causal structure)"
    if dropout_p > 0:
        return "the kernel has no dropout"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "the kernel takes (b, h, t, d) tensors"
    if k.size(1) != q.size(1):
        return "the kernel needs as many key/value heads as query heads"
    if is_causal and q.size(2) != k.size(2):
        return "the kernel's causal mask needs t_q == t_k"
    if any(t.dtype != q.dtype or t.device != q.device for t in (k, v)):
        return "q, k and v must share dtype and device"
    width = 64 // q.element_size()
    if q.size(-1) % width or q.size(-1) > MAX_HEAD_DIM:
        return f"the kernel needs a head dim that is a multiple of {width} up to {MAX_HEAD_DIM}, got {q.size(-1)}"
    if not 1 <= k.size(2) <= MAX_KEYS:
        return f"the kernel takes 1 to {MAX_KEYS} keys, got {k.size(2)}"
    if q.size(2) < MIN_QUERIES:
        return f"below {MIN_QUERIES} queries (here {q.size(2)}: decoding) torch's kernel is faster"
    if torch.compiler.is_compiling():
        return "torch.compile is tracing"
    return EXTENSION.unbuilt_reason()


def attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(scale q kᵀ + M) v, q (b, h, t_q, d), k and v (b, h, t_k, d); M the causal mask if asked.

    Call it where :func:`why_not_kernel` returned None."""
    scale = q.size(-1) ** -0.5 if scale is None else float(scale)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return EXTENSION.load().forward(q, k, v, bool(is_causal), scale)[0]  # no graph to record
    return _Attention.apply(q, k, v, bool(is_causal), scale)
