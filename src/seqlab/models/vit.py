r"""The Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", arXiv 2010.11929).

Notation: ``b`` batch, ``c`` channels, ``H``, ``W`` image size, ``P`` patch side, ``n`` patches, ``T`` tokens
(n + 1 with a class token, else n), ``d`` d_model, ``h`` heads, ``L`` layers, ``K`` classes.

An image becomes a sequence of patch tokens and a plain pre-norm Transformer encoder reads it (eqs. 1-4):

    z_0 = [x_class; x_p^1 E; ...; x_p^n E] + E_pos            E: the patch embedding, E_pos (T, d)
    z'_l = z_{l-1} + MSA(LN(z_{l-1}))                          l = 1 ... L
    z_l  = z'_l + MLP(LN(z'_l))                                MLP: two layers with the exact (erf) GELU
    y    = LN(z_L^0)                                           the class token's final state ('cls' pooling)
    logits = y W_head

Choices beside the paper's defaults, all config fields:
- ``pool='mean'``: no class token; y = mean over the patches of LN(z_L) (global average pooling, the
  paper's appendix D.3 and Beyer et al. 2022, arXiv 2205.01580, which train better from scratch).
- ``position='sincos'``: fixed 2-D sinusoidal positions (MAE's layout, ``seqlab.layers.positional``), the
  class token's position zero. 'learned' is the paper's 1-D table of T rows, N(0, 0.02).
- Another image size at inference: the patch grid changes; a learned table is resized by bicubic
  interpolation (section 3.2), a sinusoidal one recomputed. Sides the patch size does not divide are refused.
- ``pooler=True`` adds Hugging Face ``ViTModel``'s tanh layer on the class token (BERT's pooler), so such
  checkpoints load whole; the paper's fine-tuning head has none.

Blocks are :class:`seqlab.layers.transformer_blocks.TransformerEncoderLayer` in pre-norm (the LM stack's
block with a bidirectional attention mixer). Initialization: N(0, 0.02) for every projection, the class token
and the learned positions, zero biases (Hugging Face's ``ViTPreTrainedModel``, truncated there at 2σ).

Interface: ``model(images (b, c, H, W)) -> logits (b, K)`` (``n_classes=0``: the pooled features (b, d));
``model.features(images) -> (b, T, d)``, the normalized token states an image captioner attends to;
``model.attention_maps(images) -> (L, b, h, T, T)``.

With 'cls' pooling ``forward`` computes the last layer for the class token alone (its query against every
token's key and value; ``TransformerEncoderLayer.forward_first``): nothing else of that layer reaches the
logits, so the same numbers cost about 10/12 of a layer less (L = 6: a seventh of the products).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from seqlab.layers.fastpath import hook_reason
from seqlab.layers.linear import Linear
from seqlab.layers.norms import LayerNorm
from seqlab.layers.patch import PatchEmbedding, interpolate_grid_positions
from seqlab.layers.positional import sinusoidal_2d_table
from seqlab.layers.transformer_blocks import TransformerEncoderLayer
from seqlab.models.init import normal_init_
from seqlab.validation import (
    check_choices,
    check_divisible,
    check_dropout,
    check_nonnegative,
    check_positive_floats,
    check_positive_ints,
)

__all__ = ["PRESETS", "ViT", "ViTConfig"]


@dataclass
class ViTConfig:
    image_size: int = 32
    """Side of the (square) training images; other sizes work at inference through position interpolation."""
    patch_size: int = 4
    in_channels: int = 3
    n_classes: int = 10
    """Classes of the head; 0: no head, the model returns the pooled features (a backbone)."""
    d_model: int = 192
    n_layers: int = 6
    n_heads: int = 3
    d_ff: int | None = None
    """MLP width; None means 4 * d_model (every ViT of the paper)."""
    pool: Literal["cls", "mean"] = "cls"
    position: Literal["learned", "sincos"] = "learned"
    dropout: float = 0.0
    """Dropout on the embeddings, the attention weights and the residual branches (training only)."""
    norm_eps: float = 1e-6
    """LayerNorm epsilon: 1e-6 as the paper's code; Hugging Face ViT configs say 1e-12."""
    bias: bool = True
    """Biases on the projections (Hugging Face's ``qkv_bias`` covers q, k, v only; seqlab's covers all)."""
    pooler: bool = False

    def __post_init__(self):
        check_choices(self)
        check_positive_ints(
            self, ("image_size", "patch_size", "in_channels", "d_model", "n_layers", "n_heads")
        )
        check_nonnegative(self, ("n_classes",), hint=" (0: no head)")
        check_positive_ints(self, ("d_ff",), allow_none=True)
        check_positive_floats(self, ("norm_eps",))
        check_dropout(self)
        check_divisible(self.d_model, self.n_heads)
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}"
            )
        if self.position == "sincos" and self.d_model % 4:
            raise ValueError(f"position='sincos' needs d_model divisible by 4, got {self.d_model}")
        if self.pooler and self.pool != "cls":
            raise ValueError("pooler=True acts on the class token: it needs pool='cls'")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_tokens(self) -> int:
        return self.grid**2 + (self.pool == "cls")


