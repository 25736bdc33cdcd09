"""``Linear``: ``nn.Linear`` whose product runs through :func:`seqlab.kernels.gemm.linear` (oneDNN for large
float32 CPU products where that library is the faster, torch's ``F.linear`` everywhere else).

The same parameters, state-dict keys, initialization and hooks as ``nn.Linear`` (it is one); seqlab's layers and
models build their projections from it.
"""

from __future__ import annotations

from torch import Tensor, nn

from seqlab.kernels.gemm import linear

__all__ = ["Linear", "linear"]


class Linear(nn.Linear):
    """y = x Wᵀ + b: (..., in_features) -> (..., out_features), as ``nn.Linear``."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
