"""seqlab's additive-attention score kernel (seqlab.kernels.additive_score) against the same score in PyTorch ops,
and AdditiveAttention, which runs it, against OpenNMT-py's and torch's formula through its fallback."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from seqlab.kernels import additive_score as module
from seqlab.kernels.additive_score import additive_scores, additive_scores_ref, why_not_kernel
from seqlab.layers import AdditiveAttention

_CXX = os.environ.get("CXX", "c++")
needs_compiler = pytest.mark.skipif(
    shutil.which(_CXX) is None or shutil.which("ninja") is None,
    reason=f"building seqlab's additive-score kernel needs a C++ compiler ({_CXX}) and ninja on PATH",
)
F64 = torch.float64


def _inputs(q_shape, s, dtype=F64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    b, d = q_shape[0], q_shape[-1]
    q = (torch.randn(*q_shape, generator=g, dtype=F64) * scale).to(dtype).requires_grad_()
    k = (torch.randn(b, s, d, generator=g, dtype=F64) * scale).to(dtype).requires_grad_()
    v = torch.randn(d, generator=g, dtype=F64).to(dtype).requires_grad_()
    return q, k, v


def _scores_and_grads(fn, q, k, v, seed=1):
    e = fn(q, k, v)
    de = torch.randn(e.shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(e.dtype)
    return (e, *torch.autograd.grad(e, (q, k, v), de))


@needs_compiler
@pytest.mark.parametrize(
    ("q_shape", "s"),
    [((3, 7), 5), ((3, 4, 7), 5), ((1, 1), 1), ((2, 33), 9), ((4, 2, 256), 49), ((2, 3, 17), 1)],
)
@pytest.mark.parametrize(("dtype", "tol"), [(F64, 1e-12), (torch.float32, 2e-6)])
def test_kernel_matches_pytorch_ops(q_shape, s, dtype, tol):
    """Scores and every gradient: one query per row (b, d) or t of them (b, t, d); widths that fill whole
    vectors and leave remainders (1, 7, 17, 33, 256); float64 to rounding, float32 within its tanh's error."""
    q, k, v = _inputs(q_shape, s, dtype)
    assert why_not_kernel(q, k, v) is None
    got, want = _scores_and_grads(additive_scores, q, k, v), _scores_and_grads(additive_scores_ref, q, k, v)
    assert got[0].shape == (*q_shape[:-1], s)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=tol * max(1.0, b.abs().max().item()), rtol=0)


