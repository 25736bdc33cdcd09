"""Normalization layers: LayerNorm (Ba et al. 2016, arXiv 1607.06450) and RMSNorm (Zhang & Sennrich 2019,
arXiv 1910.07467).

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias
    RMSNorm(x)   = x / sqrt(mean(x²) + eps) * weight             # no centring, no bias

Both normalize over the last dimension. ``make_norm`` resolves the config string.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.kernels.layer_norm import layer_norm
from seqlab.layers.checks import check_last_axis
from seqlab.validation import check_positive_floats, check_positive_ints


def _check_x(owner: str, x: Tensor, weight: Tensor) -> None:
    """x (..., d) floating, of the weight's dtype (outside autocast) and device: before the kernel's messages."""
    d = weight.numel()
    check_last_axis(owner, x, weight, d, expects=f"normalizes x (..., {d}) over its last axis")


def _check_norm(owner: str, d_model: int, eps: float) -> None:
    """eps > 0: with eps <= 0 a constant row divides by zero (NaN, or inf logits)."""
    args = SimpleNamespace(d_model=d_model, eps=eps)
    check_positive_ints(args, ("d_model",), prefix=f"{owner}: ")
    check_positive_floats(args, ("eps",), prefix=f"{owner}: ")


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm with an optional bias (GPT-2 has one, many later models drop it). On the CPU in float32
    or float64 it runs seqlab's LayerNorm kernel (``seqlab.kernels.layer_norm``: the same values, a backward
    several times faster than torch's for the narrow rows of small models); elsewhere ``F.layer_norm``."""

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True, device=None, dtype=None):
        _check_norm("LayerNorm", d_model, eps)
        super().__init__(d_model, eps=eps, bias=bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        _check_x("LayerNorm", x, self.weight)
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * weight, computed in float32 for low-precision inputs (float64 stays float64)."""

    def __init__(self, d_model: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        _check_norm("RMSNorm", d_model, eps)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        _check_x("RMSNorm", x, self.weight)
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # float64 stays float64
        return F.rms_norm(wide, (x.size(-1),), eps=self.eps).type_as(x) * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


def make_norm(
    kind: Literal["layernorm", "rmsnorm"],
    d_model: int,
    eps: float | None = None,
    bias: bool = True,
    device=None,
    dtype=None,
) -> nn.Module:
    if kind == "layernorm":
        return LayerNorm(d_model, eps=1e-5 if eps is None else eps, bias=bias, device=device, dtype=dtype)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps=1e-6 if eps is None else eps, device=device, dtype=dtype)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")
