r"""Transformer encoder and decoder layers (Vaswani et al. 2017, arXiv 1706.03762, section 3.1), post-norm as
in the paper or pre-norm (Xiong et al. 2020, arXiv 2002.04745).

Notation: ``b`` batch, ``t`` target positions, ``s`` source (memory) positions, ``d`` model width.

Encoder layer, x (b, t, d) -> (b, t, d):

    post-norm (norm_first=False):  x = LN_1(x + Drop(SelfAttn(x)));      x = LN_2(x + Drop(MLP(x)))
    pre-norm  (norm_first=True):   x = x + Drop(SelfAttn(LN_1(x)));      x = x + Drop(MLP(LN_2(x)))

Decoder layer, x (b, t, d), memory (b, s, d) -> (b, t, d), with a causal self-attention by default:

    post-norm:  x = LN_1(x + Drop(SelfAttn(x)));  x = LN_2(x + Drop(CrossAttn(x, memory)));  x = LN_3(x + Drop(MLP(x)))
    pre-norm:   x = x + Drop(SelfAttn(LN_1 x));   x = x + Drop(CrossAttn(LN_2 x, memory));   x = x + Drop(MLP(LN_3 x))

Sub-modules mirror torch.nn.TransformerEncoderLayer / TransformerDecoderLayer (``self_attn``, ``norm1``...) with
``cross_attn`` for torch's ``multihead_attn`` and ``mlp.fc1``/``mlp.fc2`` for ``linear1``/``linear2``; the
converters in ``seqlab.interop.torch`` map the names. Masks are seqlab's (boolean, True = may attend,
broadcastable to (b, h, t_q, t_k); ``seqlab.layers.masks.key_padding_mask`` makes one from lengths).

Deviation from torch.nn: no dropout inside the MLP (torch applies one after the activation too); dropout is
on the attention weights and on each residual branch, as in the paper (section 5.4).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import torch
from torch import Tensor, nn

from seqlab.layers.attention import KVCache, MultiheadAttention, SelfAttention
from seqlab.layers.checks import check_input
from seqlab.layers.masks import combine_masks
from seqlab.layers.mlp import MLP
from seqlab.layers.norms import LayerNorm
from seqlab.validation import check_positive_ints

__all__ = ["Transformer", "TransformerDecoderLayer", "TransformerEncoderLayer"]

Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]


class TransformerEncoderLayer(nn.Module):
    """Self-attention and an MLP, each in a residual with LayerNorm; see the module docstring.

    ``layer(x, mask=None) -> (b, t, d)``. With ``causal=True`` this is a GPT-style decoder-only block.
    ``n_kv_heads`` and ``rope`` pass through to :class:`SelfAttention`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        activation: Activation = "relu",
        norm_first: bool = False,
        bias: bool = True,
        norm_eps: float = 1e-5,
        causal: bool = False,
        n_kv_heads: int | None = None,
        rope=None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.norm_first = norm_first
        self.self_attn = SelfAttention(
            d_model, n_heads, n_kv_heads, bias=bias, dropout=dropout, causal=causal, rope=rope, **kw
        )
        self.mlp = MLP(d_model, d_ff, activation=activation, bias=bias, **kw)
        self.norm1 = LayerNorm(d_model, eps=norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=norm_eps, bias=bias, **kw)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def _sa(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return self.drop1(self.self_attn(x, attn_mask=mask)[0])  # (b, t, d)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return self._after_attention(x, self._sa(self.norm1(x) if self.norm_first else x, mask))

    def _after_attention(self, x: Tensor, y: Tensor) -> Tensor:
        """The residual around the attention's output y (after its dropout), then the MLP's residual, in the
        layer's norm placement."""
        if self.norm_first:
            x = x + y
            return x + self.drop2(self.mlp(self.norm2(x)))
        x = self.norm1(x + y)
        return self.norm2(x + self.drop2(self.mlp(x)))

    def forward_first(self, x: Tensor, n: int, mask: Tensor | None = None) -> Tensor:
        """The layer's output at the first ``n`` positions only, (b, n, d): those rows of ``forward(x, mask)``
        (the same numbers without dropout; with it, other draws), computed as n queries attending to all t keys,
        so the output projection, the MLP and the norms after the attention run on n rows instead of t. A ViT
        classifier pooling the class token needs nothing else from its last layer."""
        attn = self.self_attn
        check_input("TransformerEncoderLayer.forward_first", x, attn.d_model, attn.in_proj_weight)
        t = x.size(1)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= t:
            raise ValueError(
                f"forward_first: n must be an int in [1, {t}] for an input of {t} positions, got {n!r}"
            )
        if attn.rope is not None or attn.window is not None:  # positions the query-subset form does not apply
            return self.forward(x, mask)[:, :n]
        if mask is not None and mask.dim() >= 2 and mask.size(-2) == t and n != t:
            mask = mask[..., :n, :]  # the query rows kept (before the (n, t) causal rows join them)
        if attn.causal:  # query i sees keys 0 ... i
            structure = torch.ones(n, t, dtype=torch.bool, device=x.device).tril()
            mask = structure if mask is None else combine_masks(mask, structure)
        h = self.norm1(x) if self.norm_first else x
        y = MultiheadAttention.forward(attn, h[:, :n], h, h, mask=mask)[0]  # (b, n, d): n queries, all keys
        return self._after_attention(x[:, :n], self.drop1(y))


DecoderState = tuple[KVCache | None, KVCache | None]
"""(self-attention KV cache, cross-attention cache of the projected memory); None entries start empty."""


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the memory and an MLP, each in a residual with LayerNorm.

    ``layer(x, memory, mask=None, memory_mask=None, state=None) -> (y, state)``: x (b, t, d), memory (b, s, d);
    ``mask`` for the self-attention (combined with the causal structure when ``causal``), ``memory_mask``
    (b, h, t, s)-broadcastable for the cross-attention, e.g. ``key_padding_mask(src_lengths)``. ``state``
    continues incremental decoding: the self-attention KV cache and the projected memory, so a step costs
    O(t + s), not a recomputation. ``causal=False`` gives torch.nn.TransformerDecoderLayer's behaviour, where
    the causal mask must be passed explicitly (``from_torch`` converts to that). With ``need_weights`` it
    returns ``(y, state, weights)``, the cross-attention weights (b, h, t, s) before dropout.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        activation: Activation = "relu",
        norm_first: bool = False,
        bias: bool = True,
        norm_eps: float = 1e-5,
        causal: bool = True,
        n_kv_heads: int | None = None,
        rope=None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.norm_first = norm_first
        self.self_attn = SelfAttention(
            d_model, n_heads, n_kv_heads, bias=bias, dropout=dropout, causal=causal, rope=rope, **kw
        )
        self.cross_attn = MultiheadAttention(d_model, n_heads, n_kv_heads, bias=bias, dropout=dropout, **kw)
        self.mlp = MLP(d_model, d_ff, activation=activation, bias=bias, **kw)
        self.norm1 = LayerNorm(d_model, eps=norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=norm_eps, bias=bias, **kw)
        self.norm3 = LayerNorm(d_model, eps=norm_eps, bias=bias, **kw)
        self.drop1, self.drop2, self.drop3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def init_state(self, batch_size: int) -> DecoderState:
        return self.self_attn.init_state(batch_size), None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        state: DecoderState | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, DecoderState] | tuple[Tensor, DecoderState, Tensor]:
        if state is not None and not (isinstance(state, tuple | list) and len(state) == 2):
            raise ValueError(
                "TransformerDecoderLayer state must be a pair (self-attention cache, cross-attention cache), "
                f"either None to start, as the layer returns it; got {type(state).__name__}"
            )
        self_cache, cross_cache = (None, None) if state is None else state
        weights = None

        def sa(h: Tensor) -> Tensor:
            nonlocal self_cache
            y, self_cache = self.self_attn(h, state=self_cache, attn_mask=mask)  # (b, t, d)
            return self.drop1(y)

        def ca(h: Tensor) -> Tensor:
            nonlocal cross_cache, weights
            y, cross_cache, *w = self.cross_attn(
                h, memory, mask=memory_mask, state=cross_cache, need_weights=need_weights
            )  # (b, t, d), and the weights (b, h, t, s) when asked
            weights = w[0] if w else None
            return self.drop2(y)

        if self.norm_first:
            x = x + sa(self.norm1(x))
            x = x + ca(self.norm2(x))
            x = x + self.drop3(self.mlp(self.norm3(x)))
        else:
            x = self.norm1(x + sa(x))
            x = self.norm2(x + ca(x))
            x = self.norm3(x + self.drop3(self.mlp(x)))
        if need_weights:
            return x, (self_cache, cross_cache), weights
        return x, (self_cache, cross_cache)


