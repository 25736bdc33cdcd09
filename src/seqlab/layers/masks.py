"""Attention masks, in one polarity: boolean, ``True`` means "this query may attend to this key".

That is the polarity of ``torch.nn.functional.scaled_dot_product_attention``. ``torch.nn.MultiheadAttention``
and ``torch.nn.Transformer*`` use the opposite one for boolean masks (``True`` = *not* allowed, and
``key_padding_mask`` ``True`` = padding); convert at that boundary only, with :func:`from_torch_mask`.

Notation: ``b`` batch, ``h`` heads, ``t_q`` queries, ``t_k`` keys. Every mask here is a boolean tensor
broadcastable to ``(b, h, t_q, t_k)``:

* :func:`causal_mask` ``(t_q, t_k)``: query ``i`` may see key ``j`` iff ``j <= i + (t_k - t_q)``. The queries are
  aligned to the *end* of the keys (bottom-right), which is what decoding with a KV cache needs: the ``t_q`` new
  queries are the last ``t_q`` positions of the ``t_k`` keys. (``torch``'s ``is_causal`` aligns top-left; the
  two agree when ``t_q == t_k``.)
* :func:`sliding_window_mask` ``(t_q, t_k)``: the causal mask restricted to the last ``window`` keys
  (Longformer/Mistral-style local attention), or a symmetric band when ``causal=False``.
* :func:`padding_mask` ``(b, t)`` from lengths, :func:`key_padding_mask` ``(b, 1, 1, t_k)`` for keys.
* :func:`check_padding_mask`: the token mixers' ``mask`` argument, (b, t), True at real positions, padding
  on the right; validated once, with an error that says what was expected.
* :func:`combine_masks`: logical AND of any number of masks (``None`` means "no restriction").

A query row whose mask is all ``False`` has nothing to attend to; seqlab's attention returns zeros for it.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "causal_mask",
    "check_lengths",
    "check_padding_mask",
    "combine_masks",
    "from_torch_mask",
    "key_padding_mask",
    "mask_lengths",
    "padding_mask",
    "sliding_window_mask",
]


def _band(t_q: int, t_k: int, lo: int | None, hi: int | None, device=None) -> Tensor:
    """True where ``lo <= (j - i - (t_k - t_q)) <= hi``: a band around the bottom-right-aligned diagonal."""
    for name, n in (("t_q", t_q), ("t_k", t_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be an integer >= 0 (a number of positions), got {n!r}")
    i = torch.arange(t_q, device=device).unsqueeze(1) + (
        t_k - t_q
    )  # (t_q, 1): the query's position among keys
    j = torch.arange(t_k, device=device).unsqueeze(0)  # (1, t_k)
    rel = j - i  # (t_q, t_k): key position relative to the query, 0 on the diagonal
    m = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    if lo is not None:
        m &= rel >= lo
    if hi is not None:
        m &= rel <= hi
    return m


def causal_mask(t_q: int, t_k: int | None = None, device=None) -> Tensor:
    """(t_q, t_k) boolean, True where key ``j`` is not in the future of query ``i`` (bottom-right aligned).

    >>> causal_mask(2, 3).int().tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    return _band(t_q, t_q if t_k is None else t_k, None, 0, device)


def sliding_window_mask(
    t_q: int, t_k: int | None = None, window: int = 1, causal: bool = True, device=None
) -> Tensor:
    """(t_q, t_k) boolean local-attention mask; positions as in :func:`causal_mask`.

    causal=True: query at position p sees keys p - window + 1 ... p (itself and the window - 1 before it).
    causal=False: query at p sees keys with |p - j| < window.
    """
    if window < 1:
        raise ValueError(f"window must be a positive number of positions, got {window}")
    t_k = t_q if t_k is None else t_k
    return _band(t_q, t_k, -(window - 1), 0 if causal else window - 1, device)


def padding_mask(lengths: Tensor | list[int], max_len: int | None = None, device=None) -> Tensor:
    """(b, t) boolean, True at real positions ``t < lengths[b]`` and False at the (right) padding."""
    lengths = torch.as_tensor(lengths, device=device)
    if not lengths.numel() and lengths.is_floating_point():  # torch.as_tensor([]) is float32
        lengths = lengths.long()
    if (
        lengths.dim() != 1
        or lengths.dtype == torch.bool
        or lengths.is_floating_point()
        or lengths.is_complex()
    ):
        raise ValueError(
            f"lengths must be integers of shape (b,), got {lengths.dtype} of shape {tuple(lengths.shape)}"
        )
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0):
        raise ValueError(f"max_len must be an integer >= 0 or None, got {max_len!r}")
    if max_len is None and not lengths.numel():
        raise ValueError("padding_mask of no lengths needs max_len (the t of the (0, t) mask)")
    if lengths.numel():
        low, high = (int(x) for x in lengths.aminmax())
        if low < 0 or (max_len is not None and high > max_len):
            bound = "be >= 0" if max_len is None else f"lie in [0, max_len={max_len}]"
            raise ValueError(f"lengths must {bound}, got values from {low} to {high}")
    t = int(lengths.max()) if max_len is None else max_len
    return torch.arange(t, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)  # (b, t)


