"""Scaled dot-product attention for short sequences on the CPU through a C++ kernel (``attention.cpp``).

:func:`attention` is ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` for q, k, v
(b, h, t, d) with the same values (float32: within a few ulps; the sums run in another order) and an autograd
backward of its own that recomputes the probabilities from the saved log-sum-exp, as flash attention does. Its
output is a (b, h, t_q, d) view of a (b, t_q, h, d) tensor, so merging the heads afterwards is free, and its
input gradients come back in that layout too.

It takes what it was written for, and :func:`why_not_kernel` says why not otherwise (then
:func:`seqlab.layers.sdpa.scaled_dot_product_attention` calls torch): float32/float64 CPU tensors, as many key
heads as query heads, no mask but the causal one (with t_q == t_k) and a key padding mask (:func:`key_mask`: one
mask of keys per batch row, as padded batches make), attention dropout drawn by the kernel itself, a head dim
up to 256 (bidirectional: a multiple of 16 floats, 8 doubles; any other runs padded to one inside the kernel,
which pays off only when causal), and the lengths where it was measured faster than torch's: at least 32
queries (decoding steps, with one query each, run faster in torch's kernel: transposing the keys once per call
costs as much as the step; shorter self-attention only over at least 4,096 query rows in all, as in a batch of
short sequences) and at most 512 keys, 1,024 when causal (``MAX_KEYS``; on AMD CPUs with AVX-512 1,024 and 2,048,
and 8,192 for head dims up to 32: :func:`max_keys`). The scores of a block of 24 queries
against all keys are held in one buffer, so the softmax is exact in two passes.

Measured in ``benchmarks/bench_attention_kernel.py``; the derivation and the reasons for each limit: docs/attention.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason_of
from seqlab.kernels.gemm import amd_with_avx512

__all__ = [
    "EXTENSION",
    "MAX_KEYS",
    "MAX_KEYS_AMD",
    "attention",
    "attention_packed",
    "key_mask",
    "max_keys",
    "why_not_kernel",
    "why_not_shapes",
]

EXTENSION = CppExtension(
    "attention",
    "attention kernel",
    "attention uses torch's scaled_dot_product_attention instead",
    headers=("vec_math.h",),
    openmp=True,
    label="attention (short seqs)",
)

# the key lengths up to which the kernel beats torch's (benchmarks/results/attention-kernel-*): its products
# run from cache-sized blocks at about the same rate at any length, while torch's overheads shrink as the
# sequence grows; a causal row block reads half the keys on average, so it holds out twice as long
MAX_KEYS = {"causal": 1024, "bidirectional": 512}
# on an AMD CPU with AVX-512 (gemm.amd_with_avx512), where torch's float32 products run slower (MKL), the kernel
# held out longer (attention-kernel-amd-epyc-*, fwd+bwd, 2 threads, two runs): at head dim 64 causal 1.28-1.30x
# torch's at 2,048 keys and 0.91-1.01x at 4,096, bidirectional 1.04-1.06x at 1,024 and 1.01-1.03x at 2,048; at
# head dims up to 32 it stayed ahead at every length measured, causal and not (d 12: 1.58-1.67x at 8,192 keys;
# d 16 and 32: 1.23-1.51x at 2,048 and 4,096), so there the limit is the longest measured
MAX_KEYS_AMD = {"causal": 2048, "bidirectional": 1024}
SMALL_HEAD_DIM, MAX_KEYS_SMALL_HEADS_AMD = 32, 8192
MAX_HEAD_DIM = 256
MIN_QUERIES = 32  # below this torch's kernel is faster: decoding steps (t_q = 1) go to torch ...
MIN_SHORT_ROWS = (
    4096  # ... unless it is self-attention over short sequences with b·h·t ≥ this many query rows
)


def _heads_last(b: int, h: int, t: int, d: int, like: Tensor) -> Tensor:
    """An empty (b, h, t, d) tensor over (b, t, h, d) memory."""
    return torch.empty(b, t, h, d, dtype=like.dtype, device=like.device).transpose(1, 2)


def _heads(x: Tensor, n_heads: int) -> Tensor:
    """(b, t, h d) -> the (b, h, t, d) view."""
    b, t, width = x.shape
    return x.view(b, t, n_heads, width // n_heads).transpose(1, 2)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, keep: Tensor | None, p: float, seed: int) -> Tensor:
        out, lse = EXTENSION.load().forward(q, k, v, causal, scale, keep, p, seed)
        ctx.save_for_backward(q, k, v, out, lse, keep)
        ctx.causal, ctx.scale, ctx.p, ctx.seed = causal, scale, p, seed
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, out, lse, keep = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward that autograd can differentiate again
            with torch.enable_grad():
                drop = dropout_mask(q, k, ctx.p, ctx.seed) if ctx.p > 0 else None
                y = _written_out(q, k, v, ctx.causal, ctx.scale, keep, drop)
                grads = torch.autograd.grad(y, (q, k, v), grad, create_graph=True)
                return (*grads, None, None, None, None, None)
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        (b, h, t_q, d), t_k = q.shape, k.size(2)
        dq, dk, dv = _heads_last(b, h, t_q, d, q), _heads_last(b, h, t_k, d, q), _heads_last(b, h, t_k, d, q)
        kernel = EXTENSION.load(even_if_disabled=True)  # the forward ran it
        kernel.backward(grad, q, k, v, out, lse, ctx.causal, ctx.scale, dq, dk, dv, keep, ctx.p, ctx.seed)
        return dq, dk, dv, None, None, None, None, None


class _PackedAttention(torch.autograd.Function):
    """Self-attention from one (b, t, 3 h d) projection [q | k | v]; its gradient is written in that layout
    directly (three separate gradients would be concatenated into it by autograd, a copy of the whole)."""

    @staticmethod
    def forward(ctx, qkv: Tensor, n_heads: int, causal: bool, scale: float, p: float, seed: int) -> Tensor:
        q, k, v = (_heads(x, n_heads) for x in qkv.chunk(3, dim=-1))
        out, lse = EXTENSION.load().forward(q, k, v, causal, scale, None, p, seed)
        ctx.save_for_backward(qkv, out, lse)
        ctx.n_heads, ctx.causal, ctx.scale, ctx.p, ctx.seed = n_heads, causal, scale, p, seed
        return out.transpose(1, 2).flatten(2)  # (b, t, h d), a view

    @staticmethod
    def backward(ctx, grad: Tensor):
        qkv, out, lse = ctx.saved_tensors
        h = ctx.n_heads
        if torch.is_grad_enabled():
            with torch.enable_grad():
                q, k, v = (_heads(x, h) for x in qkv.chunk(3, dim=-1))
                drop = dropout_mask(q, k, ctx.p, ctx.seed) if ctx.p > 0 else None
                y = _written_out(q, k, v, ctx.causal, ctx.scale, None, drop)
                (dqkv,) = torch.autograd.grad(y.transpose(1, 2).flatten(2), qkv, grad, create_graph=True)
                return dqkv, None, None, None, None, None
        grad = _heads(grad if grad.stride(-1) == 1 else grad.contiguous(), h)
        dqkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        q, k, v = (_heads(x, h) for x in qkv.chunk(3, dim=-1))
        dq, dk, dv = (_heads(x, h) for x in dqkv.chunk(3, dim=-1))
        kernel = EXTENSION.load(even_if_disabled=True)  # the forward ran it
        kernel.backward(grad, q, k, v, out, lse, ctx.causal, ctx.scale, dq, dk, dv, None, ctx.p, ctx.seed)
        return dqkv, None, None, None, None, None


def dropout_mask(q: Tensor, k: Tensor, p: float, seed: int) -> Tensor:
    """The factors (0 or 1 / (1 − p)) that the kernel's dropout with this seed multiplies P by, (b, h, t_q, t_k)."""
    b, h, t_q, _ = q.shape
    like = q.detach() if q.dtype != torch.bfloat16 else q.detach().float()  # bf16: float32 factors, then cast
    return EXTENSION.load().dropout_mask(b, h, t_q, k.size(2), float(p), int(seed), like).to(q.dtype)


