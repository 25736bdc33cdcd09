r"""Attention for RNN encoder–decoders: one query vector (the decoder state) scored against the encoder's
positions. Additive (Bahdanau et al. 2014, arXiv 1409.0473) and multiplicative (Luong et al. 2015,
arXiv 1508.04025) scores.

Notation: ``b`` batch, ``s`` source positions, ``t`` target positions (queries), ``d_query`` decoder state
width, ``d_key`` encoder state width. A query is one decoder state (b, d_query) or all of them at once
(b, t, d_query), for decoders whose recurrence does not read the context (Luong without input feeding).
Masks are boolean (b, s), True at real source positions; an all-False row gives zero weights, never NaN.

:class:`AttentionalHidden` is Luong et al.'s attentional hidden state h̃ = tanh(W_c [c; s]) (eq. 5) around
either score, the arrangement of OpenNMT-py's ``GlobalAttention`` (its "mlp" score is the additive one).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from seqlab.kernels.additive_score import additive_scores
from seqlab.layers.checks import check_dtype
from seqlab.layers.linear import Linear
from seqlab.validation import check_positive_ints

__all__ = ["AdditiveAttention", "AttentionalHidden", "LuongAttention"]


def _masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """softmax over the last axis of scores (b, s) or (b, t, s) where ``mask`` (b, s) is True; an all-False
    row gives zeros."""
    if mask is None:
        return scores.softmax(-1)
    want = (scores.size(0), scores.size(-1))
    if not isinstance(mask, Tensor) or tuple(mask.shape) != want or mask.dtype != torch.bool:
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be boolean (b, s) = {want}, True at real positions; got {got}")
    if scores.dim() == 3:
        mask = mask.unsqueeze(1)  # (b, 1, s): the same source mask for every query
    keep = mask.any(-1, keepdim=True)  # (b, 1) or (b, 1, 1)
    w = scores.masked_fill(~(mask | ~keep), float("-inf")).softmax(-1)
    return w.masked_fill(~keep, 0.0)


def _check_inputs(
    name: str, query: Tensor, keys: Tensor, values, keys_proj, d: tuple[int, int, int], param
) -> bool:
    """True when the query holds many positions (b, t, d_query). Raises, naming what was expected, unless query
    is (b, [t,] d_query), keys (b, s, d_key), values None or (b, s, d_v), keys_proj None or (b, s, d_proj) (of
    this module's project_keys) and the floats are of one dtype (the parameters', when ``param`` is given);
    ``d`` = (d_query, d_key, d_proj)."""
    d_query, d_key, d_proj = d
    ok = isinstance(query, Tensor) and query.dim() in (2, 3) and query.size(-1) == d_query
    ok = ok and isinstance(keys, Tensor) and keys.dim() == 3 and keys.size(0) == query.size(0)
    ok = ok and keys.size(-1) == d_key
    if not ok:
        got = [tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__ for v in (query, keys)]
        raise ValueError(
            f"{name} expects query (b, {d_query}) or (b, t, {d_query}) and keys (b, s, {d_key}) with the same b; "
            f"got query {got[0]} and keys {got[1]}"
        )
    b, s = keys.shape[:2]
    for what, x, width in (("values", values, None), ("keys_proj", keys_proj, d_proj)):
        if x is None:
            continue
        if (
            not isinstance(x, Tensor)
            or x.dim() != 3
            or x.shape[:2] != (b, s)
            or width not in (None, x.size(-1))
        ):
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            want = f"(b, s, {width})" if width else "(b, s, d_v)"
            raise ValueError(f"{name} expects {what} {want} with the keys' (b, s) = ({b}, {s}); got {got}")
    for what, x in (("query", query), ("keys", keys), ("values", values), ("keys_proj", keys_proj)):
        if x is None:
            continue
        if param is not None:
            check_dtype(name, x, param, what)
        elif x.dtype != query.dtype or not x.is_floating_point():
            raise ValueError(f"{name} expects floats of one dtype; query is {query.dtype}, {what} {x.dtype}")
    return query.dim() == 3


def _context(w: Tensor, values: Tensor, many: bool) -> Tensor:
    if many:
        return w @ values  # (b, t, s) x (b, s, d_v) -> (b, t, d_v)
    return (w.unsqueeze(1) @ values).squeeze(1)  # (b, 1, s) x (b, s, d_v) -> (b, d_v)


class AdditiveAttention(nn.Module):
    r"""Bahdanau (additive, "concat") attention, Bahdanau et al. 2014 (arXiv 1409.0473), appendix A.1.2:

        e_j = vᵀ tanh(W_q s + W_k h_j + b)      α = softmax(e) over the unmasked j      c = Σ_j α_j h_j

    Shapes: query s (b, d_query) or (b, t, d_query); keys h (b, s, d_key); values (b, s, d_v), default the
    keys; mask (b, s), True at real positions -> context c (b, [t,] d_v), weights α (b, [t,] s). ``project_keys(keys)`` computes W_k h once
    per source sequence; pass it back as ``keys_proj`` at every decoder step. The score runs as one C++ pass
    each way on the CPU (``seqlab.kernels.additive_score``: no (b, [t,] s, d_attn) tensor written or kept), as
    PyTorch ops elsewhere.
    """

    def __init__(self, d_query: int, d_key: int, d_attn: int, device=None, dtype=None):
        super().__init__()
        self.d_query, self.d_key, self.d_attn = d_query, d_key, d_attn
        check_positive_ints(self, ("d_query", "d_key", "d_attn"), "AdditiveAttention: ")
        kw = {"device": device, "dtype": dtype}
        self.query_proj = Linear(d_query, d_attn, bias=False, **kw)
        self.key_proj = Linear(d_key, d_attn, bias=True, **kw)
        self.v = Linear(d_attn, 1, bias=False, **kw)

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
        d = (self.query_proj.in_features, self.key_proj.in_features, self.key_proj.out_features)
        many = _check_inputs("AdditiveAttention", query, keys, values, keys_proj, d, self.v.weight)
        keys_proj = self.project_keys(keys) if keys_proj is None else keys_proj  # (b, s, d_attn)
        # vᵀ tanh(W_q s + W_k h_j + b): (b, [t,] s), one C++ pass on the CPU (seqlab.kernels.additive_score)
        e = additive_scores(self.query_proj(query), keys_proj, self.v.weight.view(-1))
        w = _masked_softmax(e, mask)  # (b, [t,] s)
        return _context(w, keys if values is None else values, many), w


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
        self.d_query, self.d_key = d_query, d_key
        check_positive_ints(self, ("d_query", "d_key"), "LuongAttention: ")
        if score not in ("dot", "general"):
            raise ValueError(f"score must be 'dot' or 'general', got {score!r}")
        if score == "dot" and d_key != d_query:
            raise ValueError(
                f"the dot score needs d_query == d_key, got {d_query} and {d_key}; use 'general'"
            )
        self.score, self.d_query, self.d_key = score, d_query, d_key
        self.W_a = (
            Linear(d_key, d_query, bias=False, device=device, dtype=dtype) if score == "general" else None
        )

    def project_keys(self, keys: Tensor) -> Tensor:
        """W_a h for the general score (the keys themselves for dot): once per source, as ``keys_proj``."""
        return keys if self.W_a is None else self.W_a(keys)  # (b, s, d_key) -> (b, s, d_query)

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        values: Tensor | None = None,
        mask: Tensor | None = None,
        keys_proj: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        d = (self.d_query, self.d_key, self.d_query)
        weight = None if self.W_a is None else self.W_a.weight
        many = _check_inputs("LuongAttention", query, keys, values, keys_proj, d, weight)
        proj = self.project_keys(keys) if keys_proj is None else keys_proj  # (b, s, d_query)
        # many: (b, t, d_q) x (b, d_q, s) -> (b, t, s); one: (b, s, d_q) x (b, d_q, 1) -> (b, s)
        e = query @ proj.transpose(1, 2) if many else (proj @ query.unsqueeze(-1)).squeeze(-1)
        w = _masked_softmax(e, mask)  # (b, [t,] s)
        return _context(w, keys if values is None else values, many), w


class AttentionalHidden(nn.Module):
    r"""Luong et al. 2015 (arXiv 1508.04025), eq. 5: the attentional hidden state around a score,

        c, α = attend(s, h)           h̃ = tanh(W_c [c; s])           (dot, general: W_c has no bias)

    ``score`` 'dot' and 'general' are :class:`LuongAttention`'s; 'concat' is the additive score of
    :class:`AdditiveAttention` (Luong's eq. 8 "concat", Bahdanau's score), whose W_c has a bias as in
    OpenNMT-py's ``GlobalAttention`` with ``attn_type="mlp"``. Shapes: query (b, [t,] d), keys (b, s, d),
    mask (b, s) -> h̃ (b, [t,] d), α (b, [t,] s). Queries and keys share the width ``d`` (the decoder's).
    """

    def __init__(
        self, d: int, score: Literal["dot", "general", "concat"] = "general", device=None, dtype=None
    ):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        if score not in ("dot", "general", "concat"):
            raise ValueError(f"score must be 'dot', 'general' or 'concat', got {score!r}")
        self.score = score
        self.attn = (
            AdditiveAttention(d, d, d, **kw) if score == "concat" else LuongAttention(d, d, score, **kw)
        )
        self.out_proj = Linear(2 * d, d, bias=score == "concat", **kw)  # W_c, acting on [c; s]

    def project_keys(self, keys: Tensor) -> Tensor:
        """The keys' share of the score, computed once per source; pass it back as ``keys_proj``."""
        return self.attn.project_keys(keys)

    def forward(
        self, query: Tensor, keys: Tensor, mask: Tensor | None = None, keys_proj: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        c, w = self.attn(query, keys, mask=mask, keys_proj=keys_proj)  # (b, [t,] d), (b, [t,] s)
        return torch.tanh(self.out_proj(torch.cat([c, query], dim=-1))), w
