r"""RNN encoder–decoders for translation: the bottleneck model, RNNsearch and Luong's global attention.

Notation: ``b`` batch, ``s`` source positions, ``t`` target positions, ``d`` d_model, ``e`` d_embed,
``v`` target vocabulary, ``L`` decoder layers.

Encoder. ``encoder`` names a registered token mixer (``seqlab.layers.list_mixers``). For the recurrent ones
('rnn', 'lstm', 'gru') it is the classic stacked recurrent layer; bidirectional, each direction has d / 2 units
and the outputs are concatenated (OpenNMT-py's convention), so every encoder hands the decoder h (b, s, d).
Any other mixer (attention, Mamba, S4D, minGRU, ...) runs as pre-norm residual blocks of the LM stack
(``seqlab.models.lm.Block``); bidirectional, every second block reads each sentence backwards (the rows are
reversed within their real length, so padding stays on the right), so after two blocks every position has
seen the whole sentence. Either way the padding mask goes to the mixer (the padding law), and padded source
positions get exactly zero attention.

    summary = [→h_s; ←h_1] of the top recurrent layer, or the mean of h over the real positions
    s_0     = tanh(W_init summary)                                     one row per decoder layer (Bahdanau A.2.2)

Decoder, ``attention``:

* 'none' — the RNN encoder–decoder of Cho et al. 2014 (arXiv 1406.1078), the bottleneck: the context
  c = W_ctx summary is the same vector at every step;
* 'bahdanau' — RNNsearch (Bahdanau, Cho & Bengio 2015, arXiv 1409.0473): c_i = Σ_j α_ij h_j with the additive
  score of the previous state, α_i = softmax_j vᵀ tanh(W s_{i-1} + U h_j), appendix A.2.2.
  For both:  s_i = RNN([E y_{i-1}; c_i], s_{i-1});  t_i = maxout(W_r [s_i; c_i; E y_{i-1}]);  logits = W_o t_i
  (the paper's deep-output readout with maxout pools of 2; it reads s_{i-1} where this reads s_i, the
  arrangement of most later implementations).
* 'luong' — global attention (Luong, Pham & Manning 2015, arXiv 1508.04025), ``score`` dot, general or concat:
  s_i = RNN([E y_{i-1}; h̃_{i-1}], s_{i-1}) with input feeding (section 3.3), else RNN(E y_{i-1});
  h̃_i = tanh(W_c [c_i; s_i]) with c_i the attention of s_i over h (eq. 5);  logits = W_o h̃_i.

``step`` costs O(1) in the target length (and O(s) for attention over the source). Teacher-forced
``forward`` runs the same arithmetic with every projection that does not depend on the recurrence (the
target embeddings' share of the input projection, the attention keys, the readout) hoisted out of the loop as
one matrix product over all positions; 'none' and Luong without input feeding need no Python loop at all
(the fused recurrent kernel runs the whole target sequence).

Calling convention: ``model(src (b, s), tgt_in (b, t), src_mask=None) -> logits (b, t, v)``;
``model.generate(src, src_mask=None, max_new_tokens=..., beam_size=1, length_penalty=0.6,
return_attention=False)``; ``src_mask`` defaults to ``src != pad_id`` and must be right-padded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from seqlab.layers.linear import Linear
from seqlab.layers.masks import check_padding_mask
from seqlab.layers.mixer import make_mixer_config, mixer_spec
from seqlab.layers.recurrent import GRU, LSTM, RNN
from seqlab.layers.rnn_attention import AdditiveAttention, AttentionalHidden
from seqlab.models.generation import check_step_tokens, check_token_ids
from seqlab.models.lm import Block, LMConfig
from seqlab.models.seq2seq_decode import DecodeMixin, Seq2SeqState
from seqlab.validation import check_choices, check_dropout, check_positive_ints, check_special_ids

__all__ = ["PRESETS", "Seq2Seq", "Seq2SeqConfig", "Seq2SeqState"]

RECURRENT = {"rnn": RNN, "lstm": LSTM, "gru": GRU}


@dataclass
class Seq2SeqConfig:
    vocab_size: int = 8000
    """Source vocabulary (and the target's when tgt_vocab_size is None: one shared subword vocabulary)."""
    tgt_vocab_size: int | None = None
    d_model: int = 256
    """Encoder output width (both directions together), decoder state width."""
    d_embed: int | None = None
    """Embedding width of both sides; None means d_model."""
    encoder: str = "gru"
    """A registered token mixer: 'gru', 'lstm', 'rnn' (a stacked recurrent layer) or 'attention', 'mamba', ..."""
    encoder_config: dict[str, Any] | None = None
    """The encoder mixer's own fields (its config dataclass in the registry); None: its defaults."""
    n_encoder_layers: int = 1
    bidirectional: bool = True
    cell: Literal["gru", "lstm"] = "gru"
    """The decoder's recurrence."""
    n_decoder_layers: int = 1
    attention: Literal["none", "bahdanau", "luong"] = "bahdanau"
    score: Literal["dot", "general", "concat"] = "general"
    """Luong's score function (attention='luong' only)."""
    input_feeding: bool = True
    """Luong's input feeding: the previous h̃ joins the next step's input (attention='luong' only)."""
    d_readout: int | None = None
    """Width of the maxout readout of 'none' and 'bahdanau'; None means d_model."""
    dropout: float = 0.1
    """On the embeddings, between stacked layers and before the output projection; training only."""
    max_src_len: int = 256
    """The longest source the model accepts; longer ones get an error that says so."""
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        check_choices(self)
        check_positive_ints(
            self, ("vocab_size", "d_model", "n_encoder_layers", "n_decoder_layers", "max_src_len")
        )
        check_positive_ints(self, ("tgt_vocab_size", "d_embed", "d_readout"), allow_none=True)
        check_dropout(self)
        if self.attention != "luong" and (self.score != "general" or not self.input_feeding):
            raise ValueError(
                f"score and input_feeding belong to attention='luong'; this model has attention={self.attention!r}"
            )
        spec = mixer_spec(self.encoder)  # a clear error for an unknown mixer
        if self.encoder in RECURRENT and self.encoder_config:
            raise ValueError(f"the recurrent encoder {self.encoder!r} takes no encoder_config")
        if self.encoder in RECURRENT and self.bidirectional and self.d_model % 2:
            raise ValueError(
                f"a bidirectional recurrent encoder gives each direction d_model / 2 units; d_model={self.d_model} is odd"
            )
        if self.encoder not in RECURRENT and self.bidirectional and self.n_encoder_layers == 1:
            raise ValueError(
                f"a bidirectional {self.encoder!r} encoder reads backwards in every second block, so one block "
                "never sees later tokens: set n_encoder_layers=2 (or more), or bidirectional=False"
            )
        self.encoder_config = dataclasses.asdict(make_mixer_config(spec.name, self.encoder_config))
        check_special_ids(self, min(self.vocab_size, self.target_vocab), "both vocabularies")

    @property
    def target_vocab(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def embed_width(self) -> int:
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def readout_width(self) -> int:
        return self.d_model if self.d_readout is None else self.d_readout


def reverse_padded(x: Tensor, lengths: Tensor) -> Tensor:
    """Reverse each row of x (b, t, ...) within its first ``lengths[i]`` positions; padding stays in place.

    Its own inverse. Row i, position p < len_i reads position len_i - 1 - p.
    """
    t = x.size(1)
    pos = torch.arange(t, device=x.device).expand(x.size(0), t)  # (b, t)
    n = lengths.to(x.device)[:, None]
    idx = torch.where(pos < n, n - 1 - pos, pos)  # (b, t)
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x))