class Transformer(nn.Module):
    """The encoder–decoder stack without embeddings (torch.nn.Transformer's scope): N encoder layers and a final
    LayerNorm over the source, N decoder layers and a final LayerNorm over the target.

    ``model(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None) -> (b, t, d)`` with src (b, s, d), tgt
    (b, t, d) and seqlab masks (True = may attend). With ``causal=True`` (the default) the decoder's
    self-attention is causal by itself; ``from_torch`` builds ``causal=False``, torch's behaviour, where the
    causal mask comes as ``tgt_mask``. torch.nn.Transformer always has the two final norms, post-norm
    layers included, and so does this class.
    """

    def __init__(
        self,
        d_model: int = 512,
        n_heads: int = 8,
        n_encoder_layers: int = 6,
        n_decoder_layers: int = 6,
        d_ff: int | None = 2048,
        dropout: float = 0.1,
        activation: Activation = "relu",
        norm_first: bool = False,
        bias: bool = True,
        norm_eps: float = 1e-5,
        causal: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        layers = SimpleNamespace(n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers)
        check_positive_ints(layers, ("n_encoder_layers", "n_decoder_layers"), prefix="Transformer: ")
        kw = {
            "d_ff": d_ff,
            "dropout": dropout,
            "activation": activation,
            "norm_first": norm_first,
            "bias": bias,
            "norm_eps": norm_eps,
            "device": device,
            "dtype": dtype,
        }
        self.encoder_layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, n_heads, **kw) for _ in range(n_encoder_layers)
        )
        self.encoder_norm = LayerNorm(d_model, eps=norm_eps, bias=bias, device=device, dtype=dtype)
        self.decoder_layers = nn.ModuleList(
            TransformerDecoderLayer(d_model, n_heads, causal=causal, **kw) for _ in range(n_decoder_layers)
        )
        self.decoder_norm = LayerNorm(d_model, eps=norm_eps, bias=bias, device=device, dtype=dtype)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        for layer in self.encoder_layers:
            src = layer(src, mask=src_mask)  # (b, s, d)
        return self.encoder_norm(src)

    def decode(
        self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None
    ) -> Tensor:
        for layer in self.decoder_layers:
            tgt, _ = layer(tgt, memory, mask=tgt_mask, memory_mask=memory_mask)  # (b, t, d)
        return self.decoder_norm(tgt)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, memory_mask)
