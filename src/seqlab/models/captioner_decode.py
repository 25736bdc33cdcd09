r"""The decoding half of :class:`seqlab.models.captioner.Captioner` and of the video captioner
(:class:`seqlab.models.video.VideoModel`): the decoder's modules, its state, one word (``step``), Show, Attend
and Tell's teacher-forced loop with the embeddings' projection hoisted out of it, the Transformer decoder stack,
and generation through the shared beam search (``seqlab.models.beam``). The equations are in
``seqlab.models.captioner``; the annotation vectors are an image's regions there and a clip's frames in the
video model (soft attention over time, Yao et al. 2015, arXiv 1502.08029).

Notation as in ``seqlab.models.captioner``: ``b`` batch, ``L`` regions (or frames), ``D`` annotation width,
``t`` caption positions, ``e`` d_embed, ``d`` d_model, ``v`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seqlab.layers.attention import KVCache
from seqlab.layers.linear import Linear, linear
from seqlab.layers.norms import LayerNorm
from seqlab.layers.recurrent import LSTM
from seqlab.layers.recurrent_cells import _lstm_update
from seqlab.layers.rnn_attention import AdditiveAttention
from seqlab.layers.transformer_blocks import TransformerDecoderLayer
from seqlab.models.generation import check_step_tokens, check_token_ids

__all__ = ["CaptionDecodeMixin", "CaptionState"]


@dataclass
class CaptionState:
    """What the decoder carries from one word to the next: the annotations (b, L, D) and their share of the
    attention score (b, L, A) (the LSTMs), the LSTM's (h, c) (b, d) each, or the Transformer decoder's layer
    caches (self-attention keys and values, projected memory)."""

    memory: Tensor
    keys_proj: Tensor | None = None
    rnn: tuple[Tensor, Tensor] | None = None
    caches: list | None = None

    def select(self, rows: Tensor) -> CaptionState:
        """The state of the given rows (N,) long (repeats allowed): beams follow their parents."""

        def pick(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.index_select(0, rows)

        def pick_cache(cache: KVCache | None) -> KVCache | None:
            return None if cache is None else KVCache(cache.k[rows], cache.v[rows], cache.pos)

        rnn = None if self.rnn is None else (pick(self.rnn[0]), pick(self.rnn[1]))
        caches = None if self.caches is None else [(pick_cache(a), pick_cache(b)) for a, b in self.caches]
        return CaptionState(pick(self.memory), pick(self.keys_proj), rnn, caches)


class CaptionDecodeMixin:
    """The decoder of the captioners. The model supplies ``config`` (the decoder's fields: vocab_size, decoder,
    attention, d_model, d_embed, d_attn, n_decoder_layers, n_heads, max_len, dropout, gate) and ``start``,
    calls ``_build_decoder`` in its constructor and ``start_decoder`` on its annotation vectors."""

    def _build_decoder(self, d_ann: int, n_regions: int, device=None, dtype=None) -> None:
        """The decoder's modules over annotation vectors of width ``d_ann`` (``n_regions`` of them, which only
        Show and Tell's W_I depends on)."""
        c, kw = self.config, {"device": device, "dtype": dtype}
        d, e = c.d_model, c.d_embed or c.d_model
        self.drop = nn.Dropout(c.dropout)
        if c.decoder == "transformer":
            self.embed = nn.Embedding(c.vocab_size, d, **kw)
            nn.init.normal_(self.embed.weight, std=0.02)  # tied to the head: N(0, 1) gives logits of std √d
            self.pos = nn.Parameter(torch.randn(c.max_len, d, **kw) * 0.02)
            self.memory_proj = Linear(d_ann, d, **kw) if d_ann != d else nn.Identity()
            self.layers = nn.ModuleList(
                TransformerDecoderLayer(
                    d, c.n_heads, dropout=c.dropout, activation="gelu", norm_first=True, **kw
                )
                for _ in range(c.n_decoder_layers)
            )
            self.norm = LayerNorm(d, **kw)
            return
        self.embed = nn.Embedding(c.vocab_size, e, **kw)
        if c.attention == "none":  # Show and Tell
            self.image_proj = Linear(n_regions * d_ann, e, **kw)  # W_I vec(a)
            self.lstm = LSTM(e, d, **kw)
            self.out = Linear(d, c.vocab_size, **kw)
        else:  # Show, Attend and Tell
            self.init_h, self.init_c = Linear(d_ann, d, **kw), Linear(d_ann, d, **kw)
            self.attn = AdditiveAttention(d, d_ann, c.d_attn or d, **kw)
            self.beta = Linear(d, 1, **kw) if c.gate else None
            self.lstm = LSTM(e + d_ann, d, **kw)
            self.out_h, self.out_z = Linear(d, e, **kw), Linear(d_ann, e, **kw)  # L_h, L_z
            self.out = Linear(e, c.vocab_size, **kw)  # L_o

    def start_decoder(self, a: Tensor) -> CaptionState:
        """The decoder's state before the first word (bos) from the annotation vectors a (b, L, D)."""
        c = self.config
        if c.decoder == "transformer":
            return CaptionState(self.memory_proj(a), caches=None)
        if c.attention == "none":
            x = self.image_proj(a.flatten(1))  # x_{-1} = W_I vec(a): (b, L D) -> (b, e)
            _, (h, c0) = self.lstm(x.unsqueeze(1))  # the image read once: (b, 1, e) -> (1, b, d) each
            return CaptionState(a, rnn=(h[0], c0[0]))
        mean = a.mean(1)  # ā (b, D)
        h0, c0 = torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))  # (b, d) each
        return CaptionState(a, keys_proj=self.attn.project_keys(a), rnn=(h0, c0))

    # ---- one word ----------------------------------------------------------------------------------------

    def _attend(self, h: Tensor, state: CaptionState) -> tuple[Tensor, Tensor]:
        """Show, Attend and Tell's context from h_{t-1} (b, d): ẑ_t (b, D) and α_t (b, L)."""
        z, alpha = self.attn(h, state.memory, keys_proj=state.keys_proj)  # (b, D), (b, L)
        if self.beta is not None:
            z = torch.sigmoid(self.beta(h)) * z  # β_t ẑ_t: (b, 1) * (b, D)
        return z, alpha

    def _deep_output(self, emb: Tensor, h: Tensor, z: Tensor) -> Tensor:
        return self.out(self.drop(emb + self.out_h(h) + self.out_z(z)))  # L_o(E y + L_h h + L_z z): (.., v)

    def _lstm_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        w_ih, w_hh, b_ih, b_hh = self.lstm._layer_params(0, False)
        return w_ih, w_hh.t(), b_ih + b_hh

    def step(self, tokens: Tensor, state: CaptionState) -> tuple[Tensor, CaptionState, Tensor | None]:
        """The previous words' last token (b,) -> logits (b, v) for the next word, the new state, α (b, L)."""
        c = self.config
        check_step_tokens("Captioner", tokens, state.memory.size(0), c.vocab_size)
        if c.decoder == "transformer":
            h, caches, w = self._decoder_stack(tokens[:, None], state.memory, state.caches, need_weights=True)
            return self._head(h[:, -1]), CaptionState(state.memory, caches=caches), w[:, :, -1].mean(1)
        emb = self.embed(tokens)  # (b, e)
        w_ih, w_hh_t, bias = self._lstm_weights()
        h, cell = state.rnn
        if c.attention == "none":
            h, cell = _lstm_update(linear(emb, w_ih, bias), h, cell, w_hh_t)
            return self.out(self.drop(h)), CaptionState(state.memory, rnn=(h, cell)), None
        z, alpha = self._attend(h, state)
        h, cell = _lstm_update(linear(torch.cat([emb, z], -1), w_ih, bias), h, cell, w_hh_t)
        logits = self._deep_output(emb, h, z)
        return logits, CaptionState(state.memory, state.keys_proj, (h, cell)), alpha

    # ---- teacher forcing -----------------------------------------------------------------------------------

    def decode(
        self, state: CaptionState, tgt_in: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """From the state before the first word, the caption so far tgt_in (b, t) (bos first) -> logits
        (b, t, v) for the next words; with ``return_attention`` also α (b, t, L), rows summing to one."""
        c, b = self.config, state.memory.size(0)
        check_token_ids(tgt_in, c.vocab_size)
        if tgt_in.dim() != 2 or tgt_in.size(0) != b or tgt_in.size(1) == 0:
            raise ValueError(
                f"tgt_in must be (b, t) with b = {b} inputs and t >= 1, got {tuple(tgt_in.shape)}"
            )
        if return_attention and c.attention == "none":
            raise ValueError(
                "this captioner has no attention (attention='none'): there are no weights to return"
            )
        if c.decoder == "transformer":
            if tgt_in.size(1) > c.max_len:
                raise ValueError(f"a caption of {tgt_in.size(1)} tokens exceeds max_len={c.max_len}")
            h, _, w = self._decoder_stack(tgt_in, state.memory, None, need_weights=return_attention)
            logits = self._head(h)
            return (logits, w.mean(1)) if return_attention else logits
        emb = self.embed(tgt_in)  # (b, t, e)
        if c.attention == "none":  # the fused LSTM over the whole caption
            top, _ = self.lstm(emb, state=tuple(s.unsqueeze(0) for s in state.rnn))  # (b, t, d)
            return self.out(self.drop(top))
        logits, alpha = self._attend_loop(emb, state)
        return (logits, alpha) if return_attention else logits

    def _attend_loop(self, emb: Tensor, state: CaptionState) -> tuple[Tensor, Tensor]:
        """Show, Attend and Tell over a whole caption: the embeddings' share of the LSTM's input projection is
        one product for all t; the context's share, the attention and the recurrence stay in the loop."""
        e = emb.size(-1)
        w_ih, w_hh_t, bias = self._lstm_weights()
        gx_emb = linear(emb, w_ih[:, :e], bias).unbind(1)  # (b, t, e) x (e, 4d) -> t x (b, 4d)
        w_z = w_ih[:, e:]  # (4d, D)
        (h, cell), hs, zs, alphas = state.rnn, [], [], []
        for gx in gx_emb:
            z, alpha = self._attend(h, state)  # from h_{t-1}
            h, cell = _lstm_update(gx + linear(z, w_z), h, cell, w_hh_t)
            hs.append(h)
            zs.append(z)
            alphas.append(alpha)
        h, z = torch.stack(hs, 1), torch.stack(zs, 1)  # (b, t, d), (b, t, D)
        return self._deep_output(emb, h, z), torch.stack(alphas, 1)  # (b, t, v), (b, t, L)

    def _decoder_stack(
        self, tokens: Tensor, memory: Tensor, caches: list | None, need_weights: bool = False
    ) -> tuple[Tensor, list, Tensor | None]:
        """The Transformer decoder over tokens (b, t) after the cached positions: (b, t, d), the caches, and
        with ``need_weights`` the last layer's cross-attention (b, h, t, L)."""
        offset = 0 if caches is None or caches[0][0] is None else int(caches[0][0].pos)
        t = tokens.size(1)
        if offset + t > self.config.max_len:
            raise ValueError(f"captions longer than max_len={self.config.max_len} tokens are not supported")
        x = self.drop(self.embed(tokens) + self.pos[offset : offset + t])  # (b, t, d)
        caches = [None] * len(self.layers) if caches is None else caches
        new, weights = [], None
        for i, (layer, cache) in enumerate(zip(self.layers, caches, strict=True)):
            if need_weights and i == len(self.layers) - 1:
                x, cache, weights = layer(x, memory, state=cache, need_weights=True)
            else:
                x, cache = layer(x, memory, state=cache)
            new.append(cache)
        return self.norm(x), new, weights

    def _head(self, h: Tensor) -> Tensor:
        return linear(h, self.embed.weight)  # tied: (.., d) x (d, v) -> (.., v)

    # ---- generation (seqlab.models.beam) -------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        images: Tensor,
        max_new_tokens: int = 24,
        beam_size: int = 1,
        length_penalty: float = 0.0,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """images (b, c, S, S) -> caption ids (b, 1 + n): bos, up to ``max_new_tokens`` words, pad after eos;
        with ``return_attention`` also α (b, n, L) along the returned captions (zeros after eos).

        ``beam_size`` 1 is greedy; wider beams are batched over images and beams and rank finished captions by
        log p / lp(|Y|) with GNMT's length penalty α = ``length_penalty`` (``seqlab.models.beam``)."""
        from seqlab.models.beam import search_model

        if return_attention and self.config.attention == "none":
            raise ValueError(
                "this captioner has no attention (attention='none'): there are no weights to return"
            )
        c = self.config
        if not isinstance(images, Tensor):  # before its batch size is read (start checks the rest)
            raise ValueError(
                f"expected images (b, c, S, S) as a tensor (a video model: frames), got {type(images).__name__}"
            )
        too_long = isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool)
        if c.decoder == "transformer" and too_long and max_new_tokens > c.max_len:
            raise ValueError(  # found before decoding, not after max_len steps of it
                f"max_new_tokens={max_new_tokens} exceeds the transformer decoder's position table, max_len="
                f"{c.max_len}"
            )
        out = search_model(
            self,
            lambda: self.start(images),
            CaptionState.select,
            batch_size=images.size(0),
            beam_size=beam_size,
            max_len=max_new_tokens,
            length_penalty=length_penalty,
            device=images.device,
        )
        return (out.tokens, out.extras) if return_attention else out.tokens
