"""The Triton selective scan (``seqlab.kernels.triton_scan``) against the loop reference ``selective_scan_ref``.

The numeric tests need a CUDA GPU with Triton, or Triton's interpreter on the CPU (``TRITON_INTERPRET=1``
with Triton installed; slow, so only the small cases run there). The dispatch and error tests run anywhere.
"""

from __future__ import annotations

import pytest
import torch

from seqlab.kernels.triton_scan import (
    _interpreting,
    selective_scan_triton,
    triton_unavailable,
    why_not_triton,
)
from seqlab.layers.mamba import Mamba
from seqlab.layers.scan import selective_scan, selective_scan_ref

CUDA = torch.cuda.is_available() and triton_unavailable() is None
RUNS = CUDA or (_interpreting() and triton_unavailable() is None)
DEVICE = "cuda" if CUDA else "cpu"
needs_triton = pytest.mark.skipif(
    not RUNS, reason="needs a CUDA GPU with Triton, or TRITON_INTERPRET=1 with Triton installed"
)


def _inputs(b, t, d, n, dtype=torch.float64, seed=0, full=True):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(DEVICE, dtype)

    u, delta = r(b, t, d), r(b, t, d, scale=0.5)
    A = -(torch.rand(d, n, generator=g, dtype=torch.float64) * 2).to(DEVICE, dtype)
    B, C = r(b, t, n), r(b, t, n)
    if not full:
        return [u, delta, A, B, C, None, None, None, None]
    return [u, delta, A, B, C, r(d), r(b, t, d), r(d, scale=0.1), r(b, d, n)]


def _run(fn, xs, softplus, chunk=None):
    u, delta, A, B, C, D, z, bias, h0 = xs
    kw = {"chunk_size": chunk} if chunk is not None else {}
    return fn(u, delta, A, B, C, D, z, bias, softplus, h0, True, **kw)


def _grads(fn, xs, softplus, chunk=None):
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in xs]
    y, h = _run(fn, leaves, softplus, chunk)
    g = torch.Generator().manual_seed(1)
    gy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y)
    gh = torch.randn(h.shape, generator=g, dtype=torch.float64).to(h)
    given = [x for x in leaves if x is not None]
    return y, h, torch.autograd.grad((y * gy).sum() + (h * gh).sum(), given)


CASES = [  # (b, t, d, n, chunk, full, softplus): d not a multiple of 32, n not a power of two, t not of chunk
    (2, 7, 5, 3, 3, True, True),
    (1, 9, 33, 16, 4, True, False),
    (3, 5, 8, 1, 64, False, True),
    (2, 1, 4, 4, None, True, True),
]


@needs_triton
@pytest.mark.parametrize("b,t,d,n,chunk,full,softplus", CASES)
def test_matches_the_reference_in_float64(b, t, d, n, chunk, full, softplus):
    xs = _inputs(b, t, d, n, full=full)
    y, h, grads = _grads(selective_scan_triton, xs, softplus, chunk)
    y_ref, h_ref, grads_ref = _grads(selective_scan_ref, xs, softplus)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)
    assert len(grads) == len(grads_ref) == sum(x is not None for x in xs)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@needs_triton
def test_gradcheck_in_float64():
    xs = [None if x is None else x.requires_grad_() for x in _inputs(2, 6, 5, 3, seed=3)]

    def f(*args):
        return _run(selective_scan_triton, list(args), True, 4)

    assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-6)


@needs_triton
def test_float32_and_bfloat16_inputs():
    xs64 = _inputs(2, 40, 48, 16, seed=5)
    y_ref, h_ref = _run(selective_scan_ref, xs64, True)
    xs32 = [x.float() for x in xs64]
    y, h = _run(selective_scan_triton, xs32, True)
    assert y.dtype == torch.float32 and h.dtype == torch.float32
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-4, atol=1e-4)
    y16, h16 = _run(selective_scan_triton, [x.bfloat16() for x in xs64], True)
    assert (
        y16.dtype == torch.bfloat16 and h16.dtype == torch.float32
    )  # computed in float32, like the reference
    y16_ref, _ = _run(selective_scan_ref, [x.bfloat16() for x in xs64], True)
    torch.testing.assert_close(y16.float(), y16_ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU with Triton (a long sequence is too slow interpreted)")
def test_long_sequence_and_wide_block_in_float32():
    xs64 = _inputs(2, 300, 200, 16, seed=7)
    _, _, grads_ref = _grads(selective_scan_ref, xs64, True)
    _, _, grads = _grads(selective_scan_triton, [x.float() for x in xs64], True)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU with Triton")
def test_mamba_layer_on_cuda_takes_the_triton_scan(monkeypatch):
    import seqlab.layers.scan as scan_module

    torch.manual_seed(0)
    layer = Mamba(d_model=24, d_state=8, expand=2).to("cuda", torch.float64)
    x = torch.randn(2, 37, 24, device="cuda", dtype=torch.float64)
    calls = []
    real = scan_module.selective_scan_triton
    monkeypatch.setattr(scan_module, "selective_scan_triton", lambda *a: calls.append(1) or real(*a))
    y, (_, h) = layer(x)
    y_ref, (_, h_ref) = layer.forward_ref(x)
    assert calls == [1]
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)


def test_cpu_tensors_are_refused_with_the_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    xs = [
        torch.zeros(1, 2, 3),
        torch.zeros(1, 2, 3),
        torch.zeros(3, 4),
        torch.zeros(1, 2, 4),
        torch.zeros(1, 2, 4),
    ]
    reason = why_not_triton(*xs)
    assert reason is not None and "CUDA" in reason and "cpu" in reason
    with pytest.raises(RuntimeError, match=r"impl='triton'.*CUDA"):
        selective_scan(*xs, impl="triton")
    with pytest.raises(RuntimeError, match="Triton selective scan cannot run"):
        selective_scan_triton(*xs)
    with pytest.raises(ValueError, match="'auto', 'kernel', 'triton' or 'chunked'"):
        selective_scan(*xs, impl="cuda")


def test_shapes_the_kernels_cannot_read_are_refused_before_launch(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors then count as the Triton scan's device
    xs = _inputs(2, 5, 4, 3, full=False)
    u, delta, A, B, C = xs[:5]
    with pytest.raises(ValueError, match=r"B must be \(b, t, n\) = \(2, 5, 3\), got \(2, 5, 4\)"):
        selective_scan_triton(u, delta, A, torch.zeros(2, 5, 4, dtype=u.dtype, device=u.device), C)
    reason = why_not_triton(u, delta, A, B, C, D=torch.zeros(3, dtype=u.dtype, device=u.device))
    assert reason == "D has shape (3,), the kernel takes (4,) only"
    with pytest.raises(RuntimeError, match=r"D has shape \(3,\)"):
        selective_scan_triton(u, delta, A, B, C, D=torch.zeros(3, dtype=u.dtype, device=u.device))
