"""torch.nn.MultiheadAttention's input projections: packed (shared by softmax and linear attention), or, when
keys and values come from memories of other widths (``kdim``, ``vdim``), three separate weights."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["packed_in_proj", "reset_packed_in_proj", "separate_in_proj"]


def packed_in_proj(
    rows: int, d_model: int, bias: bool, device=None, dtype=None
) -> tuple[nn.Parameter, nn.Parameter | None]:
    """torch.nn.MultiheadAttention's packed input projection, uninitialized (:func:`reset_packed_in_proj`):
    ``in_proj_weight`` (rows, d) stacking [W_q; W_k; W_v] as ``F.linear`` weights, ``in_proj_bias`` (rows,)
    or None."""
    weight = nn.Parameter(torch.empty(rows, d_model, device=device, dtype=dtype))
    return weight, nn.Parameter(torch.empty(rows, device=device, dtype=dtype)) if bias else None


def reset_packed_in_proj(weight: Tensor, bias: Tensor | None) -> None:
    """torch's initialization of the packed projection: Xavier-uniform over the whole (rows, d), zero bias."""
    nn.init.xavier_uniform_(weight)
    if bias is not None:
        nn.init.zeros_(bias)


def separate_in_proj(
    rows: tuple[int, int, int], widths: tuple[int, int, int], device=None, dtype=None
) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
    """torch.nn.MultiheadAttention's ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` for keys and values
    of other widths than the queries: (rows[i], widths[i]) each, uninitialized (each is Xavier-uniform in torch)."""
    kw = {"device": device, "dtype": dtype}
    weights = [nn.Parameter(torch.empty(r, w, **kw)) for r, w in zip(rows, widths, strict=True)]
    return weights[0], weights[1], weights[2]