class Encoder(nn.Module):
    """Embedded source (b, s, e) and its mask -> h (b, s, d) and the summary (b, d). See the module docstring."""

    def __init__(self, c: Seq2SeqConfig, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.recurrent = c.encoder in RECURRENT
        self.bidirectional = c.bidirectional
        if self.recurrent:
            hidden = c.d_model // 2 if c.bidirectional else c.d_model
            self.rnn = RECURRENT[c.encoder](
                c.embed_width,
                hidden,
                c.n_encoder_layers,
                dropout=c.dropout,
                bidirectional=c.bidirectional,
                **kw,
            )
            self.proj_in = self.blocks = None
        else:
            lm = LMConfig(
                mixer=c.encoder, mixer_config=c.encoder_config, d_model=c.d_model, dropout=c.dropout
            )
            self.proj_in = Linear(c.embed_width, c.d_model, **kw) if c.embed_width != c.d_model else None
            self.blocks = nn.ModuleList(Block(lm, **kw) for _ in range(c.n_encoder_layers))
            self.norm = nn.LayerNorm(c.d_model, **kw)

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        lengths = mask.sum(1)  # (b,)
        if self.recurrent:
            h, state = self.rnn(x, mask=mask)  # (b, s, d), (layers * D, b, d / D)
            top = (state[0] if isinstance(state, tuple) else state)[-(2 if self.bidirectional else 1) :]
            return h, torch.cat(list(top), dim=-1)  # summary [→h_s; ←h_1]: (b, d)
        h = x if self.proj_in is None else self.proj_in(x)  # (b, s, d)
        for i, block in enumerate(self.blocks):
            backwards = self.bidirectional and i % 2 == 1
            h = reverse_padded(h, lengths) if backwards else h
            h = block(h, mask=mask)[0]
            h = reverse_padded(h, lengths) if backwards else h
        h = self.norm(h).masked_fill(~mask[..., None], 0.0)  # padding outputs zero, as the recurrent layers'
        return h, h.sum(1) / lengths[:, None].to(h.dtype)  # summary: the mean over real positions (b, d)


class Seq2Seq(DecodeMixin, nn.Module):
    """An RNN encoder–decoder with or without attention (see the module docstring).

    Examples::

        >>> model = Seq2Seq(Seq2SeqConfig(vocab_size=40, d_model=16, attention="bahdanau"))
        >>> model(torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))).shape
        torch.Size([2, 5, 40])
    """

    family = "seq2seq"

    def __init__(self, config: Seq2SeqConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        d, e, L = c.d_model, c.embed_width, c.n_decoder_layers
        self.src_embed = nn.Embedding(c.vocab_size, e, **kw)
        self.tgt_embed = nn.Embedding(c.target_vocab, e, **kw)
        self.encoder = Encoder(c, **kw)
        self.bridge = Linear(d, L * d, **kw)  # s_0 = tanh(W_init summary), one row per layer
        self.drop = nn.Dropout(c.dropout)
        luong = c.attention == "luong"
        feed = d if (not luong or c.input_feeding) else 0  # the context, or h̃ with input feeding
        self.rnn = (LSTM if c.cell == "lstm" else GRU)(e + feed, d, L, dropout=c.dropout, **kw)
        self.context_proj = Linear(d, d, **kw) if c.attention == "none" else None  # c = W_ctx summary
        self.attn = AdditiveAttention(d, d, d, **kw) if c.attention == "bahdanau" else None
        self.global_attn = AttentionalHidden(d, c.score, **kw) if luong else None
        out = d if luong else c.readout_width
        self.readout = None if luong else Linear(2 * d + e, 2 * out, **kw)  # maxout pools of 2
        self.out_proj = Linear(out, c.target_vocab, **kw)

    # ---- encoding ----------------------------------------------------------------------------------------

    def check_source(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """Validate src (b, s) and its mask; returns the mask (default ``src != pad_id``)."""
        c = self.config
        if not isinstance(src, Tensor) or src.dim() != 2 or src.size(1) == 0:
            got = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
            raise ValueError(f"src must be token ids of shape (b, s) with s >= 1, got {got}")
        check_token_ids(src, c.vocab_size)
        if src.size(1) > c.max_src_len:
            raise ValueError(
                f"the source has {src.size(1)} tokens; this model accepts at most max_src_len={c.max_src_len}"
            )
        mask = src != c.pad_id if src_mask is None else src_mask
        check_padding_mask(mask, *src.shape, device=src.device)
        if not bool(mask[:, 0].all()):
            raise ValueError("every source sentence needs at least one real token (a mask row is all False)")
        return mask

    def start(self, src: Tensor, src_mask: Tensor | None = None) -> Seq2SeqState:
        """Encode the source: the decoder's state before its first step."""
        c = self.config
        mask = self.check_source(src, src_mask)
        h, summary = self.encoder(self.drop(self.src_embed(src)), mask)  # (b, s, d), (b, d)
        b, d = summary.shape
        s0 = torch.tanh(self.bridge(summary)).view(b, c.n_decoder_layers, d).transpose(0, 1).contiguous()
        rnn = (s0, torch.zeros_like(s0)) if c.cell == "lstm" else s0  # (L, b, d)
        if c.attention == "none":
            feed = self.context_proj(summary)  # the fixed context c (b, d)
        elif c.attention == "bahdanau" or c.input_feeding:
            feed = h.new_zeros(b, d)  # bahdanau: recomputed each step; luong: h̃_0 = 0
        else:
            feed = None
        attn = self.attn if self.attn is not None else self.global_attn
        keys_proj = attn.project_keys(h) if attn is not None else None  # once per source sentence
        return Seq2SeqState(memory=h, mask=mask, rnn=rnn, feed=feed, keys_proj=keys_proj)

    # ---- decoding ----------------------------------------------------------------------------------------

    def _logits(self, top: Tensor, context: Tensor | None, emb: Tensor) -> Tensor:
        """(…, d) decoder outputs -> (…, v) logits: maxout readout, or W_o h̃ for Luong."""
        if self.readout is None:
            return self.out_proj(self.drop(top))  # top is h̃
        r = self.readout(torch.cat([top, context, emb], dim=-1))  # (…, 2 out)
        r = r.unflatten(-1, (-1, 2)).amax(-1)  # maxout over pairs: (…, out)
        return self.out_proj(self.drop(r))

    def step(self, tokens: Tensor, state: Seq2SeqState) -> tuple[Tensor, Seq2SeqState, Tensor | None]:
        """One target position: tokens (b,) -> logits (b, v), the new state, attention weights (b, s) or None."""
        c = self.config
        check_step_tokens("Seq2Seq", tokens, state.memory.size(0), c.target_vocab)
        emb = self.drop(self.tgt_embed(tokens))  # (b, e)
        weights = None
        feed = state.feed
        if c.attention == "bahdanau":
            top = (state.rnn[0] if c.cell == "lstm" else state.rnn)[-1]  # s_{i-1}: (b, d)
            feed, weights = self.attn(top, state.memory, mask=state.mask, keys_proj=state.keys_proj)
        x = emb if feed is None else torch.cat([emb, feed], dim=-1)
        y, rnn = self.rnn(x.unsqueeze(1), state.rnn)  # (b, 1, d)
        y = y[:, 0]
        if c.attention == "luong":
            y, weights = self.global_attn(y, state.memory, mask=state.mask, keys_proj=state.keys_proj)  # h̃_i
            new_feed = y if c.input_feeding else None
        else:
            new_feed = state.feed if c.attention == "none" else feed
        logits = self._logits(y, feed, emb)
        return logits, dataclasses.replace(state, rnn=rnn, feed=new_feed), weights

    def forward(
        self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """Teacher forcing: src (b, s), tgt_in (b, t) -> logits (b, t, v) [, attention (b, t, s)]."""
        c = self.config
        state = self.start(src, src_mask)  # checks the source first
        if (
            not isinstance(tgt_in, Tensor)
            or tgt_in.dim() != 2
            or tgt_in.size(0) != src.size(0)
            or not tgt_in.size(1)
        ):
            got = tuple(tgt_in.shape) if isinstance(tgt_in, Tensor) else type(tgt_in).__name__
            raise ValueError(
                f"tgt_in must be token ids (b, t) with the source's b={src.size(0)} and t >= 1, got {got}"
            )
        check_token_ids(tgt_in, c.target_vocab)
        emb = self.drop(self.tgt_embed(tgt_in))  # (b, t, e)
        if c.attention == "bahdanau" or (c.attention == "luong" and c.input_feeding):
            logits, weights = self._forward_loop(emb, state)
        else:
            logits, weights = self._forward_parallel(emb, state)
        return (logits, weights) if return_attention else logits

    def _forward_parallel(self, emb: Tensor, state: Seq2SeqState) -> tuple[Tensor, Tensor | None]:
        """'none' and Luong without input feeding: the recurrence never reads the attention, so the fused
        kernel runs all t at once and attention (if any) is one batched product."""
        t = emb.size(1)
        if self.config.attention == "none":
            ctx = state.feed[:, None].expand(-1, t, -1)  # (b, t, d)
            y, _ = self.rnn(torch.cat([emb, ctx], dim=-1), state.rnn)  # (b, t, d)
            return self._logits(y, ctx, emb), None
        y, _ = self.rnn(emb, state.rnn)  # (b, t, d)
        h_tilde, weights = self.global_attn(
            y, state.memory, state.mask, state.keys_proj
        )  # (b, t, d), (b, t, s)
        return self._logits(h_tilde, None, emb), weights


# ---- presets ------------------------------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    "test-seq2seq": {
        "vocab_size": 64,
        "d_model": 16,
        "attention": "bahdanau",
        "dropout": 0.0,
        "max_src_len": 64,
    },
    "test-seq2seq-luong": {
        "vocab_size": 64,
        "d_model": 16,
        "cell": "lstm",
        "encoder": "lstm",
        "attention": "luong",
        "dropout": 0.0,
        "max_src_len": 64,
    },
    "seq2seq-gru": {"attention": "none"},
    "seq2seq-gru-bahdanau": {"attention": "bahdanau"},
    "seq2seq-gru-luong": {"attention": "luong", "score": "general", "input_feeding": True},
    "seq2seq-lstm-luong": {
        "encoder": "lstm",
        "cell": "lstm",
        "attention": "luong",
        "n_decoder_layers": 2,
        "n_encoder_layers": 2,
    },
    "seq2seq-mamba-bahdanau": {"encoder": "mamba", "n_encoder_layers": 2, "attention": "bahdanau"},
}
