"""The N(0, std) initialization that GPT-2 and BERT share (Radford et al. 2019; Devlin et al. 2019)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.positional import LearnedPositionalEmbedding


@torch.no_grad()
def normal_init_(module: nn.Module, std: float = 0.02, skip: Iterable[nn.Module] = ()) -> None:
    """Every linear, embedding, attention in-projection and learned position table ~ N(0, std), biases zero;
    norms keep weight 1, bias 0. Modules are visited in ``module.modules()`` order; those in ``skip`` (and
    their submodules) keep their own initialization."""
    skipped = {id(m) for s in skip for m in s.modules()}
    for m in module.modules():
        if id(m) in skipped:
            continue
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, MultiheadAttention):
            for w in m.projection_weights():  # views of the packed weight, or the three of kdim/vdim
                nn.init.normal_(w, std=std)
            if m.in_proj_bias is not None:
                nn.init.zeros_(m.in_proj_bias)
        elif isinstance(m, LearnedPositionalEmbedding):
            nn.init.normal_(m.weight, std=std)
