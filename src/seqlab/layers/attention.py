r"""Multi-head softmax attention (Vaswani et al. 2017, arXiv 1706.03762) with grouped-query heads (Ainslie et
al. 2023, arXiv 2305.13245), a KV cache, causal and sliding-window masks and RoPE; and :class:`SelfAttention`,
the same layer speaking the token-mixer interface. Scaled dot-product attention itself is in
``seqlab.layers.sdpa``, the KV cache in ``seqlab.layers.kv_cache`` (both re-exported here); linear attention
in ``seqlab.layers.linear_attention``, the Bahdanau and Luong scores of the RNN encoder–decoders in
``seqlab.layers.rnn_attention``.

Notation: ``b`` batch, ``t`` time, ``t_q`` queries, ``t_k`` keys, ``d`` model width, ``h`` query heads,
``g`` key/value heads (``h`` a multiple of ``g``), ``k`` head dim.

    head_i = Attention(Q W_i^Q, K W_{g(i)}^K, V W_{g(i)}^V),  g(i) = i // (h / g)   (grouped-query)
    MultiHead(Q, K, V) = [head_1; ...; head_h] W^O

Masks. :class:`MultiheadAttention` takes any boolean attention mask broadcastable to (b, h, t_q, t_k), True =
may attend (``seqlab.layers.masks``). :class:`SelfAttention`, as a token mixer, takes ``mask`` (b, t): True at
real positions, padding on the right; padded inputs are zeroed and padded keys never attended to, so the
outputs at the real positions equal those of each sequence run alone, whatever fills the padding (NaN
included). Its KV cache still holds all t positions (see :class:`KVCache` for what that means).

Two paths (``seqlab.layers.fastpath``): ``forward`` computes attention with the fused kernels of
:func:`scaled_dot_product_attention`, ``forward_ref`` (and ``fast_path=False``) with the written-out
:func:`scaled_dot_product_attention_ref`; ``why_not_fast_path`` says which one ``forward`` takes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seqlab.kernels import attention as attention_kernel
from seqlab.kernels.extension import matmul_dtype
from seqlab.layers.checks import (
    check_attention_call,
    check_batch_size,
    check_causal_step,
    check_input,
    check_user_mask,
)
from seqlab.layers.fastpath import FastPathMixin
from seqlab.layers.kv_cache import KVBuffer, KVCache, append_kv
from seqlab.layers.linear import Linear, linear
from seqlab.layers.masks import causal_mask, check_padding_mask, combine_masks, sliding_window_mask
from seqlab.layers.packed_proj import packed_in_proj, reset_packed_in_proj, separate_in_proj
from seqlab.layers.positional import RotaryEmbedding
from seqlab.layers.sdpa import scaled_dot_product_attention, scaled_dot_product_attention_ref
from seqlab.validation import check_divisible, check_dropout, check_positive_floats, check_positive_ints

__all__ = [
    "KVBuffer",
    "KVCache",
    "MultiheadAttention",
    "SelfAttention",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_ref",
]


class MultiheadAttention(FastPathMixin, nn.Module):
    r"""Multi-head attention with grouped-query heads, a KV cache, causal and sliding-window masks and RoPE.

        q = x W_q + b_q  (b, h, t_q, k);   k, v = m W_k + b_k, m W_v + b_v  (b, g, t_k, k);   m = x or memory
        q, k = RoPE(q, p), RoPE(k, p)           (self-attention only, when ``rope`` is given)
        out  = [softmax(q kᵀ / √k + M) v over each head] W_o + b_o            (b, t_q, d)

    Args:
        d_model: width ``d`` of queries, keys and values (inputs and output).
        kdim, vdim: cross-attention's key and value widths when not ``d`` (torch.nn's): then ``q_proj_weight``
            (h·k, d), ``k_proj_weight`` (g·k, kdim), ``v_proj_weight`` (g·k, vdim), and no self-attention.
        n_heads: query heads ``h``. n_kv_heads: key/value heads ``g`` (None: h; 1: multi-query attention).
        head_dim: ``k``; None means d_model // n_heads.
        bias: biases on the input and output projections.
        dropout: dropout on the attention weights (training only).
        causal: each query sees only keys at or before its position (self-attention).
        window: with ``causal``, each query sees only the last ``window`` positions, itself included; the KV
            cache keeps only the last ``window - 1`` entries. Without ``causal``, a band ``|i - j| < window``.
        rope: a :class:`RotaryEmbedding` applied to q and k of self-attention at their absolute positions.
        scale: the score scale; None means 1 / √k.
        fast_path: False makes ``forward`` use :func:`scaled_dot_product_attention_ref` (``forward_ref`` always
            does); the fused kernels are the default.

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

    Examples::

        >>> mha = MultiheadAttention(16, n_heads=4, causal=True)
        >>> y, cache = mha(torch.randn(2, 5, 16))
        >>> y.shape, cache.k.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 4, 5, 4]))
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
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        fast_path: bool = True,
    ):
        super().__init__()
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.dropout, self.window, self.scale, self.kdim, self.vdim = dropout, window, scale, kdim, vdim
        check_positive_ints(self, ("d_model", "n_heads"), prefix="MultiheadAttention: ")
        check_positive_ints(self, ("kdim", "vdim"), "MultiheadAttention: ", allow_none=True)
        self.kdim, self.vdim = kdim or d_model, vdim or d_model
        self._qkv_same_embed_dim = self.kdim == d_model and self.vdim == d_model  # torch.nn's attribute
        check_positive_ints(
            self, ("n_kv_heads", "head_dim", "window"), "MultiheadAttention: ", allow_none=True
        )
        check_positive_floats(self, ("scale",), prefix="MultiheadAttention: ", allow_none=True)
        check_dropout(self, prefix="MultiheadAttention: ")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None:
            check_divisible(d_model, n_heads, ", or give head_dim")
            head_dim = d_model // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        if rope is not None and rope.head_dim != head_dim:
            raise ValueError(f"rope.head_dim={rope.head_dim} differs from the attention head_dim={head_dim}")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.dropout, self.causal, self.window, self.scale = dropout, causal, window, scale
        self.rope, self.fast_path = rope, fast_path
        weight, in_bias = packed_in_proj((n_heads + 2 * n_kv_heads) * head_dim, d_model, bias, **kw)
        if not self._qkv_same_embed_dim:  # torch.nn's layout for other widths: three weights, one packed bias
            weights = separate_in_proj(self._split_sizes(), (d_model, self.kdim, self.vdim), **kw)
            self.q_proj_weight, self.k_proj_weight, self.v_proj_weight = weights
        self.register_parameter("in_proj_weight", weight if self._qkv_same_embed_dim else None)  # as torch's
        self.in_proj_bias = in_bias  # torch.nn's order: the weights, in_proj_bias, out_proj
        self.out_proj = Linear(n_heads * head_dim, d_model, bias=bias, **kw)
        self.reset_parameters()

    def projection_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """W_q, W_k, W_v as ``F.linear`` weights: views of the packed ``in_proj_weight``, or the three own."""
        if self.in_proj_weight is not None:
            return self.in_proj_weight.split(self._split_sizes())
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight

    def reset_parameters(self) -> None:
        """torch's initialization: Xavier-uniform over the packed weight (or each of the three), zero biases."""
        weights = self.projection_weights() if self.in_proj_weight is None else (self.in_proj_weight,)
        for w in weights:
            reset_packed_in_proj(w, self.in_proj_bias)
        self.out_proj.reset_parameters()
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def _split_sizes(self) -> list[int]:
        return [
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        ]

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> KVCache:
        """An empty KV cache: k, v (b, g, 0, k), pos 0; ``device`` and ``dtype`` default to the parameters'."""
        check_batch_size(type(self).__name__, batch_size)
        w = self.out_proj.weight
        device, dtype = device or w.device, dtype or w.dtype
        empty = torch.zeros(batch_size, self.n_kv_heads, 0, self.head_dim, device=device, dtype=dtype)
        return KVCache(empty, empty.clone(), torch.zeros((), dtype=torch.long, device=device))

    def _project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        _, w_k, w_v = self.projection_weights()
        b_k = b_v = None
        if self.in_proj_bias is not None:
            _, b_k, b_v = self.in_proj_bias.split(self._split_sizes())
        b, t_k, g, kd = key.size(0), key.size(1), self.n_kv_heads, self.head_dim
        k = linear(key, w_k, b_k).view(b, t_k, g, kd).transpose(1, 2)  # (b, t_k, d) -> (b, g, t_k, k)
        v = linear(value, w_v, b_v).view(b, t_k, g, kd).transpose(1, 2)  # (b, t_k, d) -> (b, g, t_k, k)
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
        return self._attend(query, key, value, mask, state, need_weights, self._take_fast_path(query))

    def forward_ref(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        state: KVCache | None = None,
        need_weights: bool = False,
    ):
        """``forward`` through :func:`scaled_dot_product_attention_ref`, whatever ``fast_path`` says."""
        return self._attend(query, key, value, mask, state, need_weights, False)

    def _attend(self, query, key, value, mask, state, need_weights: bool, fast: bool):
        check_attention_call(self, query, key, value, mask, state)
        b, t_q, _ = query.shape
        plain = key is None and value is None and mask is None and state is None and not need_weights
        if fast and plain and self._why_not_packed(query) is None:
            return self._packed_self_attention(query)
        if key is None:  # self-attention
            if value is not None:
                raise ValueError("value without key: pass key too for cross-attention, or neither for self")
            q, k, v, new_state = self._self_qkv(query, state)
            structure, is_causal = self._structure(t_q, k.size(2), query.device)
        else:
            q, k, v, new_state = self._cross_qkv(query, key, value, state)
            structure, is_causal = None, False
        check_user_mask(mask, (b, self.n_heads, t_q, k.size(2)), k.size(2) - t_q if key is None else 0)
        m = combine_masks(mask, structure)
        drop = self.dropout if self.training else 0.0
        sdpa = scaled_dot_product_attention if fast else scaled_dot_product_attention_ref
        out = sdpa(q, k, v, m, drop, is_causal, self.scale)  # (b, h, t_q, k)
        y = self.out_proj(out.transpose(1, 2).reshape(b, t_q, self.n_heads * self.head_dim))  # (b, t_q, h k)
        if not need_weights:
            return y, new_state
        _, w = scaled_dot_product_attention_ref(q, k, v, m, 0.0, is_causal, self.scale, return_weights=True)
        return y, new_state, w

    def _why_not_packed(self, x: Tensor) -> str | None:
        """None when self-attention over x (no cache, mask or weights asked) runs seqlab's CPU kernel straight
        from the packed [q | k | v] projection (:func:`seqlab.kernels.attention.attention_packed`)."""
        if self.rope is not None or self.window is not None:
            return "RoPE and sliding windows go through the general path"
        t = x.size(1)
        h, g, kd = self.n_heads, self.n_kv_heads, self.head_dim
        dtype = matmul_dtype(x)  # what the projection gives: under torch.autocast, its lower precision
        return attention_kernel.why_not_shapes(dtype, x.device, h, g, t, t, kd, self.causal, x.size(0))

    def _packed_self_attention(self, x: Tensor) -> tuple[Tensor, KVCache]:
        """Self-attention through the kernel, its gradient written straight into the projection's layout; the
        same outputs and cache as the general path."""
        b, t, _ = x.shape
        qkv = linear(x, self.in_proj_weight, self.in_proj_bias)  # (b, t, 3 h k)
        drop = self.dropout if self.training else 0.0
        out = attention_kernel.attention_packed(
            qkv, self.n_heads, self.causal, self.scale, drop
        )  # (b, t, h k)
        _, k, v = (y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2) for y in qkv.chunk(3, dim=-1))
        pos = torch.zeros((), dtype=torch.long, device=x.device)
        return self.out_proj(out), KVCache(k, v, pos + t)

    def _self_qkv(self, x: Tensor, state: KVCache | None) -> tuple[Tensor, Tensor, Tensor, KVCache]:
        """q (b, h, t, k); k, v (b, g, t_c + t, k) with the cache in front; the next cache."""
        b, t, _ = x.shape
        h, g, kd = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = linear(x, self.in_proj_weight, self.in_proj_bias)  # (b, t, d) -> (b, t, (h + 2g) k)
        q, k, v = qkv.split(self._split_sizes(), dim=-1)
        q = q.view(b, t, h, kd).transpose(1, 2)  # (b, h, t, k)
        k = k.view(b, t, g, kd).transpose(1, 2)  # (b, g, t, k)
        v = v.view(b, t, g, kd).transpose(1, 2)  # (b, g, t, k)
        pos = state.pos if state is not None else torch.zeros((), dtype=torch.long, device=x.device)
        if self.rope is not None:
            q, k = self.rope(q, offset=pos), self.rope(k, offset=pos)  # positions pos ... pos + t - 1
        buffer = None
        if state is not None:
            k, v, buffer = append_kv(state, k, v)  # (b, g, t_c + t, k) each
        t_k = k.size(2)
        keep = t_k if self.window is None or not self.causal else self.window - 1
        if keep >= t_k:
            return q, k, v, KVCache(k, v, pos + t, buffer)
        # the sliding window drops the oldest positions (and leaves the buffer)
        return q, k, v, KVCache(k[:, :, t_k - keep :], v[:, :, t_k - keep :], pos + t)

    def _cross_qkv(self, x, key, value, state) -> tuple[Tensor, Tensor, Tensor, KVCache]:
        """q (b, h, t_q, k) from x; k, v (b, g, t_k, k) from the memory, or from its cache when given."""
        b, t_q, _ = x.shape
        h, kd = self.n_heads, self.head_dim
        w_q, *_ = self.projection_weights()
        b_q = None if self.in_proj_bias is None else self.in_proj_bias[: h * kd]
        q = linear(x, w_q, b_q).view(b, t_q, h, kd).transpose(1, 2)  # (b, t_q, d) -> (b, h, t_q, k)
        if state is None:
            k, v = self._project_kv(key, key if value is None else value)  # (b, g, t_k, k) each
            state = KVCache(k, v, torch.tensor(k.size(2), device=x.device))
        return q, state.k, state.v, state

    def _structure(self, t_q: int, t_k: int, device) -> tuple[Tensor | None, bool]:
        """The causal or sliding-window mask of self-attention, or SDPA's own ``is_causal`` when it can serve
        (seqlab's SDPA folds it into a mask that comes with it, or keeps it beside a key padding mask)."""
        if self.window is not None:
            return sliding_window_mask(t_q, t_k, self.window, causal=self.causal, device=device), False
        if not self.causal or t_q == 1:  # one query at the end of the keys sees them all: no mask
            return None, False
        if t_q == t_k:
            return None, True  # SDPA's own causal path: no mask to build or read
        return causal_mask(t_q, t_k, device=device), False

    def step(self, x_t: Tensor, state: KVCache | None = None) -> tuple[Tensor, KVCache]:
        """One position of self-attention: x_t (b, d) -> y_t (b, d), with the cache grown by one."""
        check_causal_step(self)
        check_input(
            f"{type(self).__name__}.step", x_t, self.d_model, self.out_proj.weight, step=True, what="x_t"
        )
        state = self.init_state(x_t.size(0)) if state is None else state
        y, state = self.forward(x_t.unsqueeze(1), state=state)  # (b, 1, d)
        return y.squeeze(1), state

    def extra_repr(self) -> str:
        s = f"{self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}"
        s += f", bias={self.in_proj_bias is not None}, dropout={self.dropout}, causal={self.causal}"
        s += f", window={self.window}" if self.window is not None else ""
        s += "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return s + (", fast_path=False" if not self.fast_path else "")


