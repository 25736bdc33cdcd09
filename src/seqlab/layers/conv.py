r"""A small convolutional encoder that turns an image into a grid of annotation vectors.

Notation: ``b`` batch, ``c`` channels, ``S`` image side, ``g = S / 2^stages`` the grid side, ``D`` the
last stage's channels.

Each stage is [conv 3×3 → BatchNorm → ReLU] × 2 → max-pool 2×2 (the VGG pattern, Simonyan & Zisserman 2015,
arXiv 1409.1556, at a size that trains on a CPU); the grid it leaves is what Show, Attend and Tell calls the
annotation vectors a_1 ... a_L, L = g², each D-dimensional and looking at one region of the image (Xu et al.
2015, arXiv 1502.03044, section 3.1.1: "we extract features from a lower convolutional layer").
"""

from __future__ import annotations

from torch import Tensor, nn

from seqlab.layers.checks import check_dtype

__all__ = ["ConvGridEncoder"]


class ConvGridEncoder(nn.Module):
    """(b, c, S, S) images -> (b, g², D) annotation vectors in row-major grid order, g = S / 2^len(channels).

    Examples::

        >>> enc = ConvGridEncoder(3, [16, 32])
        >>> enc(torch.rand(2, 3, 32, 32)).shape
        torch.Size([2, 64, 32])
    """

    def __init__(self, in_channels: int, channels: list[int], device=None, dtype=None):
        super().__init__()
        if not channels or any(not isinstance(k, int) or k < 1 for k in channels):
            raise ValueError(f"channels must be a non-empty list of positive integers, got {channels!r}")
        kw = {"device": device, "dtype": dtype}
        stages, c_in = [], in_channels
        for c_out in channels:
            stages += [
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False, **kw),
                nn.BatchNorm2d(c_out, **kw),
                nn.ReLU(inplace=True),
                nn.Conv2d(c_out, c_out, 3, padding=1, bias=False, **kw),
                nn.BatchNorm2d(c_out, **kw),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            c_in = c_out
        self.net = nn.Sequential(*stages)
        self.in_channels, self.n_stages, self.d_out = in_channels, len(channels), channels[-1]

    def check_images(self, images: Tensor) -> None:
        """(b, in_channels, H, W) floats of the weights' dtype, H and W multiples of 2^stages (each stage halves
        them; a remainder would be cropped without a word)."""
        c, k = self.in_channels, 1 << self.n_stages
        ok = isinstance(images, Tensor) and images.dim() == 4 and images.size(1) == c
        if (
            not ok
            or images.size(-1) % k
            or images.size(-2) % k
            or images.size(-1) == 0
            or images.size(-2) == 0
        ):
            got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(
                f"ConvGridEncoder expects images (b, {c}, H, W) with H and W positive multiples of {k} "
                f"({self.n_stages} halving stages), got {got}"
            )
        check_dtype("ConvGridEncoder", images, self.net[0].weight, what="images")

    def grid(self, size: int) -> int:
        return size >> self.n_stages

    def forward(self, images: Tensor) -> Tensor:
        self.check_images(images)
        x = self.net(images)  # (b, c, S, S) -> (b, D, g, g)
        return x.flatten(2).transpose(1, 2)  # (b, g², D)
