"""Mamba-2's SSD in its three forms (seqlab.layers.ssd): the chunked block decomposition and the selective-scan
path against the recurrence, outputs, final states and every gradient in float64; the boundary's messages."""

import pytest
import torch
import torch.nn.functional as F

from seqlab.layers.ssd import ssd_chunked, ssd_ref, ssd_scan

F64 = torch.float64


def inputs(b, t, h, p, g, n, seed=0, dtype=F64, state=True):
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=dtype)

    x, dt = r(b, t, h, p), F.softplus(r(b, t, h))
    A = -torch.rand(h, generator=gen, dtype=dtype) * 4 - 0.1
    H0 = r(b, h, p, n) if state else None
    return x, dt, A, r(b, t, g, n), r(b, t, g, n), r(h), H0


SHAPES = [  # b, t, h, p, g, n, chunk
    (2, 37, 4, 3, 2, 5, 8),  # t not a multiple of the chunk, two groups
    (1, 64, 2, 4, 1, 6, 16),  # whole chunks
    (3, 5, 2, 2, 1, 3, 64),  # one partial chunk
    (2, 1, 3, 2, 3, 4, 4),  # one position, a group per head
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("form", ["chunked", "scan"])
def test_forms_equal_the_recurrence_with_gradients(shape, form):
    *dims, q = shape
    args = [v.requires_grad_() for v in inputs(*dims)]
    fn = (lambda *a: ssd_chunked(*a, chunk_size=q)) if form == "chunked" else ssd_scan
    y_ref, H_ref = ssd_ref(*args)
    y, H = fn(*args)
    torch.testing.assert_close(y, y_ref, atol=1e-11, rtol=1e-11)
    torch.testing.assert_close(H, H_ref, atol=1e-11, rtol=1e-11)
    gy, gH = torch.randn_like(y), torch.randn_like(H)
    want = torch.autograd.grad((y_ref * gy).sum() + (H_ref * gH).sum(), args)
    got = torch.autograd.grad((y * gy).sum() + (H * gH).sum(), args)
    for name, a, b in zip(("x", "dt", "A", "B", "C", "D", "initial_state"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"d{name}")


def test_without_D_or_initial_state_and_held_state_at_zero_step():
    x, dt, A, B, C, _, _ = inputs(2, 9, 2, 3, 1, 4, state=False)
    for fn in (ssd_chunked, ssd_scan):
        y, H = fn(x, dt, A, B, C)
        y_ref, H_ref = ssd_ref(x, dt, A, B, C)
        torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(H, H_ref, atol=1e-12, rtol=1e-12)
    # Δ = 0 after position 4: the state stays the one after position 4 (exp(0·A) = 1, Δ x = 0)
    held = dt.clone()
    held[:, 5:] = 0
    _, H_short = ssd_ref(x[:, :5], dt[:, :5], A, B[:, :5], C[:, :5])
    for fn in (ssd_chunked, ssd_scan, ssd_ref):
        torch.testing.assert_close(fn(x, held, A, B, C)[1], H_short, atol=1e-12, rtol=1e-12)


def test_float32_scan_near_float64():
    args64 = inputs(2, 200, 4, 8, 2, 16)
    y64, H64 = ssd_ref(*args64)
    for fn in (ssd_scan, ssd_chunked):
        y, H = fn(*(v.float() for v in args64))
        torch.testing.assert_close(y.double(), y64, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(H.double(), H64, atol=2e-4, rtol=1e-4)


def test_gradcheck_scan():
    args = [v.requires_grad_() for v in inputs(1, 6, 2, 2, 1, 3)]
    assert torch.autograd.gradcheck(lambda *a: ssd_scan(*a), args)


def test_boundary_messages():
    x, dt, A, B, C, D, H0 = inputs(2, 5, 4, 3, 2, 6)
    with pytest.raises(ValueError, match=r"x \(b, t, h, p\)"):
        ssd_ref(x[0], dt, A, B, C)
    with pytest.raises(
        ValueError, match=r"B must have shape \(b, t, g, n\) = \(2, 5, g, n\).* got \(2, 5, 6\)"
    ):
        ssd_ref(x, dt, A, B[:, :, 0], C)
    with pytest.raises(ValueError, match=r"dt must have shape \(2, 5, 4\)"):
        ssd_scan(x, dt[:, :4], A, B, C)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 4, 3, 6\)"):
        ssd_chunked(x, dt, A, B, C, D, H0[..., :5])
    with pytest.raises(ValueError, match="3 groups of B and C must divide the 4 heads"):
        ssd_ref(x, dt, A, torch.randn(2, 5, 3, 6, dtype=F64), torch.randn(2, 5, 3, 6, dtype=F64))
    with pytest.raises(ValueError, match=r"A is torch\.float32"):
        ssd_scan(x, dt, A.float(), B, C)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        ssd_chunked(x, dt, A, B, C, chunk_size=0)
