r"""The decoding half of :class:`seqlab.models.captioner.Captioner`: its state, Show, Attend and Tell's
teacher-forced loop with the embeddings' projection hoisted out of it, the Transformer decoder stack, and
generation through the shared beam search (``seqlab.models.beam``).

Notation as in ``seqlab.models.captioner``: ``b`` batch, ``L`` regions, ``D`` annotation width, ``t`` caption
positions, ``e`` d_embed, ``d`` d_model, ``v`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.layers.attention import KVCache
from seqlab.layers.recurrent_cells import _lstm_update

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
    """Teacher-forced attention loop, Transformer decoder stack and generation for the Captioner (which
    supplies start, step, embed, layers, norm, pos, drop, _attend, _deep_output and _lstm_weights)."""

    def _attend_loop(self, emb: Tensor, state: CaptionState) -> tuple[Tensor, Tensor]:
        """Show, Attend and Tell over a whole caption: the embeddings' share of the LSTM's input projection is
        one product for all t; the context's share, the attention and the recurrence stay in the loop."""
        e = emb.size(-1)
        w_ih, w_hh_t, bias = self._lstm_weights()
        gx_emb = F.linear(emb, w_ih[:, :e], bias).unbind(1)  # (b, t, e) x (e, 4d) -> t x (b, 4d)
        w_z = w_ih[:, e:]  # (4d, D)
        (h, cell), hs, zs, alphas = state.rnn, [], [], []
        for gx in gx_emb:
            z, alpha = self._attend(h, state)  # from h_{t-1}
            h, cell = _lstm_update(gx + F.linear(z, w_z), h, cell, w_hh_t)
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
        return F.linear(h, self.embed.weight)  # tied: (.., d) x (d, v) -> (.., v)

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
