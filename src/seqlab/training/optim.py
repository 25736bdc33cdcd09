"""AdamW with weight-decay groups, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (weights of linear, recurrent and embedding layers); never decay biases, norm gains or
    other vectors (Loshchilov & Hutter 2019, arXiv 1711.05101; the GPT-2/nanoGPT convention), nor the
    parameters a module names in its ``no_weight_decay`` class attribute: the state matrices of S4D and Mamba,
    whose initialization spreads their decay rates over several time scales that weight decay would pull
    together (the Mamba and S4 reference code train A without weight decay too). A module names them rather
    than marking the tensors, since a mark on a Parameter is lost by ``copy.deepcopy`` and by FSDP's sharding;
    a parameter marked ``_no_weight_decay = True`` is still honoured."""
    named = set()
    for module in model.modules():
        named |= {id(getattr(module, name)) for name in getattr(module, "no_weight_decay", ())}
    decay, no_decay = [], []
    for p in model.parameters():  # each tied parameter appears once
        if p.requires_grad:
            keep = p.dim() < 2 or id(p) in named or getattr(p, "_no_weight_decay", False)
            (no_decay if keep else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], eps: float = 1e-8
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`; torch's fused implementation (one kernel over all parameters) where it
    takes them: plain float tensors on the CPU or CUDA, not FSDP's sharded DTensors. The same update as the
    per-parameter loop that torch uses by default on the CPU, several times faster there
    (``python benchmarks/bench_optimizer.py``)."""
    groups = param_groups(model, weight_decay)
    fused = _fusable([p for g in groups for p in g["params"]])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def _fusable(params: list[torch.Tensor]) -> bool:
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if any(isinstance(p, DTensor) for p in params):
            return False
    floats = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    return all(p.device.type in ("cpu", "cuda") and p.dtype in floats for p in params)


def lr_at(step: int, max_lr: float, total_steps: int, warmup_steps: int, min_lr: float) -> float:
    """The rate of step ``step`` (0-based: steps 0 .. total_steps - 1 are trained): linear warmup to ``max_lr``
    at step ``warmup_steps - 1``, then cosine decay that reaches ``min_lr`` at the last step, total_steps - 1.

    A pure function of the step: resuming needs nothing but the step number.
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps - 1:
        return min_lr
    progress = (step + 1 - warmup_steps) / max(1, total_steps - warmup_steps)  # the peak is not trained twice
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def clip_gradients(model: nn.Module, max_norm: float, step: int, last_good: Callable[[], str]) -> float:
    """Clip the gradients' global norm to ``max_norm`` and return the norm before clipping (gathered from a
    DTensor under FSDP). A FloatingPointError, before the update, when it is not finite: clipping by an infinite
    norm gives NaN gradients, and the update would write NaN into every weight (and the last save keep them)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not math.isfinite(norm):
        raise FloatingPointError(
            f"the gradient norm is {norm} at step {step + 1} (the loss was finite); lower train.lr. {last_good()}"
        )
    return norm