@needs_compiler
def test_saturated_and_tiny_sums_stay_finite_and_exact():
    """q + k far past tanh's saturation (±1, zero slope) and near 0, where 1 - 2 / (1 + e^{2u}) cancels: float32
    within 2.5e-7 of float64's tanh, no NaN or inf in any gradient."""
    q, k, v = _inputs((2, 3, 16), 4, torch.float32, scale=60.0)
    with torch.no_grad():
        q[0, 0, :4] = torch.tensor([1e-7, -1e-7, 1e-30, 0.0])
        k[0, :, :4] = 0.0
    got = _scores_and_grads(additive_scores, q, k, v)
    want = _scores_and_grads(additive_scores_ref, *(x.detach().double().requires_grad_() for x in (q, k, v)))
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=2.5e-7 * 16 * 60, rtol=0)


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_change_no_number(threads, torch_threads):
    q, k, v = _inputs((5, 3, 40), 11)
    torch_threads(threads)
    got = _scores_and_grads(additive_scores, q, k, v)
    for a, b in zip(got, _scores_and_grads(additive_scores_ref, q, k, v), strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@needs_compiler
@pytest.mark.parametrize("q_shape", [(2, 5), (2, 3, 5)])
def test_gradcheck_and_double_backward(q_shape):
    q, k, v = _inputs(q_shape, 4)
    assert torch.autograd.gradcheck(additive_scores, (q, k, v))
    assert torch.autograd.gradgradcheck(additive_scores, (q, k, v))  # through the reference


@needs_compiler
def test_non_contiguous_inputs_and_an_unused_gradient():
    q, k, v = _inputs((3, 8, 6), 5)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    kd = k.detach()  # keys without a gradient
    e = additive_scores(qt[:, ::2], kd, v)
    torch.testing.assert_close(e, additive_scores_ref(q[:, ::2], kd, v), atol=1e-12, rtol=0)
    dq, dv = torch.autograd.grad(e.sum(), (q, v))
    rq, rv = torch.autograd.grad(additive_scores_ref(q[:, ::2], kd, v).sum(), (q, v))
    torch.testing.assert_close((dq, dv), (rq, rv), atol=1e-12, rtol=0)


def test_what_keeps_pytorch_ops_and_what_is_refused():
    q, k, v = _inputs((2, 6), 3)
    assert "float32 or float64" in why_not_kernel(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert "dtypes" in why_not_kernel(q.float(), k, v)
    bf = additive_scores(q.bfloat16(), k.bfloat16(), v.bfloat16())  # autocast's dtype: PyTorch's ops
    torch.testing.assert_close(bf.double(), additive_scores_ref(q, k, v), atol=0.1, rtol=0.05)
    with pytest.raises(
        ValueError, match=r"takes q \(b, d\) or \(b, t, d\), k \(b, s, d\) and v \(d,\), got q \(2,"
    ):
        additive_scores(q, k[0], v)
    with pytest.raises(
        ValueError, match=r"must agree in the batch \(first\) and the attention width \(last\)"
    ):
        additive_scores(q, k[:, :, :5], v)
    os.environ["SEQLAB_DISABLE_KERNELS"] = "additive_score"
    try:
        assert "SEQLAB_DISABLE_KERNELS" in why_not_kernel(q, k, v)
    finally:
        del os.environ["SEQLAB_DISABLE_KERNELS"]


@needs_compiler
def test_the_cpp_entry_checks_its_arguments_on_its_own():
    ext = module.EXTENSION.load()
    q, k, v = torch.randn(2, 1, 4), torch.randn(2, 3, 4), torch.randn(4)
    with pytest.raises(RuntimeError, match=r"must agree in b and d"):
        ext.forward(q, torch.randn(2, 3, 5), v)
    with pytest.raises(RuntimeError, match=r"expected q \(b, t, d\), k \(b, s, d\) and v \(d\)"):
        ext.forward(q[0], k, v)
    with pytest.raises(RuntimeError, match=r"contiguous CPU tensors of one dtype"):
        ext.forward(q, k.double(), v)
    with pytest.raises(RuntimeError, match=r"de must be contiguous \(b, t, s\) = \(2, 1, 3\)"):
        ext.backward(torch.randn(2, 3), q, k, v)


@needs_compiler
@pytest.mark.parametrize("many", [False, True])
def test_the_attention_layer_gives_the_numbers_of_its_pytorch_path(many):
    """AdditiveAttention with the kernel and with it switched off (SEQLAB_DISABLE_KERNELS), float64: context,
    weights and every gradient, a padded row included."""
    torch.manual_seed(0)
    layer = AdditiveAttention(6, 5, 7, dtype=F64)
    query = torch.randn(2, 3, 6, dtype=F64) if many else torch.randn(2, 6, dtype=F64)
    keys, mask = torch.randn(2, 4, 5, dtype=F64), torch.tensor([[True] * 4, [True, True, False, False]])

    def run():
        x, h = query.clone().requires_grad_(), keys.clone().requires_grad_()
        c, w = layer(x, h, mask=mask)
        loss = (c * torch.linspace(-1, 1, c.numel(), dtype=F64).view(c.shape)).sum() + w[..., 0].sum()
        return (c, w, *torch.autograd.grad(loss, (x, h, *layer.parameters())))

    got = run()
    os.environ["SEQLAB_DISABLE_KERNELS"] = "additive_score"
    try:
        want = run()
    finally:
        del os.environ["SEQLAB_DISABLE_KERNELS"]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
