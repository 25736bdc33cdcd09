"""Matched parameter budgets: the width of each mixer's model chosen so every family gets the same budget.

Every family is built on the same backbone (``seqlab.models.lm``) with the same depth, channel mixer ratio
and vocabulary; only ``d_model`` moves, and Mamba keeps its own block layout without a separate MLP
(``LAYOUT``). Counting happens on the meta device, so nothing is allocated.
"""

from __future__ import annotations

from typing import Any

import torch

from seqlab.models import build, make_config

LAYOUT: dict[str, dict[str, Any]] = {
    # Mamba's block carries its own gated expansion (in_proj to 2 x expand x d, silu gate): in the paper's
    # architecture (and MambaForCausalLM, and seqlab's mamba presets) it replaces both attention and the MLP,
    # so the stack has no separate channel mixer. Adding one at the same budget shrinks d_model and leaves
    # Mamba unable to learn induction heads in the lab's step budget (measured: chance after 800 steps,
    # against 92% at 4x the training length without the MLP).
    "mamba": {"d_ff": 0},
}
"""Per-mixer departures from the shared backbone, where a family's own architecture differs from it."""


def lm_fields(mixer: str, d_model: int, base: dict[str, Any]) -> dict[str, Any]:
    fields = {**base, **LAYOUT.get(mixer, {}), "mixer": mixer, "d_model": d_model}
    heads = fields.get("n_heads", 4)
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not a multiple of n_heads={heads}")
    return fields


def count(mixer: str, d_model: int, base: dict[str, Any]) -> int:
    model = build("lm", make_config("lm", lm_fields(mixer, d_model, base)), device=torch.device("meta"))
    return sum(p.numel() for p in model.parameters())


def match_width(
    mixer: str, budget: int, base: dict[str, Any], multiple: int | None = None, lo: int = 8, hi: int = 2048
) -> tuple[int, int]:
    """(d_model, parameters) with the parameter count closest to ``budget``; d_model a multiple of ``multiple``."""
    if multiple is None:  # attention splits d_model into heads whose width RoPE needs even
        multiple = 2 * base.get("n_heads", 4) if "attention" in mixer else 4
    best: tuple[int, int] | None = None
    a, b = lo // multiple, hi // multiple
    while a <= b:  # parameter count grows with d_model: binary search, then look at both neighbours
        mid = (a + b) // 2
        n = count(mixer, mid * multiple, base)
        if n < budget:
            a = mid + 1
        else:
            b = mid - 1
    for m in (b, a):
        if lo // multiple <= m <= hi // multiple:
            n = count(mixer, m * multiple, base)
            if best is None or abs(n - budget) < abs(best[1] - budget):
                best = (m * multiple, n)
    if best is None:
        raise ValueError(f"no width in [{lo}, {hi}] for mixer {mixer!r}")
    return best
