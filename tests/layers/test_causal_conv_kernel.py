"""seqlab.kernels.causal_conv (causal_conv.cpp): Mamba's depthwise causal conv + SiLU against torch's conv1d."""

import shutil

import pytest
import torch

from seqlab.kernels import causal_conv
from seqlab.kernels.causal_conv import causal_conv_silu, causal_conv_silu_ref
from seqlab.layers.mamba import Mamba

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


def inputs(dtype, b=3, t=11, c=37, k=4, bias=True):
    torch.manual_seed(0)
    make = lambda *shape: torch.randn(*shape, dtype=dtype, requires_grad=True)  # noqa: E731
    return make(b, t, c), make(b, k - 1, c), make(k, c), make(c) if bias else None


@needs_compiler
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "k", [4, 2, 5]
)  # 4 (Mamba's d_conv) has its own one-pass loops; the others the general ones
def test_values_and_every_gradient_match_conv1d(dtype, tol, bias, k):
    args = inputs(dtype, k=k, bias=bias)  # c = 37: two full 16-channel blocks and a partial one
    y, ref = causal_conv_silu(*args), causal_conv_silu_ref(*args)
    assert "CausalConvSilu" in type(y.grad_fn).__name__  # the kernel ran
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)
    wanted = [a for a in args if a is not None]
    g = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, wanted, g), torch.autograd.grad(ref, wanted, g), strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * 10)


@needs_compiler
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize(("b", "t"), [(2, 150), (1, 64), (1, 61), (2, 1)])
def test_rows_split_into_segments_match_conv1d(b, t, dtype, tol):
    """The kernel splits each batch row into segments of 64 output rows (with a 3-row halo in the backward):
    lengths across, at and just inside a segment boundary, and shorter than the kernel. In float32 the SiLU and
    its derivative run over a segment's rows as one span, 64 values at a time where the CPU has AVX-512: spans of
    1,280 values (64 rows of 20) and of 1,220 (61 rows, a tail of 4) and 20."""
    args = inputs(dtype, b=b, t=t, c=20)
    y, ref = causal_conv_silu(*args), causal_conv_silu_ref(*args)
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)
    g = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, args, g), torch.autograd.grad(ref, args, g), strict=True):
        torch.testing.assert_close(got, want, rtol=tol * 10, atol=tol * 10)


@needs_compiler
def test_a_view_with_strided_rows_is_read_in_place():
    """Mamba passes the x half of in_proj's (b, t, 2c) output: rows 2c apart, read without a copy."""
    torch.manual_seed(0)
    both = torch.randn(3, 70, 2 * 20, dtype=torch.float64, requires_grad=True)
    x = both.chunk(2, dim=-1)[0]
    _, state, w, bias = inputs(torch.float64, b=3, t=70, c=20)
    y, ref = causal_conv_silu(x, state, w, bias), causal_conv_silu_ref(x, state, w, bias)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the compiled operator itself takes the view (no copy made on the way)
        torch.testing.assert_close(causal_conv.EXTENSION.load().forward(x, state, w, bias), ref)
    g = torch.randn_like(y)
    args = (both, state, w, bias)
    for got, want in zip(torch.autograd.grad(y, args, g), torch.autograd.grad(ref, args, g), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


@needs_compiler
def test_gradcheck_and_double_backward():
    args = inputs(torch.float64, b=2, t=5, c=6)
    assert torch.autograd.gradcheck(causal_conv_silu, args)
    assert torch.autograd.gradgradcheck(causal_conv_silu, args)


@needs_compiler
@pytest.mark.parametrize(
    "t", [2, 9]
)  # shorter than the kernel (the new state reaches into the old) and longer
def test_mamba_fast_path_equals_its_reference_with_a_carried_state(t):
    torch.manual_seed(0)
    m = Mamba(8, d_state=4, d_conv=4).double()
    x = torch.randn(2, t, 8, dtype=torch.float64)
    state = (
        torch.randn(2, m.d_inner, 4, dtype=torch.float64),
        torch.randn(2, m.d_inner, 4, dtype=torch.float64),
    )
    (y, (conv, ssm)), (y_ref, (conv_ref, ssm_ref)) = m(x, state), m.forward_ref(x, state)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(conv, conv_ref, rtol=0, atol=0)
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-10, atol=1e-10)


def test_a_failed_build_falls_back_to_conv1d(failed_build):
    failed_build(causal_conv.EXTENSION)
    args = inputs(torch.float64)
    with failed_build.warns_once("causal convolution kernel"):
        y = causal_conv_silu(*args)
        causal_conv_silu(*args)
    assert "could not be built" in causal_conv.why_not_kernel(args[0])
    torch.testing.assert_close(y, causal_conv_silu_ref(*args), rtol=0, atol=0)


@needs_compiler
def test_the_kernel_refuses_mismatched_shapes_before_reading_them():
    x, state, weight, _ = inputs(torch.float32)
    with pytest.raises(RuntimeError, match=r"the bias must be a contiguous \(c,\) tensor"):
        causal_conv_silu(x, state, weight, torch.randn(5))
    with pytest.raises(RuntimeError, match=r"the state must be contiguous \(b, k - 1, c\)"):
        causal_conv_silu(x, state[:, :2], weight, None)
