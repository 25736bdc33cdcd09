"""seqlab.kernels.gated_norm (gated_norm.cpp) against its torch-ops reference, and Mamba-2's norm on top of it."""

import shutil

import pytest
import torch

from seqlab.kernels import gated_norm as gn
from seqlab.kernels.gated_norm import gated_rms_norm, gated_rms_norm_ref
from seqlab.layers.mamba2 import GatedRMSNorm

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


def inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()
    z = (3 * torch.randn(*shape, generator=g, dtype=dtype)).requires_grad_()  # silu's both sides, its tails
    w = (torch.rand(shape[-1], generator=g, dtype=dtype) + 0.5).requires_grad_()
    return y, z, w


def wide(*ts):
    return [t.detach().double().requires_grad_() for t in ts]


@needs_compiler
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize(
    ("shape", "group"), [((3, 5, 12), 4), ((2, 7, 104), 104), ((9, 33), 11), ((1, 1), 1)]
)
def test_values_and_every_gradient_match_the_ops_in_float64(dtype, tol, shape, group):
    """Groups of 1 to 104 channels (one or several a row, widths not a multiple of the vector width)."""
    y, z, w = inputs(shape, dtype)
    out = gated_rms_norm(y, z, w, group, 1e-5)
    assert type(out.grad_fn).__name__.startswith("_GatedNormKernel")  # the kernel ran
    ref_in = wide(y, z, w)
    ref = gated_rms_norm_ref(*ref_in, group, 1e-5)
    torch.testing.assert_close(out, ref.to(dtype), rtol=tol, atol=tol)
    dout = torch.randn(out.shape, dtype=dtype)
    got, want = torch.autograd.grad(out, (y, z, w), dout), torch.autograd.grad(ref, ref_in, dout.double())
    for name, a, b in zip(("dy", "dz", "dw"), got, want, strict=True):
        torch.testing.assert_close(a, b.to(dtype), rtol=tol * 10, atol=tol * 10, msg=name)


@needs_compiler
def test_gradcheck_and_double_backward():
    y, z, w = inputs((3, 4, 6), torch.float64)
    f = lambda y, z, w: gated_rms_norm(y, z, w, 3, 1e-5)  # noqa: E731
    assert type(f(y, z, w).grad_fn).__name__.startswith("_GatedNormKernel")
    assert torch.autograd.gradcheck(f, (y, z, w))
    assert torch.autograd.gradgradcheck(f, (y, z, w))


@needs_compiler
def test_the_weight_gradients_of_many_rows_on_two_threads_add_up(torch_threads):
    """Each thread sums its rows' ∂L/∂w in a slot of its own; the slots are added at the end."""
    torch_threads(2)
    y, z, w = inputs((64, 300, 24), torch.float64)
    out, ref = gated_rms_norm(y, z, w, 8, 1e-5), gated_rms_norm_ref(y, z, w, 8, 1e-5)
    dout = torch.randn_like(out)
    got, want = torch.autograd.grad(out, (y, z, w), dout), torch.autograd.grad(ref, (y, z, w), dout)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@needs_compiler