def _written_out(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    scale: float,
    keep: Tensor | None = None,
    drop: Tensor | None = None,
) -> Tensor:
    """dropout(softmax(scale q kᵀ + M)) v in plain torch ops (twice differentiable, unlike torch's fused CPU
    kernels), ``drop`` the dropout factors; a row with every key masked gives zeros, as the kernel does."""
    s = torch.matmul(q, k.transpose(-2, -1)) * scale  # (b, h, t_q, t_k)
    allowed = torch.ones_like(s, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if keep is not None:
        allowed = allowed & keep[:, None, None, :]
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    p = torch.where(allowed.any(-1, keepdim=True), p, torch.zeros_like(p))
    return torch.matmul(p if drop is None else p * drop, v)


def _is_key_mask(mask: Tensor, batch: int, t_k: int) -> bool:
    """Whether ``mask`` masks whole keys alike for every head and query: boolean, shape (t_k,), (1 or batch, 1,
    1, t_k), or another that broadcasts so. Reads the shape only."""
    if mask.dtype != torch.bool or mask.dim() > 4 or mask.size(-1) != t_k:
        return False
    lead = (1,) * (4 - mask.dim()) + tuple(mask.shape[:-1])  # (b, h, t_q) of the 4-D broadcast
    return lead[1] == 1 and lead[2] == 1 and lead[0] in (1, batch)


def key_mask(mask: Tensor, batch: int, t_k: int) -> Tensor | None:
    """The (batch, t_k) key mask that ``mask`` is, when it masks whole keys alike for every head and query (a
    padding mask: shape (t_k,), (1 or batch, 1, 1, t_k), ...), contiguous; None for any other mask."""
    if not _is_key_mask(mask, batch, t_k):
        return None
    return mask.reshape(-1, t_k).expand(batch, t_k).contiguous()


def why_not_shapes(
    dtype: torch.dtype,
    device: torch.device,
    h: int,
    g: int,
    t_q: int,
    t_k: int,
    d: int,
    is_causal: bool,
    batch: int = 1,
) -> str | None:
    """None when the kernel takes attention of these dtype, device, heads (h query, g key/value), lengths and
    head dim (masks and dropout are checked by why_not_kernel), else why not."""
    if (reason := cpu_float_reason_of(device, dtype, "q", bf16=True)) is not None:
        return reason
    if g != h:
        return "the kernel needs as many key/value heads as query heads"
    if is_causal and t_q != t_k:
        return "the kernel's causal mask needs t_q == t_k"
    if d > MAX_HEAD_DIM:
        return f"the kernel takes head dims up to {MAX_HEAD_DIM}, got {d}"
    compute = torch.float32 if dtype == torch.bfloat16 else dtype  # bfloat16 rows are computed in float32
    width = 64 * 8 // torch.finfo(compute).bits  # one 64-byte vector of elements
    if not is_causal and d % width:
        return (
            f"bidirectional attention with a head dim that is not a multiple of {width} (here {d}) runs as fast in "
            "torch's kernel (the padded head dim costs what the kernel saves)"
        )
    most = max_keys(is_causal, d)
    if not 1 <= t_k <= most:
        kind = "causal" if is_causal else "bidirectional"
        return f"past {most} keys ({kind}; here {t_k}) torch's kernel is faster"
    short_batch = t_q == t_k and batch * h * t_q >= MIN_SHORT_ROWS  # e.g. a ViT of 17 tokens, batch 128
    if t_q < MIN_QUERIES and not short_batch:
        return (
            f"below {MIN_QUERIES} queries (here {t_q}) torch's kernel is faster, unless it is self-attention over "
            f"at least {MIN_SHORT_ROWS} query rows in all (here {batch * h * t_q})"
        )
    if torch.compiler.is_compiling():
        return "torch.compile is tracing"
    return EXTENSION.unbuilt_reason()


def max_keys(is_causal: bool, d: int) -> int:
    """The most keys for which the kernel takes attention of head dim ``d`` on this machine (the limits above)."""
    kind = "causal" if is_causal else "bidirectional"
    if not amd_with_avx512():
        return MAX_KEYS[kind]
    return MAX_KEYS_SMALL_HEADS_AMD if d <= SMALL_HEAD_DIM else MAX_KEYS_AMD[kind]


def why_not_kernel(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool
) -> str | None:
    """None when :func:`attention` would run the kernel for these arguments (with ``keep=key_mask(mask, ...)``
    when there is a mask), else why not. Reads shapes only: no mask is copied here."""
    if not 0 <= dropout_p < 1:
        return f"dropout_p must be in [0, 1), got {dropout_p}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "the kernel takes (b, h, t, d) tensors"
    if any(t.dtype != q.dtype or t.device != q.device for t in (k, v)):
        return "q, k and v must share dtype and device"
    b, h, t_q, d = q.shape
    if k.size(0) != b or v.size(0) != b or k.shape[1:] != v.shape[1:] or k.size(-1) != d:
        return "the kernel takes q (b, h, t_q, d) and k, v (b, h, t_k, d) of one batch size (torch broadcasts them)"
    if d == 0 or t_q == 0 or k.size(2) == 0 or b == 0 or h == 0:
        return "empty sizes go to torch"
    if mask is not None and not _is_key_mask(mask, b, k.size(2)):
        return (
            "the kernel takes a key padding mask ((b, 1, 1, t_k) or broadcast to it) and the causal structure"
        )
    return why_not_shapes(q.dtype, q.device, h, k.size(1), t_q, k.size(2), d, is_causal, b)


def _seed(dropout_p: float) -> int:
    """A seed for the dropout mask from torch's default generator (0, and no draw, without dropout)."""
    return int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    keep: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """dropout(softmax(scale q kᵀ + M)) v, q (b, h, t_q, d), k and v (b, h, t_k, d); M the causal mask if asked,
    and −∞ at the keys where ``keep`` (b, t_k), a key padding mask, is False. A query with no key left gets
    zeros. Dropout draws its mask from a seed taken from torch's generator (so ``torch.manual_seed`` repeats
    it), by a counter-based hash that the backward regenerates (:func:`dropout_mask` shows it).

    Call it where :func:`why_not_kernel` returned None."""
    scale = q.size(-1) ** -0.5 if scale is None else float(scale)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if keep is not None:
        keep = keep.to(torch.bool).contiguous()
    p, seed = float(dropout_p), _seed(dropout_p)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return EXTENSION.load().forward(q, k, v, bool(is_causal), scale, keep, p, seed)[0]  # no graph
    return _Attention.apply(q, k, v, bool(is_causal), scale, keep, p, seed)


def attention_packed(
    qkv: Tensor, n_heads: int, is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0
) -> Tensor:
    """Self-attention over qkv (b, t, 3 h d) = [q | k | v] (each h heads of d): -> (b, t, h d), the heads merged;
    dropout as in :func:`attention`.

    Call it where :func:`why_not_shapes` returned None (qkv's last dimension must be contiguous)."""
    if qkv.dim() != 3 or n_heads < 1 or qkv.size(-1) % (3 * n_heads):
        raise ValueError(
            f"attention_packed: expected qkv (b, t, 3 h d) with h = n_heads = {n_heads} heads, got shape "
            f"{tuple(qkv.shape)}"
        )
    d = qkv.size(-1) // (3 * n_heads)
    scale = d**-0.5 if scale is None else float(scale)
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    p, seed = float(dropout_p), _seed(dropout_p)
    if not (torch.is_grad_enabled() and qkv.requires_grad):
        q, k, v = (_heads(x, n_heads) for x in qkv.chunk(3, dim=-1))
        out = EXTENSION.load().forward(q, k, v, bool(is_causal), scale, None, p, seed)[0]
        return out.transpose(1, 2).flatten(2)
    return _PackedAttention.apply(qkv, n_heads, bool(is_causal), scale, p, seed)
