"""seqlab.kernels.layer_norm (layer_norm.cpp) against torch's F.layer_norm, and seqlab's LayerNorm on top of it."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from seqlab.kernels import layer_norm as ln_module
from seqlab.kernels.layer_norm import layer_norm
from seqlab.layers.norms import LayerNorm

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


def inputs(shape, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]

    def make(*s, scale=1.0, shift=0.0):
        return (torch.randn(*s, generator=g, dtype=dtype) * scale + shift).requires_grad_()

    return make(*shape, scale=3.0, shift=2.0), make(n, shift=1.0), make(n) if bias else None


@needs_compiler
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 7, 60), (5, 1), (2, 3, 257), (1, 19)])
def test_values_and_every_gradient_match_torch(dtype, tol, bias, shape):
    """Rows in fours and the rows left over (21, 5, 6, 1 rows), widths odd and even, with and without a bias.

    The reference is torch's LayerNorm in float64 on the same values: at width 1, where x̂ = 0 exactly, torch's own
    float32 kernel leaves a rounding of x̂ that sums to a weight gradient of ±2e-4 instead of 0."""
    x, w, b = inputs(shape, dtype, bias)
    wide = [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, b)]
    # rows of WIDE_ROWS or more go to torch in layer_norm; the kernel itself still takes them
    kernel = layer_norm if shape[-1] < ln_module.WIDE_ROWS else ln_module._LayerNorm.apply
    y, ref = kernel(x, w, b, 1e-5), F.layer_norm(wide[0], (shape[-1],), wide[1], wide[2], 1e-5)
    assert "LayerNorm" in type(y.grad_fn).__name__  # the kernel ran
    torch.testing.assert_close(y, ref.to(dtype), rtol=tol, atol=tol)
    wanted, truth = [t for t in (x, w, b) if t is not None], [t for t in wide if t is not None]
    g = torch.randn(y.shape, dtype=dtype)
    got, want = torch.autograd.grad(y, wanted, g), torch.autograd.grad(ref, truth, g.double())
    for a, c in zip(got, want, strict=True):
        torch.testing.assert_close(a, c.to(dtype), rtol=tol * 10, atol=tol * 10)


@needs_compiler
def test_gradcheck_and_double_backward():
    args = inputs((3, 5, 6), torch.float64)
    f = lambda x, w, b: layer_norm(x, w, b, 1e-5)  # noqa: E731
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


@needs_compiler
def test_the_gradients_of_many_rows_on_two_threads_add_up(torch_threads):
    """Each thread sums its rows' weight and bias gradients in a slot of its own; the slots are added at the end."""
    torch_threads(2)
    x, w, b = inputs((64, 300, 60), torch.float64)
    y, ref = layer_norm(x, w, b, 1e-5), F.layer_norm(x, (60,), w, b, 1e-5)
    g = torch.randn_like(y)
    for got, want in zip(
        torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(ref, (x, w, b), g), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@needs_compiler
def test_seqlab_layer_norm_takes_the_kernel_and_torch_elsewhere():
    torch.manual_seed(0)
    norm = LayerNorm(12)
    x = torch.randn(4, 12)
    assert "LayerNorm" in type(norm(x.requires_grad_()).grad_fn).__name__
    reasons = {
        "bfloat16": ln_module.why_not_kernel(x.bfloat16(), norm.weight.bfloat16(), None),
        "non-contiguous": ln_module.why_not_kernel(torch.randn(12, 4).t(), norm.weight, None),
        "no weight": ln_module.why_not_kernel(x, None, None),
        "wide": ln_module.why_not_kernel(torch.randn(4, 128), torch.ones(128), None),
    }
    assert "128 or more values" in reasons["wide"]
    assert "NativeLayerNorm" in type(LayerNorm(128)(torch.randn(4, 128, requires_grad=True)).grad_fn).__name__
    assert "float32 or float64" in reasons["bfloat16"]
    assert "contiguous" in reasons["non-contiguous"]
    assert "weight" in reasons["no weight"]
    xt = torch.randn(12, 4).t()  # torch's path for a transposed view: the same values
    torch.testing.assert_close(norm(xt), F.layer_norm(xt, (12,), norm.weight, norm.bias))


def test_a_failed_build_falls_back_to_torch(failed_build):
    failed_build(ln_module.EXTENSION)
    x, w, b = inputs((3, 8), torch.float64)
    with failed_build.warns_once("LayerNorm kernel"):
        y = layer_norm(x, w, b, 1e-5)
        layer_norm(x, w, b, 1e-5)
    torch.testing.assert_close(y, F.layer_norm(x, (8,), w, b, 1e-5), rtol=0, atol=0)


@needs_compiler
def test_the_kernel_refuses_a_wrong_weight_before_reading_it():
    x, w, _ = inputs((3, 8), torch.float32)
    with pytest.raises(RuntimeError, match=r"weight must be \(8,\)"):
        ln_module.EXTENSION.load().forward(x.detach(), torch.ones(5), None, 1e-5)
    with pytest.raises(RuntimeError, match="x's dtype"):
        ln_module.EXTENSION.load().forward(x.detach(), w.detach().double(), None, 1e-5)
