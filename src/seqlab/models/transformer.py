r"""The original encoder–decoder Transformer (Vaswani et al. 2017, arXiv 1706.03762), with greedy and beam
decoding.

Notation: ``b`` batch, ``s`` source positions, ``t`` target positions, ``d`` d_model, ``v`` vocabulary,
``k`` beam size.

    memory = Encoder(E[src] · √d + PE)                                   (section 3.4: embeddings scaled by √d)
    y      = Decoder(E[tgt] · √d + PE, memory)                           causal self-attention + cross-attention
    log p(y_{i+1} | y_≤i, src) = log_softmax(y_i Eᵀ)                      the "generator" (section 3.4)

Layers are post-norm (``x = LN(x + Sublayer(x))``, section 3.1, the paper's arrangement), built from
:mod:`seqlab.layers.transformer_blocks`; positions are the sinusoids of section 3.5; dropout 0.1 on the sums
of embeddings and positions and on every residual branch (section 5.4). With ``share_embeddings`` one table
serves source, target and the pre-softmax projection (section 3.4, for the shared BPE vocabulary), which is
also how the published parameter counts are reached.

Deviations: no final LayerNorm after the stacks (post-norm needs none); label smoothing and the optimizer
schedule belong to the task and the trainer. Decoding is :mod:`seqlab.models.beam`'s, shared with the RNN
encoder–decoder: beam search (section 6.1: beam 4, length penalty α = 0.6) ranks beams by their raw
log-probability and chooses among the finished hypotheses (and those cut at the length limit) by GNMT's
log p / lp(Y), lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016, arXiv 1609.08144, eq. 14).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.attention import KVCache, MultiheadAttention
from seqlab.layers.masks import check_padding_mask, key_padding_mask
from seqlab.layers.positional import SinusoidalPositionalEncoding
from seqlab.layers.transformer_blocks import DecoderState, TransformerDecoderLayer, TransformerEncoderLayer
from seqlab.layers.vocab_head import VocabHead
from seqlab.models.beam import Decoded, StepFn, never, search
from seqlab.models.generation import check_token_ids, evaluating, widened
from seqlab.validation import (
    check_choices,
    check_divisible,
    check_dropout,
    check_positive_floats,
    check_positive_ints,
    check_special_ids,
)

__all__ = ["PRESETS", "Transformer", "TransformerConfig"]


@dataclass
class TransformerConfig:
    vocab_size: int = 37000
    """Source vocabulary (and target vocabulary when tgt_vocab_size is None: one shared BPE vocabulary)."""
    tgt_vocab_size: int | None = None
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    activation: Literal["relu", "gelu"] = "relu"
    norm_eps: float = 1e-5
    max_seq_len: int = 1024
    """Length of the sinusoid table: the longest source, and the most target positions a decoding reaches."""
    share_embeddings: bool = True
    """One table for source, target and the output projection (needs one shared vocabulary)."""
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        check_choices(self)
        check_positive_ints(
            self, ("vocab_size", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff")
        )
        check_positive_ints(self, ("tgt_vocab_size",), allow_none=True)
        check_positive_floats(self, ("norm_eps",))
        check_divisible(self.d_model, self.n_heads)
        if self.share_embeddings and self.tgt_vocab_size not in (None, self.vocab_size):
            raise ValueError(
                "share_embeddings needs one vocabulary: set tgt_vocab_size=None (or equal to vocab_size), "
                "or share_embeddings=False"
            )
        check_dropout(self)
        check_special_ids(self, min(self.vocab_size, self.target_vocab), "both vocabularies")

    @property
    def target_vocab(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size


class Transformer(nn.Module):
    """``model(src (b, s), tgt_in (b, t), src_mask=None) -> log-probabilities (b, t, v)`` (teacher forcing).

    ``src_mask`` (b, s) is True at real source tokens; by default ``src != pad_id``. ``encode``/``decode``
    expose the two halves; ``generate`` (greedy or beam, optionally with the cross-attention weights),
    ``greedy_decode`` and ``beam_search`` decode from ``bos_id`` until ``eos_id``.

    Examples::

        >>> model = Transformer(TransformerConfig(vocab_size=64, d_model=32, n_heads=4, d_ff=64)).eval()
        >>> ids, attn = model.generate(torch.randint(3, 64, (2, 7)), max_new_tokens=5, return_attention=True)
        >>> ids.size(0), attn.size(0), attn.size(2)  # attn (b, n, s)
        (2, 2, 7)
    """

    family = "transformer"

    def __init__(self, config: TransformerConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        self.src_embed = nn.Embedding(c.vocab_size, c.d_model, **kw)
        self.tgt_embed = (
            self.src_embed if c.share_embeddings else nn.Embedding(c.target_vocab, c.d_model, **kw)
        )
        self.pos = SinusoidalPositionalEncoding(c.d_model, c.max_seq_len, dropout=c.dropout)
        layer = {
            "dropout": c.dropout,
            "activation": c.activation,
            "norm_first": False,
            "norm_eps": c.norm_eps,
        }
        self.encoder = nn.ModuleList(
            TransformerEncoderLayer(c.d_model, c.n_heads, c.d_ff, **layer, **kw)
            for _ in range(c.n_encoder_layers)
        )
        self.decoder = nn.ModuleList(
            TransformerDecoderLayer(c.d_model, c.n_heads, c.d_ff, **layer, **kw)
            for _ in range(c.n_decoder_layers)
        )
        self.generator = VocabHead(c.d_model, c.target_vocab, bias=False, **kw)
        self.reset_parameters()
        if c.share_embeddings:
            self.generator.weight = self.tgt_embed.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Xavier-uniform for every matrix (as the annotated Transformer and tensor2tensor), zero biases;
        embeddings N(0, d^-1/2), so that E · √d has unit scale next to the sinusoids."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, MultiheadAttention):
                m.reset_parameters()
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=self.config.d_model**-0.5)

    # ---- the two halves --------------------------------------------------------------------------------

    def _embed(self, table: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        check_token_ids(ids, table.num_embeddings)
        return self.pos(table(ids) * math.sqrt(self.config.d_model), offset)  # (b, ·, d)

    def source_mask(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Check src (b, s) and its mask (default ``src != pad_id``), returned. The padding must be on the right
        (positions count from each sentence's first slot, so a left-padded sentence would be encoded at shifted
        positions), and every sentence needs a real token."""
        if not isinstance(src, Tensor) or src.dim() != 2 or src.size(1) == 0:
            got = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
            raise ValueError(f"src must be token ids of shape (b, s) with s >= 1, got {got}")
        check_token_ids(src, self.config.vocab_size)
        if src.size(1) > self.config.max_seq_len:
            raise ValueError(
                f"the source has {src.size(1)} tokens; this model accepts at most "
                f"max_seq_len={self.config.max_seq_len}"
            )
        mask = src != self.config.pad_id if src_mask is None else src_mask
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != src.shape:
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"src_mask must be boolean {tuple(src.shape)}, True at real tokens; got {got}")
        if not bool(mask.any(1).all()):
            raise ValueError("every source sentence needs at least one real token (a mask row is all False)")
        check_padding_mask(mask, *src.shape)  # right-padded: a real token after padding is refused
        return mask

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src (b, s) -> memory (b, s, d)."""
        src_mask = self.source_mask(src, src_mask)
        mask = key_padding_mask(src_mask)  # (b, 1, 1, s)
        h = self._embed(self.src_embed, src)
        for layer in self.encoder:
            h = layer(h, mask=mask)
        return h

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        state: list[DecoderState] | None = None,
    ) -> tuple[Tensor, list[DecoderState]]:
        """tgt (b, t) after the positions in ``state`` -> log-probs (b, t, v), the grown state."""
        h, state, _ = self._decoder_stack(tgt, memory, src_mask, state)
        return F.log_softmax(widened(self.generator(h)), dim=-1), state  # (b, t, v), float32 at least

    def _decoder_stack(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        state: list[DecoderState] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[DecoderState], Tensor | None]:
        """The decoder's output (b, t, d), its grown state, and with ``need_weights`` the cross-attention
        weights of the last layer (b, h, t, s), else None."""
        offset = 0 if state is None or state[0][0] is None else int(state[0][0].pos)
        mem_mask = key_padding_mask(src_mask)  # (b, 1, 1, s)
        h = self._embed(self.tgt_embed, tgt, offset)
        states = [None] * len(self.decoder) if state is None else state
        new, weights = [], None
        for i, (layer, s) in enumerate(zip(self.decoder, states, strict=True)):
            if need_weights and i == len(self.decoder) - 1:
                h, s, weights = layer(h, memory, memory_mask=mem_mask, state=s, need_weights=True)
            else:
                h, s = layer(h, memory, memory_mask=mem_mask, state=s)
            new.append(s)
        return h, new, weights

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None) -> Tensor:
        src_mask = self.source_mask(src, src_mask)
        memory = self.encode(src, src_mask)
        return self.decode(tgt_in, memory, src_mask)[0]

    # ---- decoding (seqlab.models.beam) ------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        max_new_tokens: int = 64,
        beam_size: int = 1,
        length_penalty: float = 0.6,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """src (b, s) -> target ids (b, 1 + n): bos, then up to ``max_new_tokens`` tokens, pad after eos;
        with ``return_attention`` also the last decoder layer's cross-attention weights averaged over heads
        along the returned hypotheses, (b, n, s): rows sum to 1 over the real source positions, 0 after eos.

        ``beam_size`` 1 is greedy decoding; wider beams rank by log p and choose by log p / lp(|Y|) with
        GNMT's length penalty α = ``length_penalty`` (:mod:`seqlab.models.beam`).
        """
        out = self._search(src, src_mask, max_new_tokens, beam_size, length_penalty, return_attention)
        return (out.tokens, out.extras) if return_attention else out.tokens

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, max_len: int, src_mask: Tensor | None = None) -> Tensor:
        """(b, s) -> (b, 1 + n ≤ 1 + max_len): bos, then the argmax token each step; pad after eos."""
        return self._search(src, src_mask, max_len, beam_size=1).tokens

    @torch.no_grad()
    def beam_search(
        self,
        src: Tensor,
        max_len: int,
        beam_size: int = 4,
        length_penalty: float = 0.6,
        src_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(b, s) -> best sequences (b, 1 + n) (bos first, pad after eos) and their penalized scores (b,).

        score(Y) = log p(Y | src) / lp(Y),  lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting eos (not bos).
        Which finished hypotheses compete: :mod:`seqlab.models.beam`.
        """
        out = self._search(src, src_mask, max_len, beam_size, length_penalty)
        return out.tokens, out.scores

    def _search(
        self,
        src: Tensor,
        src_mask: Tensor | None,
        max_len: int,
        beam_size: int,
        length_penalty: float = 0.6,
        need_weights: bool = False,
    ) -> Decoded:
        """Greedy search (``beam_size`` 1) or beam search, in eval mode, through :mod:`seqlab.models.beam`."""
        c = self.config
        src_mask = self.source_mask(src, src_mask)  # the source first: the user's data
        if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > c.max_seq_len:
            raise ValueError(  # found before decoding, not after max_seq_len steps of it
                f"max_new_tokens={max_len} would need {max_len} target positions; this model's position table "
                f"has max_seq_len={c.max_seq_len}"
            )
        with evaluating(self):
            memory = self.encode(src, src_mask)  # (b, s, d)
            return search(
                self._step_fn(need_weights),
                (None, memory, src_mask),
                self._reorder,
                batch_size=src.size(0),
                beam_size=beam_size,
                bos_id=c.bos_id,
                eos_id=c.eos_id,
                pad_id=c.pad_id,
                max_len=max_len,
                length_penalty=length_penalty,
                device=src.device,
            )

    def _step_fn(self, need_weights: bool) -> StepFn:
        """The decoder as :data:`seqlab.models.beam.StepFn`. The state is (the layers' caches, None before the
        first step; the memory (N, s, d); its mask (N, s)), so that the search may drop or reorder rows; the
        extra, with ``need_weights``, is the last layer's cross-attention averaged over heads (N, s)."""

        def step(last: Tensor, state: tuple):
            caches, memory, src_mask = state
            h, caches, w = self._decoder_stack(last[:, None], memory, src_mask, caches, need_weights)
            logp = F.log_softmax(widened(self.generator(h[:, -1])), dim=-1)  # (N, 1, d) -> (N, v)
            logp = never(logp, self.config.pad_id, self.config.bos_id)
            return logp, (caches, memory, src_mask), None if w is None else w[:, :, -1].mean(1)  # (N, s)

        return step

    @staticmethod
    def _reorder(state: tuple, rows: Tensor) -> tuple:
        """The search state of the given rows (N,): the layers' caches (self-attention keys and values,
        projected memory), the memory and its mask."""

        def pick(cache: KVCache | None) -> KVCache | None:
            return None if cache is None else KVCache(cache.k[rows], cache.v[rows], cache.pos)

        caches, memory, src_mask = state
        caches = None if caches is None else [(pick(a), pick(b)) for a, b in caches]
        return caches, memory[rows], src_mask[rows]


