r"""BERT-style bidirectional Transformer encoders (Devlin et al. 2018, arXiv 1810.04805).

Notation: ``b`` batch, ``t`` time, ``d`` d_model, ``v`` vocabulary, ``c`` classes.

    x_0 = LayerNorm(E_tok[ids] + E_pos[0..t-1] + E_seg[token_type_ids])      then dropout
    x_l = LN_2(y + MLP(y)),  y = LN_1(x_{l-1} + SelfAttn(x_{l-1}, padding mask))   post-norm (BERT, as Vaswani)
    returns x_L (b, t, d): the last hidden states

Padding: ``attention_mask`` (b, t) is 1/True at real tokens; padded keys receive no attention. Padded
positions still get hidden states (computed from the real tokens), as in BERT; pool with the mask.
The pooler (``tanh(W h_[CLS] + b)``, BERT's next-sentence pooler) belongs to the encoder when
``config.pooler`` is set, so that BERT checkpoints load whole; :meth:`Encoder.pool` applies it (``"cls"``) or
takes the masked mean of the hidden states (``"mean"``, Sentence-BERT, Reimers & Gurevych 2019).

Heads are separate modules: :class:`MaskedLMHead` (dense -> GELU -> LayerNorm -> vocabulary, decoder tied
to the token embedding) and :class:`ClassificationHead` (pool -> dropout -> linear), composed by
:class:`EncoderForMaskedLM` and :class:`EncoderForSequenceClassification`.

Initialization as BERT: N(0, 0.02) weights and embeddings, zero biases, LayerNorm (1, 0).
Layers are :class:`seqlab.layers.transformer_blocks.TransformerEncoderLayer` (post-norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from seqlab.layers.linear import Linear
from seqlab.layers.masks import key_padding_mask
from seqlab.layers.mlp import ACTIVATIONS
from seqlab.layers.norms import LayerNorm
from seqlab.layers.transformer_blocks import TransformerEncoderLayer
from seqlab.models.generation import check_token_ids
from seqlab.models.init import normal_init_
from seqlab.validation import (
    check_choices,
    check_divisible,
    check_dropout,
    check_nonnegative,
    check_positive_floats,
    check_positive_ints,
)

__all__ = [
    "PRESETS",
    "ClassificationHead",
    "Encoder",
    "EncoderConfig",
    "EncoderForMaskedLM",
    "EncoderForSequenceClassification",
    "MaskedLMHead",
]


@dataclass
class EncoderConfig:
    vocab_size: int = 30522
    max_seq_len: int = 512
    """Size of the learned position table."""
    type_vocab_size: int = 2
    """Segment (sentence A / B) embeddings; 0 means none."""
    n_layers: int = 12
    n_heads: int = 12
    d_model: int = 768
    d_ff: int | None = None
    """Hidden width of the MLP; None means 4 * d_model."""
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu"
    norm_eps: float = 1e-12
    dropout: float = 0.1
    """On the embeddings, the attention weights and the residual branches (training only)."""
    pooler: bool = True
    """Include BERT's pooler tanh(W h_[CLS] + b)."""
    pad_token_id: int = 0

    def __post_init__(self):
        check_choices(self)
        check_positive_ints(self, ("vocab_size", "max_seq_len", "n_layers", "n_heads", "d_model"))
        check_positive_ints(self, ("d_ff",), allow_none=True)
        check_positive_floats(self, ("norm_eps",))
        check_divisible(self.d_model, self.n_heads)
        check_dropout(self)
        check_nonnegative(self, ("type_vocab_size",))
        p = self.pad_token_id
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self.vocab_size:
            raise ValueError(f"pad_token_id must be an id in [0, vocab_size={self.vocab_size}), got {p!r}")

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff


