r"""Image captioning, one image to many words: Show and Tell, Show, Attend and Tell, and a ViT-to-Transformer model.

Notation: ``b`` batch, ``L`` image regions (the annotation grid, g² of them), ``D`` annotation width,
``t`` caption positions, ``e`` d_embed, ``d`` d_model (the decoder), ``v`` vocabulary.

Encoder (``encoder``), an image to annotation vectors a (b, L, D):
* 'cnn' — :class:`seqlab.layers.conv.ConvGridEncoder`, a grid of g × g regions of a small VGG-style network;
  a position per region is added (see deviations);
* 'vit' — the Vision Transformer's normalized patch tokens (:class:`seqlab.models.vit.ViT`, mean pooling, so
  there is no class token and every token is a patch: L = (S / P)²).

Decoder (``decoder`` and ``attention``):

* 'lstm' + 'none' — Show and Tell (Vinyals et al. 2015, arXiv 1411.4555, eqs. 10-12): the image is the
  LSTM's input once, before the first word, and never again (the bottleneck):
      x_{-1} = W_I vec(a);   (h, c)_{-1} = LSTM(x_{-1}, 0);   h_t = LSTM(E y_{t-1}, h_{t-1});   logits = W_o h_t
* 'lstm' + 'soft' — Show, Attend and Tell (Xu et al. 2015, arXiv 1502.03044), soft deterministic attention:
      h_0, c_0 = tanh(W_h ā), tanh(W_c ā),  ā = mean_i a_i                                      (section 3.1.2)
      e_ti = w_aᵀ tanh(W_a a_i + U_a h_{t-1}),  α_t = softmax_i(e_t)                                   (eq. 4-5)
      β_t = σ(f_β(h_{t-1})),  ẑ_t = β_t Σ_i α_ti a_i           (the gating scalar, section 4.2.1)
      h_t, c_t = LSTM([E y_{t-1}; ẑ_t], (h_{t-1}, c_{t-1}))                                          (eq. 1-3)
      logits = L_o dropout(E y_{t-1} + L_h h_t + L_z ẑ_t)                      (the deep output, eq. 7)
  and the doubly stochastic regularization λ Σ_i (1 − Σ_t α_ti)² (eq. 14), which the captioning task adds to
  the loss with λ = ``config.attention_penalty`` from the weights ``forward(..., return_attention=True)``.
* 'transformer' (+ 'soft') — the VLM step: a pre-norm causal Transformer decoder whose cross-attention reads
  the image tokens (Vaswani et al. 2017's decoder over ViT patches, the shape of later vision–language
  models); learned positions, tied output embedding. Its attention for pictures is the last layer's
  cross-attention averaged over heads.

Deviations: the paper's annotations come from a pretrained VGG's conv5_4 without position information beyond
what the features carry; here the network trains from scratch on small images, and 'cnn' adds a position
vector to every region (``region_position``: fixed 2-D sines by default, or learned) so that the spatial
relations a caption names ("left of", "above") can be read from what the attention picks: the context ẑ_t
then carries where it looked. (A learned table starting at N(0, 0.02) is too small beside the features to
matter early: on the 64×64 scenes, after 450 steps, the relation was read back right for 0.27 of the
captions with a learned table and 0.70 with the sines, colours and shapes alike.) The ViT has its own positions. Show and Tell's image vector is the
flattened grid through one linear map (a fully connected layer over the feature map, as a VGG's fc layers
see it) rather than a pooled GoogLeNet feature: one vector either way, the bottleneck that attention removes.

Interface: ``model(images (b, c, S, S), tgt_in (b, t), return_attention=False) -> logits (b, t, v)
[, α (b, t, L)]``; ``start(images) -> CaptionState``; ``step(tokens (b,), state) -> (logits (b, v), state,
α (b, L) or None)``, O(1) in the caption length for the LSTMs; ``generate(images, max_new_tokens, beam_size,
length_penalty, return_attention)`` through the beam search every encoder–decoder shares
(``seqlab.models.beam``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from seqlab.layers.conv import ConvGridEncoder
from seqlab.layers.positional import sinusoidal_2d_table
from seqlab.models.captioner_decode import CaptionDecodeMixin, CaptionState
from seqlab.models.vit import ViT, ViTConfig
from seqlab.validation import (
    check_choices,
    check_divisible,
    check_dropout,
    check_nonnegative,
    check_positive_ints,
    check_special_ids,
)

__all__ = ["PRESETS", "CaptionState", "Captioner", "CaptionerConfig"]


@dataclass
class CaptionerConfig:
    vocab_size: int = 64
    image_size: int = 64
    in_channels: int = 3
    encoder: Literal["cnn", "vit"] = "cnn"
    decoder: Literal["lstm", "transformer"] = "lstm"
    attention: Literal["none", "soft"] = "soft"
    """'none': Show and Tell (LSTM decoder only); 'soft': attention over the regions at every word."""
    channels: list[int] = field(default_factory=lambda: [32, 64, 128])
    """'cnn': channels of each stage; the grid side is image_size / 2^stages."""
    region_position: Literal["sincos", "learned"] = "sincos"
    """'cnn': the position added to each region's annotation: fixed 2-D sines (MAE's table) or learned."""
    patch_size: int = 8
    """'vit': the patch side (L = (image_size / patch_size)²)."""
    d_encoder: int = 128
    """'vit': the ViT's width (the annotation width D); 'cnn' uses channels[-1]."""
    n_encoder_layers: int = 4
    n_encoder_heads: int = 4
    d_model: int = 256
    """The decoder's width: the LSTM's hidden size, or the Transformer decoder's d_model."""
    d_embed: int | None = None
    """Word embedding width for the LSTM decoders; None: d_model (the Transformer always uses d_model)."""
    d_attn: int | None = None
    """Hidden width of the additive attention score; None: d_model."""
    n_decoder_layers: int = 2
    n_heads: int = 4
    max_len: int = 32
    """The longest caption the Transformer decoder's positions cover, bos included."""
    dropout: float = 0.1
    gate: bool = True
    """Show, Attend and Tell's gating scalar β_t on the context."""
    attention_penalty: float = 0.1
    """λ of the doubly stochastic regularization λ mean_i (1 − Σ_t α_ti)² (soft LSTM attention; 0: none). 0.1, not
    the paper's 1: beside a cross-entropy averaged per word, λ = 1 pulls each region's attention toward an equal
    share strongly enough to keep Show, Attend and Tell from learning the spatial relations of the generated
    scenes in 3 of 4 seeds (exact captions 0.72-0.73 against 0.93; 0.92-0.94 in all four at 0.1,
    ``benchmarks/results/captioning-attention-penalty-*.md``)."""
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        check_choices(self)
        check_positive_ints(
            self,
            (
                "vocab_size",
                "image_size",
                "in_channels",
                "patch_size",
                "d_encoder",
                "n_encoder_layers",
                "n_encoder_heads",
                "d_model",
                "n_decoder_layers",
                "n_heads",
                "max_len",
            ),
        )
        check_positive_ints(self, ("d_embed", "d_attn"), allow_none=True)
        check_dropout(self)
        self.channels = list(self.channels)
        if self.encoder == "cnn" and self.image_size % (1 << len(self.channels)):
            raise ValueError(
                f"image_size={self.image_size} must be divisible by 2^{len(self.channels)} "
                f"(one halving per CNN stage of channels={self.channels})"
            )
        if self.encoder == "vit" and self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}"
            )
        if self.decoder == "transformer":
            if self.attention != "soft":
                raise ValueError(
                    "the Transformer decoder reads the image through cross-attention: attention='soft'"
                )
            check_divisible(self.d_model, self.n_heads)
        check_nonnegative(self, ("attention_penalty",), numbers=True)
        check_special_ids(self, self.vocab_size)

    @property
    def grid(self) -> int:
        if self.encoder == "cnn":
            return self.image_size >> len(self.channels)
        return self.image_size // self.patch_size


