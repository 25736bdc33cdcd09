r"""Softmax attention: scaled dot-product (Vaswani et al. 2017, arXiv 1706.03762) and multi-head with
grouped-query heads (Ainslie et al. 2023, arXiv 2305.13245), a KV cache and sliding windows. Linear attention
lives in ``seqlab.layers.linear_attention``, the Bahdanau and Luong scores of the RNN encoder–decoders in
``seqlab.layers.rnn_attention``.

Notation: ``b`` batch, ``t`` time, ``t_q`` queries, ``t_k`` keys, ``d`` model width, ``h`` query heads,
``g`` key/value heads (``h`` a multiple of ``g``), ``k`` head dim.

    Attention(Q, K, V) = softmax(Q Kᵀ / √k + M) V                       (Vaswani eq. 1)
    M[i, j] = 0 where mask[i, j] is True (may attend), -inf where False
    head_i = Attention(Q W_i^Q, K W_{g(i)}^K, V W_{g(i)}^V),  g(i) = i // (h / g)   (grouped-query)
    MultiHead(Q, K, V) = [head_1; ...; head_h] W^O

Masks are boolean with SDPA's polarity, True = may attend (see ``seqlab.layers.masks``). A query row with
nothing to attend to yields a zero output and zero (finite) gradients, where the softmax alone would give
0/0 = NaN (torch.nn.MultiheadAttention returns NaN there, pytorch issue 41508).

Two paths with one signature: :func:`scaled_dot_product_attention` hands the work to
``torch.nn.functional.scaled_dot_product_attention`` (fused kernels: flash on CPU and GPU, memory-efficient,
cuDNN), and :func:`scaled_dot_product_attention_ref` writes the equation out and can return the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.masks import causal_mask, combine_masks, sliding_window_mask
from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.layers.positional import RotaryEmbedding

__all__ = [
    "KVBuffer",
    "KVCache",
    "MultiheadAttention",
    "SelfAttention",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_ref",
]

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
    """Validate shapes; fold ``is_causal`` into ``mask`` unless SDPA can take it as is (t_q == t_k, no mask)."""
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
    if is_causal and (mask is not None or t_q != t_k):
        return combine_masks(mask, causal_mask(t_q, t_k, device=q.device)), False
    return mask, is_causal


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


# ----------------------------------------------------------------------------------------------------------
# Multi-head attention


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
            and self.filled + t <= self.k.size(2)
        )


def _append_kv(state: KVCache, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, KVBuffer | None]:
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


class KVCache(NamedTuple):
    """The state of causal self-attention: the keys (after RoPE) and values of the positions seen so far.

    k, v: (b, g, t_c, k). pos: 0-d int64 tensor, the absolute position of the next token (the number of tokens
    seen); larger than t_c once a sliding window has trimmed the cache to its last ``window - 1`` entries.
    buffer: the preallocated :class:`KVBuffer` that k and v are views of during inference, or None.
    For cross-attention the "cache" holds the projected memory and ``pos`` its length.
    """

    k: Tensor
    v: Tensor
    pos: Tensor
    buffer: KVBuffer | None = None


class MultiheadAttention(nn.Module):
    r"""Multi-head attention with grouped-query heads, a KV cache, causal and sliding-window masks and RoPE.

        q = x W_q + b_q  (b, h, t_q, k);   k, v = m W_k + b_k, m W_v + b_v  (b, g, t_k, k);   m = x or memory
        q, k = RoPE(q, p), RoPE(k, p)           (self-attention only, when ``rope`` is given)
        out  = [softmax(q kᵀ / √k + M) v over each head] W_o + b_o            (b, t_q, d)

    Args:
        d_model: width ``d`` of queries, keys and values (inputs and output).
        n_heads: query heads ``h``. n_kv_heads: key/value heads ``g`` (None: h; 1: multi-query attention).
        head_dim: ``k``; None means d_model // n_heads.
        bias: biases on the input and output projections.
        dropout: dropout on the attention weights (training only).
        causal: each query sees only keys at or before its position (self-attention).
        window: with ``causal``, each query sees only the last ``window`` positions, itself included; the KV
            cache keeps only the last ``window - 1`` entries. Without ``causal``, a band ``|i - j| < window``.
        rope: a :class:`RotaryEmbedding` applied to q and k of self-attention at their absolute positions.
        scale: the score scale; None means 1 / √k.

    Parameters use torch.nn.MultiheadAttention's names and layout: ``in_proj_weight`` ((h + 2g)·k, d) stacks
    [W_q; W_k; W_v] (rows, as ``F.linear`` weights), ``in_proj_bias`` likewise, ``out_proj`` a Linear (d, h·k).
    With g = h and head_dim = d / h, ``load_state_dict(torch_mha.state_dict())`` just works. Initialization is
    torch's too: Xavier-uniform over the packed ``in_proj_weight``, zero biases.

    Call ``mha(query, key=None, value=None, mask=None, state=None, need_weights=False)``:
        query (b, t_q, d); key/value (b, t_k, d) for cross-attention (value defaults to key), None for self.
        mask: boolean, True = may attend, broadcastable to (b, h, t_q, t_k); with a KV cache t_k counts the
            cached keys too (``state.k.size(2) + t_q``). Combined (AND) with the causal/window structure.
        state: a :class:`KVCache` to continue from (self-attention), or, for cross-attention, the cache of the
            already projected memory (then ``key`` is not projected again).
    Returns ``(out (b, t_q, d), state)``, with ``need_weights`` ``(out, state, weights (b, h, t_q, t_k))``.
    The weights are recomputed by the explicit path (:func:`scaled_dot_product_attention_ref`, before dropout)
    while the output still comes from the fused kernel; torch.nn.MultiheadAttention's default weights are
    their mean over heads, ``weights.mean(1)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        causal: bool = False,
        window: int | None = None,
        rope: RotaryEmbedding | None = None,
        scale: float | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(
                    f"d_model={d_model} must be divisible by n_heads={n_heads}, or give head_dim"
                )
            head_dim = d_model // n_heads
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        if window is not None and window < 1:
            raise ValueError(f"window must be a positive number of positions or None, got {window}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if rope is not None and rope.head_dim != head_dim:
            raise ValueError(f"rope.head_dim={rope.head_dim} differs from the attention head_dim={head_dim}")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.dropout, self.causal, self.window, self.scale = dropout, causal, window, scale
        self.rope = rope
        rows = (n_heads + 2 * n_kv_heads) * head_dim
        self.in_proj_weight = nn.Parameter(torch.empty(rows, d_model, **kw))
        self.in_proj_bias = nn.Parameter(torch.empty(rows, **kw)) if bias else None
        self.out_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias, **kw)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
        self.out_proj.reset_parameters()
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def _split_sizes(self) -> list[int]:
        return [
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        ]

    def init_state(self, batch_size: int, device=None, dtype=None) -> KVCache:
        """An empty KV cache: k, v (b, g, 0, k), pos 0."""
        w = self.in_proj_weight
        device, dtype = device or w.device, dtype or w.dtype
        empty = torch.zeros(batch_size, self.n_kv_heads, 0, self.head_dim, device=device, dtype=dtype)
        return KVCache(empty, empty.clone(), torch.zeros((), dtype=torch.long, device=device))

    def _project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        _, w_k, w_v = self.in_proj_weight.split(self._split_sizes())
        b_k = b_v = None
        if self.in_proj_bias is not None:
            _, b_k, b_v = self.in_proj_bias.split(self._split_sizes())
        b, t_k, g, kd = key.size(0), key.size(1), self.n_kv_heads, self.head_dim
        k = F.linear(key, w_k, b_k).view(b, t_k, g, kd).transpose(1, 2)  # (b, t_k, d) -> (b, g, t_k, k)
        v = F.linear(value, w_v, b_v).view(b, t_k, g, kd).transpose(1, 2)  # (b, t_k, d) -> (b, g, t_k, k)
        return k, v

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        state: KVCache | None = None,
        need_weights: bool = False,
    ):
        if query.dim() != 3 or query.size(-1) != self.d_model:
            raise ValueError(f"expected query of shape (b, t, {self.d_model}), got {tuple(query.shape)}")
        b, t_q, _ = query.shape
        h, g, kd = self.n_heads, self.n_kv_heads, self.head_dim
        is_causal, structure = False, None
        if key is None:  # self-attention
            if value is not None:
                raise ValueError("value without key: pass key too for cross-attention, or neither for self")
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (b, t, d) -> (b, t, (h + 2g) k)
            q, k, v = qkv.split(self._split_sizes(), dim=-1)
            q = q.view(b, t_q, h, kd).transpose(1, 2)  # (b, h, t, k)
            k = k.view(b, t_q, g, kd).transpose(1, 2)  # (b, g, t, k)
            v = v.view(b, t_q, g, kd).transpose(1, 2)  # (b, g, t, k)
            pos = state.pos if state is not None else torch.zeros((), dtype=torch.long, device=query.device)
            if self.rope is not None:
                q, k = self.rope(q, offset=pos), self.rope(k, offset=pos)  # positions pos ... pos + t - 1
            buffer = None
            if state is not None:
                k, v, buffer = _append_kv(state, k, v)  # (b, g, t_c + t, k) each
            t_k = k.size(2)
            if self.window is not None:
                structure = sliding_window_mask(
                    t_q, t_k, self.window, causal=self.causal, device=query.device
                )
            elif self.causal and t_q > 1:  # (one query at the end of the keys sees them all: no mask)
                if t_q == t_k and mask is None:
                    is_causal = True  # SDPA's own causal path: no mask to build or read
                else:
                    structure = causal_mask(t_q, t_k, device=query.device)
            keep = t_k if self.window is None or not self.causal else self.window - 1
            if keep >= t_k:
                new_state = KVCache(k, v, pos + t_q, buffer)
            else:  # the sliding window drops the oldest positions (and leaves the buffer)
                new_state = KVCache(k[:, :, t_k - keep :], v[:, :, t_k - keep :], pos + t_q)
        else:  # cross-attention
            w_q, *_ = self.in_proj_weight.split(self._split_sizes())
            b_q = None if self.in_proj_bias is None else self.in_proj_bias[: h * kd]
            q = F.linear(query, w_q, b_q).view(b, t_q, h, kd).transpose(1, 2)  # (b, t_q, d) -> (b, h, t_q, k)
            if state is None:
                k, v = self._project_kv(key, key if value is None else value)  # (b, g, t_k, k) each
                state = KVCache(k, v, torch.tensor(k.size(2), device=query.device))
            k, v = state.k, state.v
            new_state = state
        drop = self.dropout if self.training else 0.0
        m = combine_masks(mask, structure)
        out = scaled_dot_product_attention(q, k, v, m, drop, is_causal, self.scale)  # (b, h, t_q, k)
        y = self.out_proj(out.transpose(1, 2).reshape(b, t_q, h * kd))  # (b, t_q, h k) -> (b, t_q, d)
        if not need_weights:
            return y, new_state
        _, w = scaled_dot_product_attention_ref(q, k, v, m, 0.0, is_causal, self.scale, return_weights=True)
        return y, new_state, w

    def step(self, x_t: Tensor, state: KVCache | None = None) -> tuple[Tensor, KVCache]:
        """One position of self-attention: x_t (b, d) -> y_t (b, d), with the cache grown by one."""
        state = self.init_state(x_t.size(0)) if state is None else state
        y, state = self.forward(x_t.unsqueeze(1), state=state)  # (b, 1, d)
        return y.squeeze(1), state

    def extra_repr(self) -> str:
        s = f"{self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}"
        s += f", bias={self.in_proj_bias is not None}, dropout={self.dropout}, causal={self.causal}"
        return s + (f", window={self.window}" if self.window is not None else "")


