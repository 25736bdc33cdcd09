"""The output layer over a vocabulary: logits = h Wᵀ (+ b), W of shape (v, d).

On a CUDA device, when ``v`` is not a multiple of 64, :class:`VocabHead` multiplies by the weight padded with
zero rows up to the next multiple and returns the first ``v`` columns (a view). The logits then have an aligned
leading dimension, which cuBLAS's tensor-core kernels need: with GPT-2's 50,257 rows the head's three products
(forward, and the two of its backward) ran through a fallback kernel at alignment 1 and took 42% of the GPU
time of a bf16 training step on an H200 (``benchmarks/results/gpt2-gpu-*``). The padded rows are zeros and get
no gradient that reaches the weight, so the numbers are the unpadded product's; the parameter keeps its shape
(checkpoints, Hugging Face interop). On the CPU it is ``nn.Linear``: its GEMMs have no such alignment cliff.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.linear import linear

PAD_MULTIPLE = 64


def padded_rows(v: int, multiple: int | None = None) -> int:
    """v rounded up to a multiple of ``multiple`` (None: ``PAD_MULTIPLE``; 1 turns the padding off)."""
    return v + (-v % (multiple or PAD_MULTIPLE))


def vocab_logits(h: Tensor, weight: Tensor, bias: Tensor | None = None, pad: bool | None = None) -> Tensor:
    """h (.., d) x weight (v, d) [+ bias (v,)] -> logits (.., v); ``pad`` None: on CUDA when v is unaligned,
    True/False forces it (the CPU tests of the padded path)."""
    v = weight.size(0)
    if h.size(-1) != weight.size(1):
        raise ValueError(f"expected inputs of width {weight.size(1)} (.., d), got {tuple(h.shape)}")
    extra = padded_rows(v) - v
    if pad is None:
        pad = h.is_cuda and extra > 0
    if not pad or not extra:
        return linear(h, weight, bias)
    weight = F.pad(weight, (0, 0, 0, extra))  # (v + extra, d), zero rows
    bias = None if bias is None else F.pad(bias, (0, extra))
    return linear(h, weight, bias)[..., :v]  # (.., v): a view of the aligned (.., v + extra) product


class VocabHead(nn.Linear):
    """``nn.Linear`` (d -> v) whose product pads the vocabulary on CUDA (module docstring)."""

    def forward(self, h: Tensor) -> Tensor:
        return vocab_logits(h, self.weight, self.bias)