def check_padding_mask(mask: Tensor, b: int, t: int, device=None) -> Tensor | None:
    """Validate a token mixer's padding mask and return it on ``device``, or None when no position is padding.

    The mask is (b, t) boolean, True at real positions, padding on the right: every row is a run of True then
    a run of False. A ValueError says what was expected and what came. Costs one host sync.
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (b, t):
        got = (
            f"{mask.dtype} of shape {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        )
        raise ValueError(
            f"mask must be a boolean tensor of shape (b, t) = {(b, t)}, True at real positions; got {got}"
        )
    mask = mask.to(device) if device is not None else mask
    starts_again = mask[:, 1:] & ~mask[:, :-1]  # (b, t - 1): a real position right after padding
    left_padded, all_real = torch.stack([starts_again.any(), mask.all()]).tolist()
    if left_padded:
        row, pos = (int(i) for i in starts_again.nonzero()[0])
        raise ValueError(
            "mask must be right-padded (each row True at its real positions, then False), but row "
            f"{row} has a real position at {pos + 1} after padding; move the padding to the end"
        )
    return None if all_real else mask


def key_padding_mask(mask_or_lengths: Tensor | list[int], max_len: int | None = None) -> Tensor:
    """A (b, t_k) boolean "is a real token" mask (or lengths (b,)) as (b, 1, 1, t_k), ready to combine."""
    m = mask_or_lengths
    if isinstance(m, Tensor) and m.dim() == 2 and m.dtype != torch.bool:  # read as lengths, it would say 1-D
        raise ValueError(
            f"a padding mask must be boolean (b, t_k), True at real tokens; got {m.dtype} {tuple(m.shape)}"
        )
    if not isinstance(m, Tensor) or m.dtype != torch.bool:
        m = padding_mask(m, max_len)
    if m.dim() != 2:
        raise ValueError(f"expected a (b, t_k) boolean mask or (b,) lengths, got shape {tuple(m.shape)}")
    return m[:, None, None, :]  # (b, 1, 1, t_k)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks with broadcasting; ``None`` entries are skipped; all None gives None."""
    out = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise TypeError(
                f"masks must be boolean (True = may attend), got {m.dtype}; from_torch_mask converts "
                "torch.nn's masks (boolean True = not allowed, or additive -inf)"
            )
        out = m if out is None else out & m
    return out


def from_torch_mask(attn_mask: Tensor | None = None, key_padding_mask: Tensor | None = None) -> Tensor | None:
    """torch.nn.MultiheadAttention's masks -> one seqlab mask (True = may attend), broadcastable to (b, h, t_q, t_k).

    attn_mask: (t_q, t_k) or (b * h, t_q, t_k); boolean True = NOT allowed, or float additive (-inf = not
        allowed; other finite values are not representable as a boolean and are rejected).
    key_padding_mask: (b, t_k); boolean True = padding, or float additive.
    A (b * h, t_q, t_k) attn_mask comes back as (b * h, t_q, t_k): reshape it with ``.view(b, h, t_q, t_k)``.
    """

    def allowed(m: Tensor) -> Tensor:
        if m.dtype == torch.bool:
            return ~m
        if not bool(((m == 0) | (m == float("-inf"))).all()):
            raise ValueError(
                "an additive float mask with values other than 0 and -inf has no boolean equivalent"
            )
        return m == 0

    attn = None if attn_mask is None else allowed(attn_mask)
    keys = None if key_padding_mask is None else allowed(key_padding_mask)[:, None, None, :]  # (b, 1, 1, t_k)
    return combine_masks(attn, keys)


def check_lengths(lengths: Tensor | list[int], b: int, t: int) -> Tensor | None:
    """A recurrent layer's ``lengths`` (b,): integers in [1, t]; None for an empty batch."""
    lengths = torch.as_tensor(lengths)
    integral = not (lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool)
    if lengths.dim() != 1 or lengths.numel() != b or not integral:
        raise ValueError(
            f"lengths must be an integer tensor of shape (b,) = ({b},), got "
            f"{lengths.dtype} of shape {tuple(lengths.shape)}"
        )
    if b == 0:
        return None  # an empty batch has nothing to mask
    lo, hi = int(lengths.min()), int(lengths.max())
    if lo < 1:
        raise ValueError(f"every length must be at least 1, got a length of {lo}")
    if hi > t:
        raise ValueError(f"lengths cannot exceed the sequence length t={t}, got a length of {hi}")
    return lengths


def mask_lengths(mask: Tensor, b: int, t: int, unbatched: bool) -> Tensor | None:
    """A recurrent layer's padding mask (b, t), or (t,) for an unbatched sequence, as lengths (b,); None if
    nothing is padded."""
    mask = mask.unsqueeze(0) if unbatched and isinstance(mask, Tensor) and mask.dim() == 1 else mask
    mask = check_padding_mask(mask, b, t)
    if mask is None:
        return None
    lengths = mask.sum(1)  # (b,): right padding, so the number of real positions is the length
    if not bool(lengths.all()):
        raise ValueError("every sequence needs at least one real position, got a mask row of all False")
    return lengths