def test_other_tensors_take_the_ops_with_the_same_values():
    y, z, w = inputs((4, 12), torch.float64)
    reasons = {
        "bfloat16": gn.why_not_kernel(y.bfloat16(), z.bfloat16(), w.bfloat16()),
        "mixed": gn.why_not_kernel(y, z.float(), w),
        "non-contiguous": gn.why_not_kernel(y.detach().t(), z.detach().t(), torch.ones(4, dtype=y.dtype)),
    }
    assert "float32 or float64" in reasons["bfloat16"]
    assert "share y's dtype" in reasons["mixed"]
    assert "contiguous" in reasons["non-contiguous"]
    yt, zt = (t.detach().t().contiguous().t().requires_grad_() for t in (y, z))  # (4, 12), strides transposed
    out = gated_rms_norm(yt, zt, w, 4, 1e-5)
    assert type(out.grad_fn).__name__.startswith("_GatedRMSNorm")  # torch ops, their own backward
    torch.testing.assert_close(out, gated_rms_norm_ref(yt, zt, w, 4, 1e-5), rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # no gradients: the kernel's forward alone
        torch.testing.assert_close(gated_rms_norm(y, z, w, 4, 1e-5), gated_rms_norm_ref(y, z, w, 4, 1e-5))


def test_bad_shapes_are_named_at_the_boundary():
    y, z, w = inputs((2, 3, 8), torch.float32)
    with pytest.raises(ValueError, match=r"y \(2, 3, 8\), z \(2, 3, 4\), weight \(8,\), group_size 4"):
        gated_rms_norm(y, z[..., :4], w, 4, 1e-5)
    with pytest.raises(ValueError, match=r"weight \(5,\)"):
        gated_rms_norm(y, z, torch.ones(5), 4, 1e-5)
    with pytest.raises(ValueError, match=r"y must be a floating tensor, got torch.int64 of shape \(2, 4\)"):
        gated_rms_norm(torch.ones(2, 4, dtype=torch.long), z[0, :2, :4], w[:4], 4, 1e-5)
    with pytest.raises(ValueError, match="z must be a floating tensor, got list"):
        gated_rms_norm(y, [1.0], w, 4, 1e-5)
    for eps in (0.0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="eps must be a positive finite number"):
            gated_rms_norm(y, z, w, 4, eps)
    for group_size in (3, 0):
        with pytest.raises(ValueError, match=f"group_size {group_size}"):
            gated_rms_norm(y, z, w, group_size, 1e-5)


def test_the_module_refuses_a_group_that_does_not_divide_the_width():
    for group_size in (0, 5):
        with pytest.raises(ValueError, match=f"group_size={group_size} must be positive and divide d=12"):
            GatedRMSNorm(12, group_size)


@needs_compiler
def test_the_kernel_refuses_a_wrong_weight_before_reading_it():
    y, z, w = (t.detach() for t in inputs((3, 8), torch.float32))
    with pytest.raises(RuntimeError, match=r"weight must be \(8,\)"):
        gn.EXTENSION.load().forward(y, z, torch.ones(5), 4, 1e-5)
    with pytest.raises(RuntimeError, match="y's dtype"):
        gn.EXTENSION.load().forward(y, z.double(), w, 4, 1e-5)
    with pytest.raises(RuntimeError, match="group_size 3 must divide 8"):
        gn.EXTENSION.load().forward(y, z, w, 3, 1e-5)


def test_a_failed_build_falls_back_to_the_ops(failed_build):
    failed_build(gn.EXTENSION)
    y, z, w = inputs((3, 8), torch.float64)
    with failed_build.warns_once("gated RMSNorm kernel"):
        out = gated_rms_norm(y, z, w, 4, 1e-5)
        gated_rms_norm(y, z, w, 4, 1e-5)
    assert type(out.grad_fn).__name__.startswith("_GatedRMSNorm")
    torch.testing.assert_close(out, gated_rms_norm_ref(y, z, w, 4, 1e-5), rtol=0, atol=0)


@needs_compiler
def test_switched_off_by_name_and_mamba2s_norm_takes_the_kernel(monkeypatch):
    norm = GatedRMSNorm(12, 6)
    y, z, _ = inputs((2, 5, 12), torch.float32)
    assert type(norm(y, z).grad_fn).__name__.startswith("_GatedNormKernel")
    assert type(norm(y, z, fast=False).grad_fn).__name__ == "MulBackward0"  # the ops: their last, · weight
    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "gated_norm")
    assert "SEQLAB_DISABLE_KERNELS" in gn.why_not_kernel(y, z, norm.weight)
    assert type(norm(y, z).grad_fn).__name__.startswith("_GatedRMSNorm")