class Encoder(nn.Module):
    """``encoder(input_ids (b, t), attention_mask=None, token_type_ids=None) -> hidden (b, t, d)``."""

    family = "encoder"

    def __init__(self, config: EncoderConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model, **kw)
        self.pos_embed = nn.Embedding(c.max_seq_len, c.d_model, **kw)
        self.type_embed = nn.Embedding(c.type_vocab_size, c.d_model, **kw) if c.type_vocab_size else None
        self.embed_norm = LayerNorm(c.d_model, eps=c.norm_eps, **kw)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(
                c.d_model,
                c.n_heads,
                c.ff_width,
                dropout=c.dropout,
                activation=c.activation,
                norm_first=False,
                norm_eps=c.norm_eps,
                **kw,
            )
            for _ in range(c.n_layers)
        )
        self.pooler = Linear(c.d_model, c.d_model, **kw) if c.pooler else None
        normal_init_(self)

    def embed(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        t = input_ids.size(1)
        if t > self.config.max_seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds max_seq_len={self.config.max_seq_len}")
        h = self.tok_embed(input_ids) + self.pos_embed.weight[:t]  # (b, t, d) + (t, d)
        if self.type_embed is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            h = h + self.type_embed(types)  # (b, t, d)
        return self.drop(self.embed_norm(h))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"expected integer token ids (b, t), got {got}")
        check_token_ids(input_ids, self.config.vocab_size)
        if token_type_ids is not None:
            if not isinstance(token_type_ids, Tensor) or token_type_ids.shape != input_ids.shape:
                got = (
                    tuple(token_type_ids.shape)
                    if isinstance(token_type_ids, Tensor)
                    else type(token_type_ids).__name__
                )
                raise ValueError(f"token_type_ids must match input_ids {tuple(input_ids.shape)}, got {got}")
            if self.type_embed is None:
                raise ValueError(
                    "token_type_ids given, but this encoder has no segment embeddings (type_vocab_size=0)"
                )
            check_token_ids(token_type_ids, self.config.type_vocab_size)
        mask = None
        if attention_mask is not None:
            real = real_tokens(attention_mask, tuple(input_ids.shape), "input_ids")
            mask = key_padding_mask(real)  # (b, 1, 1, t): True at real keys
        h = self.embed(input_ids, token_type_ids)  # (b, t, d)
        for layer in self.layers:
            h = layer(h, mask=mask)
        return h

    def pool(
        self, hidden: Tensor, attention_mask: Tensor | None = None, how: Literal["cls", "mean"] = "cls"
    ) -> Tensor:
        """hidden (b, t, d) -> (b, d): BERT's pooler on [CLS] (``"cls"``) or the masked mean (``"mean"``)."""
        if how == "cls":
            first = hidden[:, 0]  # (b, d)
            return first if self.pooler is None else torch.tanh(self.pooler(first))
        if how == "mean":
            if attention_mask is None:
                return hidden.mean(1)
            m = real_tokens(attention_mask, tuple(hidden.shape[:2]), "hidden's (b, t)")
            if not m.any(1).all():
                raise ValueError("pool('mean'): a row of attention_mask has no real token, so it has no mean")
            m = m.to(hidden.dtype).unsqueeze(-1)  # (b, t, 1)
            return (hidden * m).sum(1) / m.sum(1)  # (b, d)
        raise ValueError(f"pooling must be 'cls' or 'mean', got {how!r}")

    @classmethod
    def from_pretrained_folder(cls, path, device=None, dtype=None) -> Encoder:
        """A BERT checkpoint folder (config.json + model.safetensors, Hugging Face layout) without transformers."""
        from seqlab.interop.hf_bert import load_bert_folder

        return load_bert_folder(path, device=device, dtype=dtype)