# Vaswani et al. 2017, table 3: base 65M and big 213M parameters for WMT14 En-De with a shared source-target
# vocabulary of about 37,000 byte-pair tokens (section 5.1). With 37,000 tokens this geometry counts 63.1M (base,
# -2.9%) and 214.2M (big, +0.6%). The two published totals are not counts of one vocabulary: base's 65M implies
# about 40,700 tokens (44.1M in the layers + 512 V), big's 213M about 35,800 (176.4M + 1024 V). A V of 38.3k-39.9k
# would put both within 2% by fitting two rounded figures; the presets keep the paper's stated 37,000 instead,
# and the tests pin base's exact count and the arithmetic above.
PRESETS = {
    "test-transformer": {
        "vocab_size": 64,
        "d_model": 32,
        "n_heads": 4,
        "n_encoder_layers": 2,
        "n_decoder_layers": 2,
        "d_ff": 64,
        "dropout": 0.0,
        "max_seq_len": 64,
    },
    "transformer-small": {  # for CPU-sized translation (the lab's translation suite): 6.6M with 4,000 tokens
        "vocab_size": 8000,
        "d_model": 256,
        "n_heads": 4,
        "n_encoder_layers": 3,
        "n_decoder_layers": 3,
        "d_ff": 1024,
        "max_seq_len": 256,
    },
    "transformer-base": {},
    "transformer-big": {"d_model": 1024, "n_heads": 16, "d_ff": 4096, "dropout": 0.3},
}
