r"""Attention over images: what a Vision Transformer's queries read from the patch grid, per head and rolled out.

Notation: ``L`` layers, ``b`` batch, ``h`` heads, ``T`` tokens (n + 1 with a class token, else n), ``n = gh gw``
patches in row-major order (patch ``r gw + col``), ``c, H, W`` an image's channels, height and width.

Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", arXiv 2005.00928,
section 3): a layer's output at token i is its residual input plus attention over the tokens, so the
layer's token-to-token mixing is modelled as

    A_l = 0.5 W̄_l + 0.5 I,   rows renormalized to sum to one          W̄_l: the heads' weights fused (mean)
    R_1 = A_1,   R_l = A_l R_{l-1}   (l = 2 ... L)                      R = A_L ... A_2 A_1

and row i of R_L says how much of the final token i comes from each input token (each image patch, and the
class token's own embedding). Head fusion: the paper averages the heads; ``max`` and ``min`` are the common
variants (e.g. Jacob Gildenblat's ``vit-explain``). ``residual=False`` drops the identity, the raw product
of the attention weights, which the paper shows to wash out after a few layers.

The maps come from :meth:`seqlab.models.vit.ViT.attention_maps`, (L, b, h, T, T), rows summing to one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.viz.figures import pyplot, save_figure

__all__ = ["attention_rollout", "patch_grid_map", "plot_vit_attention"]

HeadFusion = Literal["mean", "max", "min"]


def _check_maps(maps: Tensor, dims: int, what: str) -> None:
    if maps.dim() != dims or maps.size(-1) != maps.size(-2):
        raise ValueError(
            f"{what} must be {dims}-D with square token axes (..., T, T), got {tuple(maps.shape)}"
        )


def attention_rollout(maps: Tensor, head_fusion: HeadFusion = "mean", residual: bool = True) -> Tensor:
    """Attention rollout (module docstring): maps (L, b, h, T, T) -> R (b, T, T), each row a distribution.

    Examples::

        >>> maps = torch.rand(2, 1, 4, 5, 5).softmax(-1)     # (L, b, h, T, T)
        >>> torch.allclose(attention_rollout(maps).sum(-1), torch.ones(1, 5))   # (b, T): rows sum to one
        True
    """
    _check_maps(maps, 5, "maps (L, b, h, T, T)")
    if head_fusion == "mean":
        fused = maps.mean(2)  # (L, b, T, T)
    elif head_fusion in ("max", "min"):
        fused = maps.amax(2) if head_fusion == "max" else maps.amin(2)  # (L, b, T, T)
    else:
        raise ValueError(f"head_fusion must be one of ('mean', 'max', 'min'), got {head_fusion!r}")
    t = maps.size(-1)
    if residual:
        fused = 0.5 * fused + 0.5 * torch.eye(t, dtype=fused.dtype, device=fused.device)  # (L, b, T, T)
    fused = fused / fused.sum(-1, keepdim=True).clamp_min(torch.finfo(fused.dtype).tiny)  # rows renormalized
    rollout = fused[0]  # (b, T, T)
    for a in fused[1:]:
        rollout = a @ rollout  # (b, T, T) x (b, T, T) -> (b, T, T): layer l applied after layers 1 ... l-1
    return rollout


def patch_grid_map(row: Tensor, grid: tuple[int, int], has_cls: bool) -> Tensor:
    """One query's attention row (T,) -> (gh, gw) over the patch grid; the class token's column is dropped."""
    gh, gw = grid
    expected = gh * gw + int(has_cls)
    if row.dim() != 1 or row.numel() != expected:
        raise ValueError(
            f"a row of {tuple(row.shape)} does not fit a {gh}×{gw} grid "
            f"{'with' if has_cls else 'without'} a class token: expected ({expected},)"
        )
    return row[int(has_cls) :].reshape(gh, gw)  # (gh, gw), row-major patches


def _display_image(image: Tensor):
    """(c, H, W) float or uint8 -> an (H, W) or (H, W, 3) array in [0, 1] for imshow."""
    if image.dim() != 3 or image.size(0) not in (1, 3):
        raise ValueError(f"image must be (c, H, W) with 1 or 3 channels, got {tuple(image.shape)}")
    if image.dtype == torch.uint8:
        img = image.float() / 255.0
    elif image.is_floating_point():
        img = image.detach().float()
        lo, hi = img.min(), img.max()
        if lo < 0 or hi > 1:  # normalized inputs: stretch to [0, 1] for display only
            img = (img - lo) / (hi - lo).clamp_min(1e-12)
    else:
        raise ValueError(f"image must be float or uint8, got {image.dtype}")
    img = img.cpu()
    return img[0].numpy() if img.size(0) == 1 else img.permute(1, 2, 0).numpy()


def _upsample(grid_map: Tensor, size: tuple[int, int], mode: str):
    """(gh, gw) -> (H, W) for an overlay, nearest (the patches as blocks) or bilinear."""
    kw = {"align_corners": False} if mode == "bilinear" else {}
    return F.interpolate(grid_map[None, None].float(), size=size, mode=mode, **kw)[0, 0].cpu().numpy()


def _check_inputs(image: Tensor, maps: Tensor, grid, has_cls: bool, layer: int, query) -> tuple[Tensor, int]:
    """maps as (L, h, T, T) for one image, and the query's row index; ValueErrors that say what to fix."""
    if maps.dim() == 5:
        if maps.size(1) != 1:
            raise ValueError(f"maps hold {maps.size(1)} images (L, b, h, T, T): pass one, maps[:, i : i + 1]")
        maps = maps[:, 0]
    _check_maps(maps, 4, "maps (L, h, T, T) or (L, 1, h, T, T)")
    gh, gw = grid
    n_patches, t = gh * gw, maps.size(-1)
    if t != n_patches + int(has_cls):
        raise ValueError(
            f"maps have T={t} tokens but a {gh}×{gw} grid {'with' if has_cls else 'without'} a class token "
            f"has {n_patches + int(has_cls)}: check grid and has_cls"
        )
    if not -maps.size(0) <= layer < maps.size(0):
        raise ValueError(f"layer {layer} out of range for {maps.size(0)} layers")
    height, width = image.shape[-2:]
    if height % gh or width % gw:
        raise ValueError(f"an image of {height}×{width} is not a {gh}×{gw} grid of whole patches")
    if query == "cls":
        if not has_cls:
            raise ValueError("query='cls' needs a class token (has_cls=True); give a patch index instead")
        return maps, 0
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < n_patches:
        raise ValueError(f"query must be 'cls' or a patch index in [0, {n_patches}), got {query!r}")
    return maps, query + int(has_cls)


