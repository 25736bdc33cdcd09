r"""Attention for RNN encoder–decoders: one query vector (the decoder state) scored against the encoder's
positions. Additive (Bahdanau et al. 2014, arXiv 1409.0473) and multiplicative (Luong et al. 2015,
arXiv 1508.04025) scores.

Notation: ``b`` batch, ``s`` source positions, ``d_query`` decoder state width, ``d_key`` encoder state width.
Masks are boolean (b, s), True at real source positions; an all-False row gives zero weights, never NaN.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["AdditiveAttention", "LuongAttention"]


def _masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """softmax over the last axis of (b, s) where ``mask`` (b, s) is True; an all-False row gives zeros."""
    if mask is None:
        return scores.softmax(-1)
    if mask.shape != scores.shape or mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be boolean {tuple(scores.shape)}, True at real positions; got {mask.shape}"
        )
    keep = mask.any(-1, keepdim=True)  # (b, 1)
    w = scores.masked_fill(~(mask | ~keep), float("-inf")).softmax(-1)
    return w.masked_fill(~keep, 0.0)


class AdditiveAttention(nn.Module):
    r"""Bahdanau (additive, "concat") attention, Bahdanau et al. 2014 (arXiv 1409.0473), appendix A.1.2:

        e_j = vᵀ tanh(W_q s + W_k h_j + b)      α = softmax(e) over the unmasked j      c = Σ_j α_j h_j

    Shapes: query s (b, d_query); keys h (b, s, d_key); values (b, s, d_v), default the keys; mask (b, s),
    True at real positions -> context c (b, d_v), weights α (b, s). ``project_keys(keys)`` computes W_k h once
    per source sequence; pass it back as ``keys_proj`` at every decoder step.
    """

    def __init__(self, d_query: int, d_key: int, d_attn: int, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.query_proj = nn.Linear(d_query, d_attn, bias=False, **kw)
        self.key_proj = nn.Linear(d_key, d_attn, bias=True, **kw)
        self.v = nn.Linear(d_attn, 1, bias=False, **kw)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (b, s, d_key) -> (b, s, d_attn)

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        values: Tensor | None = None,
        mask: Tensor | None = None,
        keys_proj: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        keys_proj = self.project_keys(keys) if keys_proj is None else keys_proj  # (b, s, d_attn)
        e = self.v(torch.tanh(self.query_proj(query).unsqueeze(1) + keys_proj)).squeeze(-1)  # (b, s)
        w = _masked_softmax(e, mask)  # (b, s)
        values = keys if values is None else values
        return (w.unsqueeze(1) @ values).squeeze(1), w  # (b, 1, s) x (b, s, d_v) -> (b, d_v)


class LuongAttention(nn.Module):
    r"""Luong (multiplicative) attention, Luong et al. 2015 (arXiv 1508.04025), eq. 8:

        dot:      e_j = sᵀ h_j            (d_query == d_key)
        general:  e_j = sᵀ W_a h_j        W_a (d_query, d_key), no bias
        α = softmax(e) over the unmasked j,   c = Σ_j α_j h_j

    Shapes as :class:`AdditiveAttention`: query (b, d_query), keys (b, s, d_key), values (b, s, d_v) default
    the keys, mask (b, s) -> context (b, d_v), weights (b, s). The paper's attentional hidden state
    tanh(W_c [c; s]) belongs to the decoder that uses this module.
    """

    def __init__(
        self,
        d_query: int,
        d_key: int | None = None,
        score: Literal["dot", "general"] = "general",
        device=None,
        dtype=None,
    ):
        super().__init__()
        d_key = d_query if d_key is None else d_key
        if score not in ("dot", "general"):
            raise ValueError(f"score must be 'dot' or 'general', got {score!r}")
        if score == "dot" and d_key != d_query:
            raise ValueError(
                f"the dot score needs d_query == d_key, got {d_query} and {d_key}; use 'general'"
            )
        self.score = score
        self.W_a = (
            nn.Linear(d_key, d_query, bias=False, device=device, dtype=dtype) if score == "general" else None
        )

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        proj = keys if self.W_a is None else self.W_a(keys)  # (b, s, d_key) -> (b, s, d_query)
        e = (proj @ query.unsqueeze(-1)).squeeze(-1)  # (b, s, d_q) x (b, d_q, 1) -> (b, s)
        w = _masked_softmax(e, mask)  # (b, s)
        values = keys if values is None else values
        return (w.unsqueeze(1) @ values).squeeze(1), w  # (b, 1, s) x (b, s, d_v) -> (b, d_v)
