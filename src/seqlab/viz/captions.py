"""Where a captioner looks as it writes: one panel per generated word, its attention over the image (the figure
of Show, Attend and Tell, Xu et al. 2015, arXiv 1502.03044, Figures 2-3).

Notation: ``n`` words, ``L = g²`` image regions on a g × g grid, ``S`` image side.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn.functional as F
from torch import Tensor

from seqlab.viz.figures import pyplot, save_figure

__all__ = ["attention_over_image", "caption_figure_data", "plot_caption_attention"]


def attention_over_image(alpha: Tensor, size: int) -> Tensor:
    """Attention over L = g² regions (.., L) -> maps over an S × S image (.., S, S), bilinearly upsampled and
    rescaled so each map still sums to its weights' sum (the regions' mass spread over their pixels)."""
    lead, regions = alpha.shape[:-1], alpha.shape[-1]
    g = round(regions**0.5)
    if g * g != regions:
        raise ValueError(f"attention over {regions} regions is not a square grid")
    grid = alpha.reshape(-1, 1, g, g).float()  # (N, 1, g, g)
    maps = F.interpolate(grid, size=(size, size), mode="bilinear", align_corners=False)  # (N, 1, S, S)
    return maps.reshape(*lead, size, size) * (g * g) / (size * size)


def plot_caption_attention(
    image: Tensor, words: list[str], alpha: Tensor, path: str | Path, title: str = "", columns: int = 6
) -> Path:
    """The image, then one panel per word with its attention map over the image (brighter: more weight).

    image: uint8 or [0, 1] float (3, S, S) or (S, S); words: the n generated words (eos included if any);
    alpha: (n, L) the attention at each word, L a square grid of regions.
    """
    if alpha.dim() != 2 or alpha.size(0) != len(words):
        raise ValueError(f"alpha must be (words, regions) = ({len(words)}, L), got {tuple(alpha.shape)}")
    pixels = image.float() / 255.0 if not image.is_floating_point() else image.float().clamp(0, 1)
    pixels = pixels.permute(1, 2, 0) if pixels.dim() == 3 else pixels  # (S, S, 3) or (S, S)
    maps = attention_over_image(alpha.detach().cpu(), pixels.shape[0])  # (n, S, S)
    plt = pyplot()
    panels = len(words) + 1
    rows = -(-panels // columns)
    fig, axes = plt.subplots(rows, min(columns, panels), figsize=(2.0 * min(columns, panels), 2.2 * rows))
    axes = [axes] if panels == 1 else list(getattr(axes, "flat", axes))
    axes[0].imshow(pixels.numpy(), cmap="gray" if pixels.dim() == 2 else None)
    axes[0].set_title("image", fontsize=9)
    for ax, word, m in zip(axes[1:], words, maps, strict=False):
        ax.imshow(pixels.numpy(), cmap="gray" if pixels.dim() == 2 else None)
        ax.imshow((m / m.max().clamp_min(1e-12)).numpy(), cmap="magma", alpha=0.6, vmin=0, vmax=1)
        ax.set_title(word, fontsize=10)
    for ax in axes:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def caption_figure_data(
    model, task_prepare, image_uint8: Tensor, beam_size: int = 1, max_new_tokens: int = 24
):
    """(generated ids (1 + n,), attention (n, L)) of one uint8 image (3, S, S), through ``model.generate``."""
    x = task_prepare(image_uint8.unsqueeze(0))
    ids, alpha = model.generate(x, max_new_tokens=max_new_tokens, beam_size=beam_size, return_attention=True)
    n = int((ids[0, 1:] != 0).sum())
    return ids[0, : n + 1], alpha[0, :n]
