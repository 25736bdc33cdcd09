"""``Linear``: ``nn.Linear`` whose product runs through :func:`seqlab.kernels.gemm.linear` (oneDNN for large
float32 CPU products where that library is the faster, torch's ``F.linear`` everywhere else).

The same parameters, state-dict keys, initialization and hooks as ``nn.Linear`` (it is one); seqlab's layers and
models build their projections from it. An input of the wrong width, dtype or device is a ValueError naming the
layer and what it expects (``nn.Linear`` leaves torch's matmul message).
"""

from __future__ import annotations

from torch import Tensor, nn

from seqlab.kernels.gemm import linear
from seqlab.layers.checks import check_last_axis

__all__ = ["Linear", "linear"]


class Linear(nn.Linear):
    """y = x Wᵀ + b: (..., in_features) -> (..., out_features), as ``nn.Linear``."""

    def forward(self, x: Tensor) -> Tensor:
        try:
            return linear(x, self.weight, self.bias)
        except (
            RuntimeError,
            TypeError,
        ):  # torch's words; where x is the cause, seqlab's (no cost when it runs)
            check_last_axis("Linear", x, self.weight, self.in_features)
            raise
