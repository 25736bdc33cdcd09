r"""Scaled dot-product attention (Vaswani et al. 2017, arXiv 1706.03762, eq. 1) with grouped-query heads
(Ainslie et al. 2023, arXiv 2305.13245): the fast path and its reference, with one signature.

Notation: ``b`` batch, ``t_q`` queries, ``t_k`` keys, ``h`` query heads, ``g`` key/value heads (``h`` a multiple
of ``g``), ``k`` head dim.

    Attention(Q, K, V) = softmax(Q Kᵀ / √k + M) V
    M[i, j] = 0 where mask[i, j] is True (may attend), -inf where False

Masks are boolean with SDPA's polarity, True = may attend (see ``seqlab.layers.masks``). A query row with
nothing to attend to yields a zero output and zero (finite) gradients, where the softmax alone would give
0/0 = NaN (torch.nn.MultiheadAttention returns NaN there, pytorch issue 41508).

:func:`scaled_dot_product_attention` hands the work to ``torch.nn.functional.scaled_dot_product_attention``
(fused kernels: flash on CPU and GPU, memory-efficient, cuDNN), or on the CPU, for the sequences it was written
for (no mask but the causal one, no dropout, up to 2,048 keys: :func:`seqlab.kernels.attention.why_not_kernel`),
to seqlab's own kernel, which is faster there; :func:`scaled_dot_product_attention_ref` writes the equation out
and can return the weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels import attention as attention_kernel
from seqlab.layers.masks import causal_mask, combine_masks

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_ref"]

_SDPA_GQA: bool | None = None  # whether this torch's SDPA takes enable_gqa (torch >= 2.5); probed once


def _sdpa_has_gqa() -> bool:
    global _SDPA_GQA
    if _SDPA_GQA is None:
        z = torch.zeros(1, 2, 1, 2)
        try:
            F.scaled_dot_product_attention(z, z[:, :1], z[:, :1], enable_gqa=True)
            _SDPA_GQA = True
        except (TypeError, RuntimeError):
            _SDPA_GQA = False
    return _SDPA_GQA


def _repeat_kv(x: Tensor, n_heads: int) -> Tensor:
    """(b, g, t, k) -> (b, h, t, k): key/value head j serves query heads j*h/g ... (j+1)*h/g - 1."""
    g = x.size(-3)
    return x if g == n_heads else x.repeat_interleave(n_heads // g, dim=-3)


def _prepare_mask(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
) -> tuple[Tensor | None, bool]:
    """Fold ``is_causal`` into ``mask`` unless SDPA can take it as is (t_q == t_k, no mask); shapes checked."""
    t_q, t_k = q.size(-2), k.size(-2)
    if mask is not None and mask.dim() < 2:  # a (t_k,) key mask: one row for every query (SDPA wants 2-D)
        mask = mask.view(1, -1)
    if is_causal and (mask is not None or t_q != t_k):
        return combine_masks(mask, causal_mask(t_q, t_k, device=q.device)), False
    return mask, is_causal


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> None:
    """q (b, h, t_q, k), k and v (b, g, t_k, k) with h a multiple of g, floating, of one dtype; a boolean mask
    broadcastable to them; 0 <= dropout_p < 1."""
    if not all(isinstance(x, Tensor) for x in (q, k, v)):
        raise TypeError(f"q, k and v must be tensors, got {', '.join(type(x).__name__ for x in (q, k, v))}")
    if not (q.is_floating_point() and k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(
            f"q, k and v must be floating tensors of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not (isinstance(dropout_p, (int, float)) and 0 <= dropout_p < 1):
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"expected q (b, h, t_q, k), k and v (b, g, t_k, k); got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    h, g = q.size(-3), k.size(-3)
    if h % g or v.size(-3) != g or k.size(-2) != v.size(-2) or q.size(-1) != k.size(-1):
        raise ValueError(
            f"incompatible q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: the query heads must "
            "be a multiple of the key/value heads, k and v must have the same length, q and k the same head dim"
        )
    t_q, t_k = q.size(-2), k.size(-2)
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(
                f"mask must be boolean (True = may attend), got {mask.dtype}; "
                "seqlab.layers.masks.from_torch_mask converts torch.nn's masks"
            )
        try:
            torch.broadcast_shapes(mask.shape, (*q.shape[:-2], t_q, t_k))
        except RuntimeError:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to (b, h, t_q, t_k) = "
                f"{(*q.shape[:-2], t_q, t_k)}"
            ) from None


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """softmax(q kᵀ · scale + M) v through torch's fused SDPA kernels. q (b, h, t_q, k), k/v (b, g, t_k, k).

    Differences from ``torch.nn.functional.scaled_dot_product_attention``: ``is_causal`` aligns the queries to
    the *end* of the keys when t_q < t_k (KV-cache decoding; torch aligns to the start), and may be combined
    with ``mask``; grouped-query k/v (g < h) need no flag; a fully masked query row returns zeros, not NaN.
    """
    _check_shapes(q, k, v, mask, dropout_p)
    if attention_kernel.why_not_kernel(q, k, v, mask, dropout_p, is_causal) is None:  # seqlab's CPU kernel
        keys = None if mask is None else attention_kernel.key_mask(mask, q.size(0), k.size(-2))
        return attention_kernel.attention(q, k, v, is_causal, scale, keys, dropout_p)
    mask, is_causal = _prepare_mask(q, k, v, mask, is_causal)
    keep = None
    if mask is not None:
        keep = mask.any(-1, keepdim=True)  # (..., t_q, 1): rows that have at least one key to attend to
        mask = mask | ~keep  # an empty row attends everywhere (finite numbers); its output is zeroed below
    kw = {}
    if q.size(-3) != k.size(-3):
        if _sdpa_has_gqa():
            kw["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, q.size(-3)), _repeat_kv(v, q.size(-3))  # (b, h, t_k, k)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw
    )  # (b, h, t_q, t_k) x (b, h, t_k, k) -> (b, h, t_q, k), fused
    return out if keep is None else out.masked_fill(~keep, 0.0)


def scaled_dot_product_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The same as :func:`scaled_dot_product_attention`, written out; ``return_weights`` also returns the
    attention weights (b, h, t_q, t_k) before dropout. The softmax runs in float32 at least."""
    _check_shapes(q, k, v, mask, dropout_p)
    mask, is_causal = _prepare_mask(q, k, v, mask, is_causal)
    t_q, t_k = q.size(-2), k.size(-2)
    if is_causal:
        mask = causal_mask(t_q, t_k, device=q.device)
    k, v = _repeat_kv(k, q.size(-3)), _repeat_kv(v, q.size(-3))  # (b, h, t_k, k)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)  # float32 at least for the softmax
    scores = (q @ k.transpose(-2, -1)).to(acc) * scale  # (b, h, t_q, k) x (b, h, k, t_k) -> (b, h, t_q, t_k)
    keep = None
    if mask is not None:
        keep = mask.any(-1, keepdim=True)  # (..., t_q, 1)
        scores = scores.masked_fill(~(mask | ~keep), float("-inf"))
    weights = scores.softmax(-1)  # (b, h, t_q, t_k), rows sum to 1
    if keep is not None:
        weights = weights.masked_fill(~keep, 0.0)  # nothing to attend to: zero weights, zero output
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    out = dropped.to(v.dtype) @ v  # (b, h, t_q, t_k) x (b, h, t_k, k) -> (b, h, t_q, k)
    return (out, weights.to(q.dtype)) if return_weights else out
