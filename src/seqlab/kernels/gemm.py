"""``F.linear`` with its two large float32 CPU products through oneDNN where oneDNN is the faster library.

torch multiplies float32 matrices on the CPU with Intel's MKL. On AMD CPUs MKL does not take its best code
paths, and oneDNN (also inside torch, choosing its code by instruction set rather than by vendor) runs the
products of a training step faster: on a 2-core AMD EPYC with AVX-512, ``benchmarks/bench_gemm.py`` measured
the forward product and the input gradient 1.1-1.7x faster at GPT's shapes (512 and 4,096 rows), and the weight
gradient (a long reduction over the rows) mostly slower, so that one stays with MKL. On an Intel Xeon, MKL's own
vendor, oneDNN's linear (with its bias and a residual add fused) was measured slower than MKL at K = 256.

:func:`linear` is ``F.linear(x, weight, bias)``; it sends the product y = x Wᵀ + b and the input gradient
dx = dy W to oneDNN (``torch.ops.mkldnn._linear_pointwise``) when :func:`onednn_reason` is None and the
product is large enough (rows x in x out >= ``MIN_WORK`` multiply-adds: below that, oneDNN's per-call cost
loses), and runs ``F.linear`` otherwise: other dtypes (float64 checks, bf16 autocast), other devices,
tensor subclasses (DTensor), torch.compile's tracing. The weight and bias gradients are torch's (``dy.T @ x``, ``dy.sum(0)``). Values
differ from MKL's in float32 rounding only (summation order); a double backward (``create_graph=True``)
differentiates ``F.linear``.

Narrow inputs (2 to 15 input features, as Mamba's low-rank Δ projection at small widths has: 4 at d_model 52)
take a third route, :class:`_NarrowLinear`: MKL multiplies dy W (m, n) x (n, k) and dyᵀ x (n, m) x (m, k) with
k < 16 2-8x slower than the same products written the other way round, W-transposed as a linear's weight
(dy (Wᵀ)ᵀ) and (xᵀ dy)ᵀ: on the AMD EPYC at 8,192 rows, 104 outputs and k = 4, 489 -> 154 us and 702 -> 213 us
(2 threads); the lab's Mamba LM training step (batch 8 x 1,024) 1.04-1.07x faster, alternating in one
process. The forward product stays ``F.linear``. Measured on AMD only, so it follows the same choice as
oneDNN's products.

The choice: ``SEQLAB_GEMM=onednn`` or ``torch`` sets it; unset, oneDNN on AMD CPUs with AVX-512 (where it
was measured faster), torch elsewhere. ``SEQLAB_DISABLE_KERNELS=gemm`` (or ``all``) leaves it to torch too.
The choice depends on the machine and the shapes only, so a run and its resume take the same path.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels.build import disabled_reason

__all__ = ["MIN_WORK", "NARROW", "amd_with_avx512", "choice", "linear", "onednn_reason"]

MIN_WORK = 1 << 24  # rows x in x out multiply-adds from which oneDNN's product beats MKL's (bench_gemm.py)
NARROW = range(2, 16)  # input features for which the gradients take _NarrowLinear's product order
_MIN_NARROW_WORK = 1 << 18  # below, the gradients cost little either way and the Function's own cost shows
_CHOICES = ("onednn", "torch")


def choice() -> str | None:
    """``SEQLAB_GEMM`` ('onednn' or 'torch'), None when unset (the machine decides); a ValueError otherwise."""
    value = os.environ.get("SEQLAB_GEMM", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in _CHOICES:
        raise ValueError(f"SEQLAB_GEMM must be 'onednn', 'torch' or 'auto', got {value!r}")
    return value


@functools.cache
def _cpu_vendor() -> str:
    """The CPU's vendor string ('AuthenticAMD', 'GenuineIntel'), '' where /proc/cpuinfo does not say."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return ""


def amd_with_avx512() -> bool:
    """An AMD CPU that torch runs with AVX-512: where MKL's float32 products lag (the module docstring), so that
    oneDNN's, and seqlab's attention kernel at longer lengths (``seqlab.kernels.attention.max_keys``), win."""
    return _cpu_vendor() == "AuthenticAMD" and torch.backends.cpu.get_cpu_capability() == "AVX512"


@functools.cache
def _op_reason() -> str | None:
    if not torch.backends.mkldnn.is_available():
        return "this torch is built without oneDNN"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch has no oneDNN linear operator (torch.ops.mkldnn._linear_pointwise)"
    return None


