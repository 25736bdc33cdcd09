"""The state of causal self-attention: a KV cache, and the preallocated buffer that decoding writes into.

Notation: ``b`` batch, ``g`` key/value heads, ``t_c`` cached positions, ``k`` head dim.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["KVBuffer", "KVCache", "append_kv"]


class KVBuffer:
    """Preallocated storage behind a growing KV cache: k, v (b, g, capacity, k), of which ``filled`` are written.

    Appending a token to a cache whose keys end where the buffer's written part ends writes into the next
    free slots in place, instead of concatenating (which copies the whole cache and, for caches of more than
    a few hundred kB, allocates fresh pages on every token). The capacity doubles when it runs out, so the
    copying is O(1) amortized per token and the buffer holds at most twice the cache. Copy-on-write keeps
    states immutable from the outside: appending to an *older* state of the same buffer (a second
    continuation of one prefix) copies into a new buffer and leaves the first continuation untouched.
    """

    __slots__ = ("filled", "k", "v")

    def __init__(self, k: Tensor, v: Tensor, filled: int):
        self.k, self.v, self.filled = k, v, filled

    def can_append(self, cache_k: Tensor, t: int) -> bool:
        return (
            cache_k.size(2) == self.filled  # the cache is the newest state of this buffer
            and cache_k.data_ptr() == self.k.data_ptr()  # ... and a prefix view of it
            and cache_k.shape[:2] == self.k.shape[:2]  # ... of the whole batch, not a slice of it
            and self.filled + t <= self.k.size(2)
        )


class KVCache(NamedTuple):
    """The state of causal self-attention: the keys (after RoPE) and values of the positions seen so far.

    k, v: (b, g, t_c, k). pos: 0-d int64 tensor, the absolute position of the next token (the number of tokens
    seen); larger than t_c once a sliding window has trimmed the cache to its last ``window - 1`` entries.
    buffer: the preallocated :class:`KVBuffer` that k and v are views of during inference, or None.
    For cross-attention the "cache" holds the projected memory and ``pos`` its length.

    After a forward with a padding mask the cache holds all t positions of every row, padded ones too, and
    ``pos`` counts all of them: the padding law holds for k and v at each row's real positions, which equal
    those of the row run alone. Continuing from it would let later tokens see the padded keys and give short
    rows the wrong positions, so such a cache is marked ``padded`` and refused as a state to continue from:
    decode from a cache built without padding (each row alone, or rows of one length).
    """

    k: Tensor
    v: Tensor
    pos: Tensor
    buffer: KVBuffer | None = None
    padded: bool = False


def append_kv(state: KVCache, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, KVBuffer | None]:
    """The cached keys/values followed by the new ones, (b, g, t_c + t, k) each, and the buffer they live in.

    With gradients flowing (chunked training with a carried state) it is a plain concatenation; in inference
    the result is a prefix view of a :class:`KVBuffer` that later appends fill in place.
    """
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or state.k.requires_grad):
        return torch.cat([state.k, k], dim=2), torch.cat([state.v, v], dim=2), None
    t_c, t = state.k.size(2), k.size(2)
    buf = state.buffer
    if buf is None or not buf.can_append(state.k, t):
        b, g, _, kd = k.shape
        cap = max(2 * (t_c + t), 64)  # doubling: O(1) amortized copies per token
        kb = k.new_empty(b, g, cap, kd)  # (b, g, capacity, k)
        vb = v.new_empty(b, g, cap, v.size(-1))
        kb[:, :, :t_c], vb[:, :, :t_c] = state.k, state.v
        buf = KVBuffer(kb, vb, t_c)
    buf.k[:, :, t_c : t_c + t], buf.v[:, :, t_c : t_c + t] = k, v  # write the new positions in place
    buf.filled = t_c + t
    return buf.k[:, :, : t_c + t], buf.v[:, :, : t_c + t], buf