class ViT(nn.Module):
    """The Vision Transformer; see the module docstring.

    Examples::

        >>> model = ViT(ViTConfig(image_size=16, patch_size=4, d_model=32, n_layers=2, n_heads=2))
        >>> model(torch.rand(2, 3, 16, 16)).shape
        torch.Size([2, 10])
    """

    family = "vit"

    def __init__(self, config: ViTConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        self.patch_embed = PatchEmbedding(c.patch_size, c.in_channels, c.d_model, **kw)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model, **kw)) if c.pool == "cls" else None
        if c.position == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, c.n_tokens, c.d_model, **kw))
        else:
            self.pos_embed = None
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(
                c.d_model,
                c.n_heads,
                c.d_ff,
                dropout=c.dropout,
                activation="gelu",
                norm_first=True,
                bias=c.bias,
                norm_eps=c.norm_eps,
                **kw,
            )
            for _ in range(c.n_layers)
        )
        self.norm = LayerNorm(c.d_model, eps=c.norm_eps, **kw)
        self.pooler = Linear(c.d_model, c.d_model, **kw) if c.pooler else None
        self.head = Linear(c.d_model, c.n_classes, **kw) if c.n_classes else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        normal_init_(self)
        nn.init.normal_(self.patch_embed.proj.weight, std=0.02)
        if self.patch_embed.proj.bias is not None:
            nn.init.zeros_(self.patch_embed.proj.bias)
        for p in (self.cls_token, self.pos_embed):
            if p is not None:
                nn.init.normal_(p, std=0.02)

    # ---- positions ------------------------------------------------------------------------------------------

    def positions(self, grid: tuple[int, int]) -> Tensor:
        """The position table (T, d) for a patch grid (gh, gw): the class token's row first when there is one."""
        c = self.config
        extra = int(self.cls_token is not None)
        if self.pos_embed is None:
            table = sinusoidal_2d_table(*grid, c.d_model).to(self.norm.weight)  # (n, d)
            return torch.cat([table.new_zeros(extra, c.d_model), table]) if extra else table
        table = self.pos_embed[0]  # (T, d)
        patches = interpolate_grid_positions(table[extra:], (c.grid, c.grid), grid)  # (gh gw, d)
        return torch.cat([table[:extra], patches]) if extra else patches

    # ---- forward ----------------------------------------------------------------------------------------------

    def embed(self, images: Tensor) -> Tensor:
        """(b, c, H, W) -> z_0 (b, T, d): patch tokens, the class token first, plus positions (eq. 1)."""
        x = self.patch_embed(images)  # (b, n, d); checks the shape and the patch grid
        grid = self.patch_embed.grid(images.size(2), images.size(3))
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1)  # (b, T, d)
        return self.drop(x + self.positions(grid))  # (b, T, d) + (T, d)

    def features(self, images: Tensor) -> Tensor:
        """LN(z_L) (b, T, d): every token's final state, normalized (what a captioner's decoder attends to)."""
        z = self.embed(images)
        for layer in self.layers:
            z = layer(z)  # (b, T, d)
        return self.norm(z)

    def pool(self, hidden: Tensor) -> Tensor:
        """(b, T, d) -> (b, d): the class token's state (through the pooler if any), or the patches' mean."""
        if self.cls_token is None:
            return hidden.mean(1)
        first = hidden[:, 0]  # (b, d)
        return first if self.pooler is None else torch.tanh(self.pooler(first))

    def forward(self, images: Tensor) -> Tensor:
        if self._class_token_only():
            z = self.embed(images)
            for layer in self.layers[:-1]:
                z = layer(z)  # (b, T, d)
            pooled = self.pool(self.norm(self.layers[-1].forward_first(z, 1)))  # (b, 1, d) -> (b, d)
        else:
            pooled = self.pool(self.features(images))  # (b, d)
        return pooled if self.head is None else self.head(pooled)  # (b, K)

    def _class_token_only(self) -> bool:
        """Whether ``forward`` runs the last layer for the class token alone: with 'cls' pooling nothing else of
        that layer reaches the output (the other tokens serve as its keys and values), which saves about 10/12
        of the layer's products. Forward hooks on the last layer or the final norm see full-length inputs, so
        with any registered the whole layer runs."""
        if self.cls_token is None:
            return False
        last = self.layers[-1].named_modules(prefix=f"layers.{len(self.layers) - 1}")
        return hook_reason([*last, ("norm", self.norm)]) is None

    @torch.no_grad()
    def attention_maps(self, images: Tensor) -> Tensor:
        """The self-attention weights of every layer, (L, b, h, T, T), before dropout (evaluation)."""
        z, maps = self.embed(images), []
        for layer in self.layers:
            y, _, w = layer.self_attn(layer.norm1(z), need_weights=True)  # w: (b, h, T, T)
            z = z + y
            z = z + layer.mlp(layer.norm2(z))
            maps.append(w)
        return torch.stack(maps)


def _vit(image_size, patch_size, d_model, n_layers, n_heads, n_classes=1000, in_channels=3, **extra) -> dict:
    return dict(
        image_size=image_size,
        patch_size=patch_size,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_classes=n_classes,
        in_channels=in_channels,
        **extra,
    )


PRESETS = {
    # the paper's Table 1 at 224×224 and 1,000 classes: 86M, 307M and 632M parameters
    "vit-base-16": _vit(224, 16, 768, 12, 12),
    "vit-large-16": _vit(224, 16, 1024, 24, 16),
    "vit-huge-14": _vit(224, 14, 1280, 32, 16),
    # trainable here: Fashion-MNIST (28×28 grey, a 4×4 grid of 7×7 patches) and scikit-learn's 8×8 digits
    "vit-fashion": _vit(28, 7, 128, 6, 4, n_classes=10, in_channels=1),
    "vit-digits": _vit(8, 2, 64, 4, 4, n_classes=10, in_channels=1, pool="mean", position="sincos"),
    "vit-tiny-p4": _vit(32, 4, 192, 12, 3, n_classes=10),
    "test-vit": _vit(16, 4, 32, 2, 2, n_classes=10),
    "test-vit-mean": _vit(16, 4, 32, 2, 2, n_classes=10, pool="mean", position="sincos"),
}