def onednn_reason() -> str | None:
    """Why float32 CPU products stay with torch's MKL on this machine, or None when large ones go to oneDNN."""
    if (off := disabled_reason("gemm")) is not None:
        return off
    if (op := _op_reason()) is not None:
        return op
    if not torch.backends.mkldnn.enabled:
        return "torch.backends.mkldnn.enabled is False"
    chosen = choice()
    if chosen == "torch":
        return "SEQLAB_GEMM=torch"
    if chosen is None and not amd_with_avx512():
        return "MKL is the faster library on this CPU (oneDNN is chosen on AMD CPUs with AVX-512; SEQLAB_GEMM=onednn)"
    return None


def _onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (m, k) times weight (n, k) transposed, plus bias (n,): (m, n), one oneDNN call."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _dense(weight: Tensor) -> Tensor:
    """The weight as oneDNN multiplies it at speed: as it is when it or its transpose is contiguous, else a
    contiguous copy. A weight's column slice (rows a stride apart, as the seq2seq decoder's W_ih[:, :e]) sent
    oneDNN to a generic path about 1,000x slower: (3008, 256) x (256 -> 768) 7.7 s against 7 ms on the AMD EPYC."""
    return weight if weight.is_contiguous() or weight.t().is_contiguous() else weight.contiguous()


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        weight = _dense(weight)  # saved as multiplied: the backward's product reads it too
        ctx.save_for_backward(x, weight, bias)
        return _onednn(x.reshape(-1, x.size(-1)), weight, bias).view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight, bias = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: gradients that autograd can differentiate again
            with torch.enable_grad():
                inputs = [t for t, w in zip((x, weight, bias), wanted, strict=True) if w]
                got = iter(torch.autograd.grad(F.linear(x, weight, bias), inputs, grad, create_graph=True))
                return tuple(next(got) if w else None for w in wanted)
        rows, g = x.reshape(-1, x.size(-1)), grad.reshape(-1, grad.size(-1))  # (m, k), (m, n)
        dx = dw = db = None
        if wanted[0]:  # dy W: (m, n) x (n, k), W's transpose as oneDNN's (k, n) weight
            dx = _onednn(g, weight.t(), None).view(x.shape)
        if wanted[1]:  # dyᵀ x: a reduction over the m rows, where MKL is the faster
            dw = g.t() @ rows
        if bias is not None and wanted[2]:
            db = g.sum(0)
        return dx, dw, db


class _NarrowLinear(torch.autograd.Function):
    """F.linear for k < 16 input features, its gradients as products that MKL runs at speed (module docstring)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight, bias)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight, bias = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: F.linear's own gradients, differentiable
            with torch.enable_grad():
                inputs = [t for t, w in zip((x, weight, bias), wanted, strict=True) if w]
                got = iter(torch.autograd.grad(F.linear(x, weight, bias), inputs, grad, create_graph=True))
                return tuple(next(got) if w else None for w in wanted)
        rows, g = x.reshape(-1, x.size(-1)), grad.reshape(-1, grad.size(-1))  # (m, k), (m, n)
        dx = F.linear(g, weight.t().contiguous()).view(x.shape) if wanted[0] else None  # dy W as dy (Wᵀ)ᵀ
        dw = (rows.t() @ g).t().contiguous() if wanted[1] else None  # dyᵀ x as (xᵀ dy)ᵀ
        db = g.sum(0) if bias is not None and wanted[2] else None
        return dx, dw, db


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not subclasses (DTensor, tracing tensors): those take F.linear


def _takes(x: Tensor, weight: Tensor, bias: Tensor | None, least: int = MIN_WORK) -> bool:
    # the size first: most calls of a step-by-step decoder are small, and this is their only test
    if weight.dim() != 2 or x.numel() * weight.size(0) < least:  # rows x in x out, with in checked below
        return False
    if type(x) not in _PLAIN or type(weight) not in _PLAIN or (bias is not None and type(bias) not in _PLAIN):
        return False
    if not (x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"):
        return False
    if bias is not None and (
        bias.dtype != torch.float32 or bias.shape != weight.shape[:1] or bias.device.type != "cpu"
    ):
        return False
    if x.dim() < 1 or x.size(-1) != weight.size(1) or x.layout != torch.strided:
        return False
    if torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling():
        return False
    return onednn_reason() is None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., k), weight (n, k), bias (n,) or None -> (..., n); large float32 CPU
    products through oneDNN where it is the faster library (the module's docstring), ``F.linear`` otherwise."""
    if isinstance(x, Tensor) and isinstance(weight, Tensor):
        if weight.dim() == 2 and weight.size(1) in NARROW:
            if _takes(x, weight, bias, _MIN_NARROW_WORK) and torch.is_grad_enabled():
                return _NarrowLinear.apply(x, weight, bias)
        elif _takes(x, weight, bias):
            return _Linear.apply(x, weight, bias)
    return F.linear(x, weight, bias)
