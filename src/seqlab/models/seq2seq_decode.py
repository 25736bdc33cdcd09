r"""The decoding half of :class:`seqlab.models.seq2seq.Seq2Seq`: its state, the teacher-forced loop with the
projections hoisted out of it, and generation through the shared beam search (``seqlab.models.beam``).

Notation as in ``seqlab.models.seq2seq``: ``b`` batch, ``s`` source, ``t`` target positions, ``d`` d_model,
``e`` d_embed, ``G`` gates, ``k`` beam size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.layers.linear import linear

__all__ = ["DecodeMixin", "Seq2SeqState"]


@dataclass
class Seq2SeqState:
    """What the decoder carries from one target position to the next.

    memory: the encoder's outputs h (b, s, d); mask (b, s): True at real source positions;
    rnn: the decoder's recurrent state (L, b, d), or (h, c) for an LSTM; feed (b, d): the context c of the
    bottleneck model, the last context of RNNsearch, Luong's h̃_{i-1} with input feeding, else None;
    keys_proj (b, s, d): the keys' share of the attention score, computed once per sentence (RNNsearch's
    U h_j, Luong's W_a h_j).
    """

    memory: Tensor
    mask: Tensor
    rnn: Tensor | tuple[Tensor, Tensor]
    feed: Tensor | None = None
    keys_proj: Tensor | None = None

    def select(self, rows: Tensor) -> Seq2SeqState:
        """The state of the given batch rows (rows (n,) long, repeats allowed): beams follow their parents."""

        def pick(x: Tensor | None, dim: int = 0) -> Tensor | None:
            return None if x is None else x.index_select(dim, rows)

        rnn = tuple(pick(r, 1) for r in self.rnn) if isinstance(self.rnn, tuple) else pick(self.rnn, 1)
        return Seq2SeqState(pick(self.memory), pick(self.mask), rnn, pick(self.feed), pick(self.keys_proj))

    def select_beams(self, rows: Tensor, k: int) -> Seq2SeqState:
        """:meth:`select` for beam search, whose rows come in blocks of ``k`` beams per sentence: when every
        row stays in its sentence's block, the per-sentence tensors (memory, mask, keys) are equal across the
        block and are kept as they are; only the recurrent state and the feed follow the parents."""
        n = rows.numel()
        if n != self.memory.size(0) or not bool(
            (rows // k == torch.arange(n, device=rows.device) // k).all()
        ):
            return self.select(rows)  # sentences left the batch: everything follows
        rnn = tuple(r.index_select(1, rows) for r in self.rnn) if isinstance(self.rnn, tuple) else None
        rnn = rnn if rnn is not None else self.rnn.index_select(1, rows)
        feed = None if self.feed is None else self.feed.index_select(0, rows)
        return Seq2SeqState(self.memory, self.mask, rnn, feed, self.keys_proj)


class DecodeMixin:
    """Teacher-forced loop and generation for Seq2Seq (which supplies start, step, rnn, attn, global_attn)."""

    def _layer_step(self, gx0: Tensor, parts: list[tuple[Tensor, ...]], weights: list) -> Tensor:
        """One position through the decoder's L layers. gx0 (b, G d): layer 0's input projection; parts[l]:
        layer l's state, replaced in place; weights[l] = (w_ih, w_hh_t, bias, b_rec). Returns the top output."""
        rnn, y = self.rnn, None
        for layer, (w_ih, w_hh_t, bias, b_rec) in enumerate(weights):
            # layer 0's projection came with the call; above it, the dropped-out output below: (b, G d)
            gx = gx0 if layer == 0 else linear(F.dropout(y, rnn.dropout, self.training), w_ih, bias)
            parts[layer] = rnn._update(gx, parts[layer], w_hh_t, b_rec)
            y = parts[layer][0]  # (b, d)
        return y

    def _loop_weights(self) -> list:
        rnn = self.rnn
        out = []
        for layer in range(rnn.num_layers):
            w_ih, w_hh, b_ih, b_hh = rnn._layer_params(layer, False)
            fold = (
                rnn.mode != "GRU"
            )  # LSTM: b_hh folds into the input projection; GRU keeps it inside r ⊙ (…)
            out.append((w_ih, w_hh.t(), b_ih + b_hh if fold else b_ih, None if fold else b_hh))
        return out

    def _forward_loop(self, emb: Tensor, state) -> tuple[Tensor, Tensor]:
        """RNNsearch, and Luong with input feeding: the recurrence reads the attention, one step per position.

        Layer 0's input is [E y_{i-1}; f_i] with f the context (RNNsearch) or h̃_{i-1} (Luong): its product with
        the embeddings is computed for all t at once, only W_f f_i stays in the loop.
        """
        c = self.config
        e = emb.size(-1)
        weights = self._loop_weights()
        w_ih0, _, bias0, _ = weights[0]
        gx_emb = linear(emb, w_ih0[:, :e], bias0).unbind(1)  # (b, t, e) x (e, G d) -> t x (b, G d)
        w_feed = w_ih0[:, e:]  # (G d, d)
        lstm = isinstance(state.rnn, tuple)
        layers = state.rnn if lstm else (state.rnn,)
        parts = [
            tuple(p[layer] for p in layers) for layer in range(c.n_decoder_layers)
        ]  # L x (h[, c]) (b, d)
        feed, outs, feeds, alphas = state.feed, [], [], []
        for gx in gx_emb:
            if c.attention == "bahdanau":  # c_i from s_{i-1}
                feed, w = self.attn(parts[-1][0], state.memory, mask=state.mask, keys_proj=state.keys_proj)
                feeds.append(feed)
            y = self._layer_step(gx + linear(feed, w_feed), parts, weights)  # s_i: (b, d)
            if c.attention == "luong":  # h̃_i from s_i, fed to the next step
                y, w = self.global_attn(y, state.memory, state.mask, state.keys_proj)
                feed = y
            outs.append(y)
            alphas.append(w)
        top = torch.stack(outs, 1)  # (b, t, d)
        ctx = torch.stack(feeds, 1) if feeds else None
        return self._logits(top, ctx, emb), torch.stack(alphas, 1)  # (b, t, v), (b, t, s)

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
        with ``return_attention`` also the attention weights (b, n, s) along the returned hypotheses.

        ``beam_size`` 1 is greedy decoding; wider beams are batched over sentences and beams, finished
        hypotheses compared by log p / lp(|Y|) with GNMT's length penalty (``seqlab.models.beam``).
        """
        from seqlab.models.beam import search_model

        if return_attention and self.config.attention == "none":
            raise ValueError("this model has no attention (attention='none'): there are no weights to return")
        self.check_source(src, src_mask)  # before its batch size is read
        out = search_model(
            self,
            lambda: self.start(src, src_mask),
            lambda st, rows: st.select_beams(rows, beam_size),
            expand=Seq2SeqState.select,
            batch_size=src.size(0),
            beam_size=beam_size,
            max_len=max_new_tokens,
            length_penalty=length_penalty,
            device=src.device,
        )
        return (out.tokens, out.extras) if return_attention else out.tokens