class SelfAttention(MultiheadAttention):
    """MultiheadAttention speaking the token-mixer interface: ``y, state = attn(x, state=None, mask=None)``.

    The same parameters (and state_dict) as :class:`MultiheadAttention`; only the call differs, so that it can
    sit wherever a recurrent or state-space mixer sits:

        x (b, t, d) -> y (b, t, d);  state: a :class:`KVCache` to continue from (or None)
        mask: (b, t) boolean padding mask, True at real positions, padding on the right (the token-mixer
            ``mask``). Padded inputs are zeroed and padded keys masked out, so the outputs at real positions
            equal those of each sequence run alone; the returned cache holds all t positions, and its k and v
            at each row's real positions equal those of the row run alone (:class:`KVCache`).
        attn_mask: any boolean attention mask broadcastable to (b, h, t, t_c + t), True = may attend, ANDed
            with the padding mask and the causal/window structure (what MultiheadAttention calls ``mask``).

    Examples::

        >>> attn = SelfAttention(16, n_heads=4, causal=True)
        >>> y, cache = attn(torch.randn(2, 5, 16), mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]))
        >>> y.shape
        torch.Size([2, 5, 16])
    """

    def forward(
        self,
        x: Tensor,
        state: KVCache | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        *,
        attn_mask: Tensor | None = None,
    ):
        x, attn_mask, padded = self._padding(x, state, mask, attn_mask)
        return _mark(super().forward(x, mask=attn_mask, state=state, need_weights=need_weights), padded)

    def forward_ref(
        self,
        x: Tensor,
        state: KVCache | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        *,
        attn_mask: Tensor | None = None,
    ):
        """``forward`` through :func:`scaled_dot_product_attention_ref`, whatever ``fast_path`` says."""
        x, attn_mask, padded = self._padding(x, state, mask, attn_mask)
        return _mark(super().forward_ref(x, mask=attn_mask, state=state, need_weights=need_weights), padded)

    def _padding(self, x: Tensor, state: KVCache | None, mask: Tensor | None, attn_mask: Tensor | None):
        """x with padded positions zeroed, the attention mask with the padded keys masked out, and whether any
        position was padding."""
        if mask is None:
            return x, attn_mask, False
        check_input(type(self).__name__, x, self.d_model, self.out_proj.weight)
        b, t, _ = x.shape
        mask = check_padding_mask(mask, b, t, x.device)
        if mask is None:
            return x, attn_mask, False
        x = x.masked_fill(~mask[..., None], 0.0)  # padded inputs (even NaN) never reach a real output
        t_c = 0 if state is None else state.k.size(2)
        if t_c:
            mask = torch.cat([mask.new_ones(b, t_c), mask], dim=1)  # the cached keys are real: (b, t_c + t)
        return x, combine_masks(attn_mask, mask[:, None, None, :]), True  # keys: (b, 1, 1, t_c + t)


def _mark(out: tuple, padded: bool) -> tuple:
    """A forward's (y, cache, ...) with the cache marked ``padded`` when the batch held padding (KVCache)."""
    return (out[0], out[1]._replace(padded=True), *out[2:]) if padded else out
