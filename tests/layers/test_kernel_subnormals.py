"""seqlab's CPU kernels flush subnormal floats inside their own tasks (vec_math.h, FlushDenormals): their results on
inputs that make subnormals still match the references, and the caller's floating-point state is left as it was
(the speed on such inputs: benchmarks/bench_denormals.py)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from seqlab.kernels import kernel_unavailable, selective_scan_kernel
from seqlab.kernels.activations import gelu_bias
from seqlab.kernels.attention import attention
from seqlab.kernels.recurrent import recurrent_layer
from seqlab.layers.scan import selective_scan_ref

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernels")

TINY = 1e-38  # a normal float32; half of it is subnormal


def subnormals_survive() -> bool:
    """Whether float32 arithmetic here still makes subnormals, on this thread and on torch's worker threads."""
    one = (torch.tensor([TINY]) * 0.5).item() != 0.0
    many = bool((torch.full((1 << 20,), TINY) * 0.5).ne(0).all())
    return one and many


@pytest.fixture(autouse=True)
def caller_state_unchanged():
    """Each test's kernel calls leave the process making subnormals as before."""
    if not subnormals_survive():
        pytest.skip("this process flushes subnormals already (torch.set_flush_denormal?)")
    yield
    assert subnormals_survive(), "a kernel left the caller's MXCSR flushing subnormals"


def grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(
        out.dtype
    )  # the same for both
    return list(torch.autograd.grad(out, inputs, g))


def test_gelu_bias_on_pre_activations_past_ten():
    """N(0, 8²) pre-activations: about a fifth past ±10, where σ(2z) or its complement is subnormal."""
    p = (torch.randn(512, 256, generator=torch.Generator().manual_seed(0)) * 8).requires_grad_()
    b = torch.zeros(256, requires_grad=True)
    assert (p.abs() > 10).float().mean() > 0.1
    out = gelu_bias(p, b, "tanh")
    p64, b64 = (x.detach().double().requires_grad_() for x in (p, b))
    ref = F.gelu(p64 + b64, approximate="tanh")
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(out, [p, b]), grads(ref, [p64, b64]), strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)


def test_attention_with_scores_far_below_the_row_maximum():
    """Scores with a spread of hundreds: most probabilities underflow float32's normal range."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 32, generator=gen) * s for s in (6.0, 6.0, 1.0))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = attention(q, k, v, is_causal=True)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads(out, [q, k, v]), grads(ref, [q64, k64, v64]), strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-3, rtol=1e-4)


@pytest.mark.skipif(kernel_unavailable() is not None, reason="the selective-scan kernel cannot be built here")
def test_selective_scan_with_decay_below_the_normal_range():
    """Δ up to 8 with A down to -16: exp(Δ A) reaches e^-128, far below float32's normal range."""
    gen = torch.Generator().manual_seed(0)
    b, t, d, n = 2, 64, 16, 16
    u = torch.randn(b, t, d, generator=gen)
    delta = 1 + 7 * torch.rand(b, t, d, generator=gen)
    A = -torch.arange(1, n + 1, dtype=torch.float32).repeat(d, 1)
    B, C = torch.randn(b, t, n, generator=gen), torch.randn(b, t, n, generator=gen)
    inputs = [x.requires_grad_() for x in (u, delta, A, B, C)]
    out = selective_scan_kernel(*inputs)
    inputs64 = [x.detach().double().requires_grad_() for x in inputs]
    ref = selective_scan_ref(*inputs64)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads(out, inputs), grads(ref, inputs64), strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_gru_kernel_with_saturated_gates():
    torch.manual_seed(0)
    gru = torch.nn.GRU(8, 16)
    x = (torch.randn(20, 3, 8) * 30).requires_grad_()
    h0 = torch.zeros(3, 16)
    w = [gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0]
    out = recurrent_layer(x, h0, *w, "GRU")[0]
    ref = gru(x, h0[None])[0]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(out, [x, *w]), grads(ref, [x, *w]), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
