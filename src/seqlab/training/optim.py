"""AdamW with weight-decay groups, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (weights of linear, recurrent and embedding layers); never decay biases, norm gains or
    other vectors (Loshchilov & Hutter 2019, arXiv 1711.05101; the GPT-2/nanoGPT convention), nor parameters
    a layer marks with ``_no_weight_decay = True``: the state matrices of S4D and Mamba, whose initialization
    spreads their decay rates over several time scales that weight decay would pull together (the Mamba and
    S4 reference code train A without weight decay too)."""
    decay, no_decay = [], []
    for p in model.parameters():  # each tied parameter appears once
        if p.requires_grad:
            keep = p.dim() < 2 or getattr(p, "_no_weight_decay", False)
            (no_decay if keep else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], eps: float = 1e-8
) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)


def lr_at(step: int, max_lr: float, total_steps: int, warmup_steps: int, min_lr: float) -> float:
    """Linear warmup from 0 over ``warmup_steps``, then cosine decay to ``min_lr`` at ``total_steps``.

    A pure function of the step: resuming needs nothing but the step number.
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