def plot_vit_attention(
    image: Tensor,
    maps: Tensor,
    grid: tuple[int, int],
    path: str | Path,
    has_cls: bool = True,
    layer: int = -1,
    query: Literal["cls"] | int = "cls",
    upsample: Literal["nearest", "bilinear"] = "nearest",
    alpha: float = 0.6,
) -> Path:
    """One PNG: the image, the chosen layer's attention of ``query`` over the patches for each head, overlaid
    on the image, and the attention rollout of all layers for the same query.

    image (c, H, W) float or uint8 (c = 1 or 3); maps (L, h, T, T), or (L, 1, h, T, T) as
    ``ViT.attention_maps`` returns for one image; grid (gh, gw) the patch grid; ``query`` 'cls' (the class
    token) or a patch index (row-major). Each overlay is scaled to its own range (the class token's column
    dropped). Returns the path (its folder is created).
    """
    if upsample not in ("nearest", "bilinear"):
        raise ValueError(f"upsample must be 'nearest' or 'bilinear', got {upsample!r}")
    shown = _display_image(image)
    maps, q = _check_inputs(image, maps, grid, has_cls, layer, query)
    size = tuple(image.shape[-2:])
    maps = maps.detach().float().cpu()
    heads = [patch_grid_map(maps[layer, i, q], grid, has_cls) for i in range(maps.size(1))]  # h x (gh, gw)
    rolled = patch_grid_map(attention_rollout(maps[:, None])[0, q], grid, has_cls)  # (gh, gw)
    panels = [
        ("image", None),
        *[(f"head {i}", m) for i, m in enumerate(heads)],
        ("rollout, all layers", rolled),
    ]

    plt = pyplot()
    cols = min(len(panels), 6)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.6 * rows), squeeze=False)
    cmap = "gray" if shown.ndim == 2 else None
    for ax, (title, grid_map) in zip(axes.flat, panels, strict=False):
        ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0)
        if grid_map is not None:
            ax.imshow(_upsample(grid_map, size, upsample), cmap="inferno", alpha=alpha)
        ax.set_title(title, fontsize=9)
    for ax in axes.flat:
        ax.axis("off")
    who = "class token" if query == "cls" else f"patch {query}"
    n_layers = maps.size(0)
    fig.suptitle(
        f"attention of the {who}: layer {layer % n_layers} of {n_layers} per head; rollout", fontsize=10
    )
    return save_figure(fig, path, dpi=100)