class SelfAttention(MultiheadAttention):
    """MultiheadAttention speaking the token-mixer interface: ``y, state = attn(x, state=None, mask=None)``.

    The same parameters (and state_dict) as :class:`MultiheadAttention`; only the call signature differs, so
    that it can sit wherever a recurrent or state-space mixer sits.
    """

    def forward(
        self, x: Tensor, state: KVCache | None = None, mask: Tensor | None = None, need_weights: bool = False
    ):
        return super().forward(x, mask=mask, state=state, need_weights=need_weights)


@dataclass
class AttentionMixerConfig:
    n_heads: int = 4
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None means n_heads, 1 multi-query."""
    head_dim: int | None = None
    """Per-head width; None means d_model // n_heads."""
    bias: bool = False
    """Biases on the q, k, v and output projections (GPT-2: yes; Llama: no)."""
    window: int | None = None
    """Sliding-window size (each position sees itself and the window - 1 before); None: all."""
    rope: bool = True
    """Rotary positions inside attention (Su et al. 2021); False for a model with learned positions."""
    rope_base: float = 10000.0
    """RoPE's base θ: 10000 as in the paper and Llama 2, 500000 in Llama 3."""


def _build_attention(d_model: int, c: AttentionMixerConfig, *, dropout: float, device=None, dtype=None):
    k = c.head_dim if c.head_dim is not None else d_model // max(c.n_heads, 1)
    rope = RotaryEmbedding(k, base=c.rope_base, device=device) if c.rope else None
    return SelfAttention(
        d_model,
        c.n_heads,
        c.n_kv_heads,
        head_dim=c.head_dim,
        bias=c.bias,
        dropout=dropout,
        causal=True,
        window=c.window,
        rope=rope,
        device=device,
        dtype=dtype,
    )


register_mixer(
    MixerSpec(
        name="attention",
        config=AttentionMixerConfig,
        build=_build_attention,
        family="Transformer",
        summary="causal softmax attention with RoPE, GQA, sliding window and a KV cache (Vaswani et al. 2017)",
        step_cost=1.5,
        width_multiple=lambda c: 2 * c.n_heads,  # heads whose width RoPE needs even
    )
)
