r"""Images as token sequences: patch embedding and position tables for a grid of patches.

Notation: ``b`` batch, ``c`` image channels, ``H``, ``W`` image height and width, ``P`` patch side,
``gh = H / P``, ``gw = W / P`` the patch grid, ``n = gh gw`` patches, ``d`` model width.

Patch embedding (Dosovitskiy et al. 2021, arXiv 2010.11929, eq. 1): the image is cut into non-overlapping
P × P patches, each flattened and projected, x_p^i E with E ∈ R^{(P² c) × d}. A convolution with kernel and
stride P computes exactly that product for every patch at once (the layout of the reference code and of
Hugging Face's ``ViTPatchEmbeddings``); patches come out in row-major order, patch ``r * gw + col``.

Positions for another image size: a learned table trained on a (gh, gw) grid is resized to the new grid by
bicubic interpolation of the table seen as a d-channel image (the paper's section 3.2, "2D interpolation of
the pre-trained position embeddings"); 2-D sinusoidal tables are simply recomputed for the new grid.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.checks import check_dtype
from seqlab.layers.fastpath import hook_reason
from seqlab.layers.linear import linear
from seqlab.validation import check_positive_ints

__all__ = ["PatchEmbedding", "interpolate_grid_positions"]


class PatchEmbedding(nn.Module):
    r"""(b, c, H, W) images -> (b, n, d) patch tokens, n = (H / P)(W / P), in row-major patch order.

        tokens[:, r gw + col] = W · vec(image[:, :, r P:(r+1) P, col P:(col+1) P]) + bias

    The weight is a Conv2d kernel (d, c, P, P) (Hugging Face ``patch_embeddings.projection``). Images whose
    sides P does not divide are refused with the sizes that would fit, never cropped silently.

    Examples::

        >>> embed = PatchEmbedding(patch_size=4, in_channels=3, d_model=32)
        >>> embed(torch.zeros(2, 3, 16, 16)).shape
        torch.Size([2, 16, 32])
    """

    def __init__(
        self, patch_size: int, in_channels: int, d_model: int, bias: bool = True, device=None, dtype=None
    ):
        super().__init__()
        sizes = SimpleNamespace(patch_size=patch_size, in_channels=in_channels, d_model=d_model)
        check_positive_ints(sizes, ("patch_size", "in_channels", "d_model"))
        self.patch_size, self.in_channels = patch_size, in_channels
        self.proj = nn.Conv2d(
            in_channels, d_model, patch_size, stride=patch_size, bias=bias, device=device, dtype=dtype
        )

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid (gh, gw) of an image of the given size; a ValueError if P does not divide a side."""
        p = self.patch_size
        if height % p or width % p:
            fit = lambda s: f"{(s // p) * p} or {(s // p + 1) * p}"  # noqa: E731
            raise ValueError(
                f"image size {height}×{width} is not a multiple of the patch size {p}: resize the images "
                f"(height {fit(height)}, width {fit(width)}) or choose a patch size that divides both sides"
            )
        return height // p, width // p

    def forward(self, images: Tensor) -> Tensor:
        if images.dim() != 4 or images.size(1) != self.in_channels or not images.is_floating_point():
            raise ValueError(
                f"expected float images (b, {self.in_channels}, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        check_dtype("PatchEmbedding", images, self.proj.weight, "images")
        gh, gw = self.grid(images.size(2), images.size(3))
        if images.device.type != "cpu" or hook_reason([("proj", self.proj)]) is not None:
            x = self.proj(images)  # (b, c, H, W) -> (b, d, gh, gw)
            return x.flatten(2).transpose(1, 2)  # (b, gh gw, d)
        # on the CPU the same product as one matrix multiply over the patches laid out as rows, 1.2-2x faster
        # than the convolution forward and backward (the patches' (c, P, P) order is the kernel's)
        b, c, p = images.size(0), self.in_channels, self.patch_size
        rows = images.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p)
        weight = self.proj.weight
        return linear(rows, weight.view(weight.size(0), -1), self.proj.bias)  # (b, gh gw, d)


def interpolate_grid_positions(table: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int]) -> Tensor:
    """A (gh gw, d) position table of a patch grid resized to another grid by bicubic interpolation.

    The table is read as a d-channel image of the old grid (row-major) and resampled (``align_corners=False``,
    as Hugging Face's ``interpolate_pos_encoding``); the same grid returns the table unchanged.
    """
    (gh, gw), (nh, nw) = old_grid, new_grid
    for name, grid in (("old_grid", old_grid), ("new_grid", new_grid)):
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in grid):
            raise ValueError(f"{name} must be two positive integers (rows, columns) of patches, got {grid!r}")
    if table.size(0) != gh * gw:
        raise ValueError(f"a table of {table.size(0)} rows is not a {gh}×{gw} grid")
    if (gh, gw) == (nh, nw):
        return table
    d = table.size(1)
    img = table.reshape(1, gh, gw, d).permute(0, 3, 1, 2)  # (1, d, gh, gw)
    img = F.interpolate(
        img.to(torch.promote_types(img.dtype, torch.float32)),
        size=(nh, nw),
        mode="bicubic",
        align_corners=False,
    ).to(table.dtype)
    return img.permute(0, 2, 3, 1).reshape(nh * nw, d)  # (nh nw, d)
