r"""Discretization of a diagonal continuous-time SSM (the formulas are in ``seqlab.layers.ssm``'s docstring),
and the small numeric helpers that S4D and Mamba share.

Notation: ``A`` (diagonal, as a vector), ``B``, ``Δ`` (``dt``); every operation is elementwise and broadcasts.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

__all__ = ["discretize", "discretize_bilinear", "discretize_zoh"]


def discretize_zoh(A: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Zero-order hold for diagonal A: Ā = exp(Δ A), B̄ = (exp(Δ A) - 1) / A · B. Real or complex; broadcasts.

    A must have no zero entries (S4D and Mamba keep Re(A) < 0).
    """
    dA = dt * A
    return torch.exp(dA), torch.expm1(dA) / A * B


def discretize_bilinear(A: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Bilinear (Tustin) for diagonal A: Ā = (1 + Δ A / 2) / (1 - Δ A / 2), B̄ = Δ B / (1 - Δ A / 2)."""
    half = dt * A / 2
    return (1 + half) / (1 - half), dt * B / (1 - half)


def discretize(A: Tensor, B: Tensor, dt: Tensor, method: Literal["zoh", "bilinear"] = "zoh"):
    if method == "zoh":
        return discretize_zoh(A, B, dt)
    if method == "bilinear":
        return discretize_bilinear(A, B, dt)
    raise ValueError(f"discretization must be 'zoh' or 'bilinear', got {method!r}")


def _wide(p: Tensor) -> Tensor:
    """float32 for half-precision tensors (the scan's numerics), unchanged otherwise."""
    return p.to(torch.promote_types(p.dtype, torch.float32))


def _log_uniform(size: int, lo: float, hi: float, **kw) -> Tensor:
    return torch.exp(torch.rand(size, **kw) * (math.log(hi) - math.log(lo)) + math.log(lo))