class Captioner(CaptionDecodeMixin, nn.Module):
    """An image captioner; see the module docstring.

    Examples::

        >>> model = Captioner(CaptionerConfig(vocab_size=20, image_size=16, channels=[8, 16], d_model=32))
        >>> logits, alpha = model(torch.rand(2, 3, 16, 16), torch.ones(2, 5, dtype=torch.long), return_attention=True)
        >>> logits.shape, alpha.shape
        (torch.Size([2, 5, 20]), torch.Size([2, 5, 16]))
    """

    family = "captioner"

    def __init__(self, config: CaptionerConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        if c.encoder == "cnn":
            self.cnn = ConvGridEncoder(c.in_channels, c.channels, **kw)
            if c.region_position == "learned":
                self.region_pos = nn.Parameter(torch.randn(c.grid**2, c.channels[-1], **kw) * 0.02)
            else:  # fixed: each region's row and column as 2-D sines, at the scale of the features from the start
                table = sinusoidal_2d_table(c.grid, c.grid, c.channels[-1]).to(device=device, dtype=dtype)
                self.register_buffer("region_pos", table, persistent=False)
            d_ann = c.channels[-1]
        else:
            vit = ViTConfig(
                image_size=c.image_size,
                patch_size=c.patch_size,
                in_channels=c.in_channels,
                n_classes=0,  # a backbone: the tokens, no head
                d_model=c.d_encoder,
                n_layers=c.n_encoder_layers,
                n_heads=c.n_encoder_heads,
                pool="mean",  # no class token: every token is a patch the decoder can attend to
                position="sincos",
                dropout=c.dropout,
            )
            self.vit = ViT(vit, **kw)
            d_ann = c.d_encoder
        self.d_ann = d_ann
        self._build_decoder(d_ann, c.grid**2, **kw)

    # ---- the image ------------------------------------------------------------------------------------------

    def check_images(self, images: Tensor) -> Tensor:
        c = self.config
        want = (c.in_channels, c.image_size, c.image_size)
        if not isinstance(images, Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != want:
            got = (
                f"{images.dtype} {tuple(images.shape)}"
                if isinstance(images, Tensor)
                else type(images).__name__
            )
            raise ValueError(f"expected images (b, {', '.join(map(str, want))}) as floats, got {got}")
        if not images.is_floating_point():
            raise ValueError(f"images must be floats (standardized pixels), got {images.dtype}")
        return images

    def encode(self, images: Tensor) -> Tensor:
        """(b, c, S, S) -> the annotation vectors a (b, L, D)."""
        images = self.check_images(images)
        if self.config.encoder == "cnn":
            return self.cnn(images) + self.region_pos  # (b, L, D) + (L, D)
        return self.vit.features(images)  # (b, L, D)

    def start(self, images: Tensor) -> CaptionState:
        """The decoder's state before the first word (bos): the image read, the initial recurrent state."""
        return self.start_decoder(self.encode(images))  # (b, c, S, S) -> a (b, L, D) -> the state

    # ---- teacher forcing -----------------------------------------------------------------------------------

    def forward(
        self, images: Tensor, tgt_in: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """images (b, c, S, S), the caption so far tgt_in (b, t) (bos first) -> logits (b, t, v) for the next
        words; with ``return_attention`` also α (b, t, L), each row summing to one over the regions."""
        return self.decode(self.start(images), tgt_in, return_attention)


def _preset(**fields) -> dict:
    return fields


PRESETS = {
    # the three contenders of `seqlab compare --suite captioning`, for 64×64 scenes (an 8×8 grid of regions)
    "show-tell": _preset(encoder="cnn", decoder="lstm", attention="none", d_model=256),
    "show-attend-tell": _preset(encoder="cnn", decoder="lstm", attention="soft", d_model=256),
    "vit-captioner": _preset(encoder="vit", decoder="transformer", patch_size=8, d_encoder=128, d_model=128),
    "test-show-tell": _preset(
        vocab_size=24, image_size=16, channels=[8, 16], attention="none", d_model=32, dropout=0.0
    ),
    "test-show-attend-tell": _preset(vocab_size=24, image_size=16, channels=[8, 16], d_model=32, dropout=0.0),
    "test-vit-captioner": _preset(
        vocab_size=24,
        image_size=16,
        encoder="vit",
        decoder="transformer",
        patch_size=4,
        d_encoder=32,
        n_encoder_layers=1,
        n_encoder_heads=2,
        d_model=32,
        n_heads=2,
        n_decoder_layers=1,
        dropout=0.0,
    ),
}
