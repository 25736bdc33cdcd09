"""The selective scan: chunked fast path against the loop reference (outputs, states, gradients), numerics."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlab.layers.scan import _ChunkedScan, auto_chunk_size, selective_scan, selective_scan_ref

F64 = torch.float64


def _inputs(b, t, d, n, dtype=F64, seed=0, dt_scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)

    return {
        "u": r(b, t, d),
        "delta": r(b, t, d) * dt_scale,
        "A": -torch.rand(d, n, generator=g, dtype=dtype) * 3 - 0.1,
        "B": r(b, t, n),
        "C": r(b, t, n),
        "D": r(d),
        "z": r(b, t, d),
        "delta_bias": r(d),
        "initial_state": r(b, d, n),
    }


def _run(fn, x, **kw):
    args = [x[k] for k in ("u", "delta", "A", "B", "C")]
    return fn(
        *args,
        D=x["D"],
        z=x["z"],
        delta_bias=x["delta_bias"],
        delta_softplus=True,
        initial_state=x["initial_state"],
        return_last_state=True,
        **kw,
    )


@settings(deadline=None, max_examples=25)
@given(
    b=st.integers(1, 2),
    t=st.integers(1, 40),
    d=st.integers(1, 4),
    n=st.integers(1, 4),
    chunk=st.sampled_from([1, 3, 8, 16, 64]),
    seed=st.integers(0, 2**16),
)
def test_fast_equals_reference_outputs_and_gradients(b, t, d, n, chunk, seed):
    x = {k: v.requires_grad_() for k, v in _inputs(b, t, d, n, seed=seed).items()}
    y_ref, h_ref = _run(selective_scan_ref, x)
    y, h = _run(selective_scan, x, chunk_size=chunk)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(h, h_ref, atol=1e-10, rtol=1e-10)
    wy, wh = torch.randn_like(y), torch.randn_like(h)
    g_ref = torch.autograd.grad((y_ref * wy).sum() + (h_ref * wh).sum(), list(x.values()))
    g = torch.autograd.grad((y * wy).sum() + (h * wh).sum(), list(x.values()))
    for name, a, e in zip(x, g, g_ref, strict=True):
        torch.testing.assert_close(a, e, atol=1e-9, rtol=1e-9, msg=name)


@pytest.mark.parametrize("t", [64, 100])  # a multiple of the chunk size and not
def test_float32_matches_reference_on_long_sequences(t):
    x = {k: v.float().requires_grad_() for k, v in _inputs(2, t, 8, 16, seed=t).items()}
    y_ref, h_ref = _run(selective_scan_ref, x)
    y, h = _run(selective_scan, x, chunk_size=32)
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-4)
    g_ref = torch.autograd.grad(y_ref.square().sum(), list(x.values()))
    g = torch.autograd.grad(y.square().sum(), list(x.values()))
    for name, a, e in zip(x, g, g_ref, strict=True):
        torch.testing.assert_close(a, e, atol=1e-3, rtol=1e-3, msg=name)


def test_gradcheck_float64():
    x = _inputs(2, 7, 3, 2, seed=1)
    names = list(x)

    def f(*vals):
        y, h = _run(selective_scan, dict(zip(names, vals, strict=True)), chunk_size=3)
        return y, h

    assert torch.autograd.gradcheck(f, tuple(v.requires_grad_() for v in x.values()))


def test_large_decays_stay_finite():
    # Δ·A down to about -10^3 per step: any positive exponent (exp(-cumsum)) would overflow here.
    x = _inputs(1, 200, 4, 16, dtype=torch.float32, dt_scale=50.0)
    x["A"] = x["A"] * 10
    y_ref, h_ref = _run(selective_scan_ref, x)
    y, h = _run(selective_scan, x, chunk_size=128)
    assert torch.isfinite(y).all() and torch.isfinite(h).all()
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-4)


def test_backward_keeps_only_chunk_boundary_states():
    b, t, d, n, chunk = 2, 96, 4, 8, 32
    x = {k: v.requires_grad_() for k, v in _inputs(b, t, d, n).items()}
    args = [x[k] for k in ("u", "delta", "A", "B", "C")] + [x["initial_state"]]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s.numel()) or s, lambda s: s):
        y, _ = _ChunkedScan.apply(*args, chunk)
    assert b * (t // chunk) * d * n in saved  # the state entering each chunk
    assert max(saved) <= max(b * t * d, b * t * n)  # inputs only: never a (b, t, d, n) tensor
    assert y.shape == (b, t, d)


def test_shapes_and_errors():
    x = _inputs(2, 5, 3, 4)
    y = selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"])
    assert y.shape == (2, 5, 3) and y.dtype == F64
    empty = selective_scan(x["u"][:, :0], x["delta"][:, :0], x["A"], x["B"][:, :0], x["C"][:, :0])
    assert empty.shape == (2, 0, 3)
    with pytest.raises(ValueError, match="A must be"):
        selective_scan(x["u"], x["delta"], x["A"].T, x["B"], x["C"])
    with pytest.raises(ValueError, match="B must be"):
        selective_scan(x["u"], x["delta"], x["A"], x["B"][:, :2], x["C"])
    with pytest.raises(ValueError, match="chunk_size"):
        selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], chunk_size=0)


def test_auto_chunk_size_keeps_the_chunk_buffer_near_the_cache():
    # (b, n, d) -> positions per chunk: 8 when the batch is wide, longer for narrow batches, at most 64
    assert auto_chunk_size(32, 16, 120) == 8 and auto_chunk_size(16, 16, 512) == 8
    assert auto_chunk_size(8, 16, 120) == 16 and auto_chunk_size(1, 16, 512) == 32
    assert auto_chunk_size(1, 4, 8) == 64
    for b, n, d in [(32, 16, 120), (8, 16, 120), (1, 16, 512)]:
        size = auto_chunk_size(b, n, d)
        assert size * b * n * d <= 3 << 17 or size == 8