def real_tokens(attention_mask, shape: tuple[int, ...], against: str) -> Tensor:
    """``attention_mask`` (b, t) as booleans, True at real tokens: bool, or numbers that are all 0 or 1 (what
    tokenizers give). Hugging Face's additive form (0 to attend, a large negative number at padding) would turn
    into the opposite mask under ``.bool()``, so it is refused by name."""
    if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != shape:
        got = (
            tuple(attention_mask.shape)
            if isinstance(attention_mask, Tensor)
            else type(attention_mask).__name__
        )
        raise ValueError(f"attention_mask must be a tensor of {against} shape {shape}, got {got}")
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if attention_mask.is_complex() or (
        attention_mask.numel() and not ((attention_mask == 0) | (attention_mask == 1)).all()
    ):
        raise ValueError(
            f"attention_mask must be 1 or True at real tokens and 0 or False at padding; this {attention_mask.dtype} "
            "mask holds other values (an additive mask, 0 to attend and large negatives at padding? pass "
            "attention_mask=(mask == 0))"
        )
    return attention_mask != 0


class MaskedLMHead(nn.Module):
    """hidden (b, t, d) -> logits (b, t, v): LayerNorm(act(W h + b)) Eᵀ + bias (BERT's MLM head), act the
    encoder's activation (``hidden_act``, as BERT's head transform takes it)."""

    def __init__(self, config: EncoderConfig, embedding: nn.Embedding | None = None, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        c = config
        self.dense = Linear(c.d_model, c.d_model, **kw)
        self.norm = LayerNorm(c.d_model, eps=c.norm_eps, **kw)
        self.decoder = Linear(c.d_model, c.vocab_size, **kw)
        self.act = ACTIVATIONS[c.activation]
        normal_init_(self)
        if embedding is not None:
            self.decoder.weight = embedding.weight  # tied to the input embedding, as in BERT

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(self.act(self.dense(hidden))))  # (b, t, d) -> (b, t, v)


class ClassificationHead(nn.Module):
    """pooled (b, d) -> logits (b, c): dropout then a linear layer."""

    def __init__(self, d_model: int, n_classes: int, dropout: float = 0.1, device=None, dtype=None):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.proj = Linear(d_model, n_classes, device=device, dtype=dtype)
        normal_init_(self)

    def forward(self, pooled: Tensor) -> Tensor:
        return self.proj(self.drop(pooled))


class EncoderForMaskedLM(nn.Module):
    """Encoder + MLM head: ``model(input_ids, attention_mask, token_type_ids) -> logits (b, t, v)``.
    The loss (cross-entropy on the masked positions) belongs to the task."""

    def __init__(self, config: EncoderConfig, device=None, dtype=None):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config, device=device, dtype=dtype)
        self.head = MaskedLMHead(config, self.encoder.tok_embed, device=device, dtype=dtype)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        return self.head(self.encoder(input_ids, attention_mask, token_type_ids))


class EncoderForSequenceClassification(nn.Module):
    """Encoder + pooling (``"cls"`` or ``"mean"``) + classifier: ``-> logits (b, c)``."""

    def __init__(
        self,
        config: EncoderConfig,
        n_classes: int,
        pooling: Literal["cls", "mean"] = "cls",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
            raise ValueError(f"n_classes must be a positive integer, got {n_classes!r}")
        self.config, self.pooling = config, pooling
        self.encoder = Encoder(config, device=device, dtype=dtype)
        self.head = ClassificationHead(config.d_model, n_classes, config.dropout, device=device, dtype=dtype)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        h = self.encoder(input_ids, attention_mask, token_type_ids)  # (b, t, d)
        return self.head(self.encoder.pool(h, attention_mask, self.pooling))  # (b, c)


# BERT sizes from Devlin et al. 2018 (section 3): 30,522 WordPiece tokens, 512 positions, 2 segments.
PRESETS = {
    "test-bert": {"vocab_size": 101, "max_seq_len": 64, "n_layers": 2, "n_heads": 4, "d_model": 32},
    "bert-base": {"n_layers": 12, "n_heads": 12, "d_model": 768},
    "bert-large": {"n_layers": 24, "n_heads": 16, "d_model": 1024},
    # all-MiniLM-L6-v2 (sentence-transformers): MiniLM-L6-H384 (Wang et al. 2020, arXiv 2002.10957)
    "minilm-l6": {"n_layers": 6, "n_heads": 12, "d_model": 384, "d_ff": 1536},
}
