"""seqlab.kernels.activations (activations.cpp): GELU, exact and tanh-approximated, against float64 truth and torch."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from seqlab.kernels import activations
from seqlab.kernels.activations import gelu, gelu_tanh
from seqlab.layers.mlp import MLP

FORMS = {"tanh": gelu_tanh, "none": gelu}  # F.gelu's approximate= -> seqlab's kernel of that form
forms = pytest.mark.parametrize("form", sorted(FORMS))
needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


def points(dtype):
    """Every regime: the tails (where σ(2z) saturates), the bend near 0, and a long random run that spans
    several threads' tasks and a vector loop's remainder."""
    torch.manual_seed(0)
    fixed = torch.tensor([-1e4, -88.0, -20.0, -5.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 5.0, 20.0, 1e4], dtype=dtype)
    return torch.cat([fixed, 4 * torch.randn(100_003, dtype=dtype)])


@needs_compiler
@forms
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 3e-7), (torch.float64, 1e-14)])
def test_values_and_gradient_match_float64_truth(dtype, tol, form):
    """Errors against torch's float64 GELU, relative to max(1, |y|) and max(1, |dL/dy|): float32 stays within a
    few ulps (torch's own float32 kernels are off by 1.5e-7 (tanh) and 1.0e-6 (exact) in value, 1e-6 and
    2.7e-7 in gradient, on these points)."""
    x = points(dtype).requires_grad_()
    y = FORMS[form](x)
    assert y.grad_fn is not None and "_Gelu" in type(y.grad_fn).__name__  # the kernel ran, not F.gelu
    truth_x = x.detach().double().requires_grad_()
    truth = F.gelu(truth_x, approximate=form)
    value_tol = 1.5e-7 if (form, dtype) == ("none", torch.float32) else tol  # the README: 1.1e-7 measured
    assert ((y.double() - truth).abs() / truth.abs().clamp_min(1.0)).max().item() < value_tol
    g = torch.randn_like(y)
    y.backward(g)
    truth.backward(g.double())
    assert ((x.grad.double() - truth_x.grad).abs() / g.double().abs().clamp_min(1.0)).max().item() < tol


@needs_compiler
@forms
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_stays_nan(dtype, form):
    x = torch.tensor([float("nan"), -12.0, 0.5] + [1.0] * 14, dtype=dtype, requires_grad=True)  # 17: a tail
    y = FORMS[form](x)
    y.backward(torch.ones_like(y))
    assert torch.isnan(y[0]) and torch.isnan(x.grad[0])
    assert torch.isfinite(y[1:]).all() and torch.isfinite(x.grad[1:]).all()


@needs_compiler
@forms
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_inputs_give_the_limits(dtype, form):
    """Far out on either side GELU is 0 and x, its derivative 0 and 1, for every finite x (the tanh form once gave
    -4.9 at x = -3e38 in float32 and a NaN gradient at -1e300 in float64); 20 values: a vector and a tail."""
    big = torch.finfo(dtype).max / 2
    neg = torch.tensor([-big, -1e30, -1e10, -1e4, -200.0, -40.0, -31.0] * 3 + [-100.0], dtype=dtype)
    for x0 in (neg, -neg):
        x = x0.clone().requires_grad_()
        y = FORMS[form](x)
        y.backward(torch.ones_like(y))
        want_y, want_g = (
            (torch.zeros_like(x0), torch.zeros_like(x0)) if x0[0] < 0 else (x0, torch.ones_like(x0))
        )
        torch.testing.assert_close(y.detach(), want_y, rtol=1e-6, atol=1e-30)
        torch.testing.assert_close(x.grad, want_g, rtol=1e-6, atol=1e-30)


@needs_compiler
@forms
def test_bfloat16_is_the_float32_kernel_rounded_once(form):
    """bfloat16 (torch.autocast's CPU dtype): each value and gradient is the float32 kernel's on the same inputs
    rounded to nearest-even (exactly, the tails included; NaN stays NaN), and within bf16's rounding of torch's."""
    x = points(torch.float32).to(torch.bfloat16)
    x[5] = float("nan")
    xb = x.clone().requires_grad_()
    y = FORMS[form](xb)
    assert y.dtype == torch.bfloat16 and "_Gelu" in type(y.grad_fn).__name__
    g = torch.randn(x.shape).to(torch.bfloat16)
    y.backward(g)
    xf = x.float().requires_grad_()
    yf = FORMS[form](xf)
    yf.backward(g.float())
    exact = {"rtol": 0, "atol": 0, "equal_nan": True}
    torch.testing.assert_close(y, yf.to(torch.bfloat16), **exact)
    torch.testing.assert_close(xb.grad, xf.grad.to(torch.bfloat16), **exact)
    assert torch.isnan(y[5]) and torch.isnan(xb.grad[5])
    finite = torch.isfinite(x)
    ref = F.gelu(x.float(), approximate=form)[finite]
    assert (
        (y.float()[finite] - ref).abs() / ref.abs().clamp_min(1.0)
    ).max().item() < 2**-8  # half a bf16 ulp


@needs_compiler
@forms
def test_gradcheck_and_double_backward_in_float64(form):
    x = torch.randn(4, 37, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(FORMS[form], (x,))
    assert torch.autograd.gradgradcheck(FORMS[form], (x,))  # through F.gelu, differentiable again


def test_other_layouts_and_a_failed_build_take_torchs_kernel(failed_build):
    x = torch.randn(6, 8, dtype=torch.float64).t()  # not contiguous
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=0, atol=0)
    torch.testing.assert_close(gelu(x), F.gelu(x), rtol=0, atol=0)

    failed_build(activations.EXTENSION)
    mlp = MLP(8, 16, activation="gelu_tanh").double()
    x = torch.randn(3, 8, dtype=torch.float64)
    with failed_build.warns_once("GELU kernel"):
        y = mlp(x)
        mlp(x)
    ref = mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh"))
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


# ---- the bias form: gelu_tanh(p + b) with b's gradient from the same pass, and the MLP paths that use it ------


@needs_compiler
@forms
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 3e-7), (torch.float64, 1e-14)])
def test_bias_form_matches_float64_truth(dtype, tol, form, graph_names):
    """Values and dL/dp within the element-wise kernel's tolerance; dL/db (a sum over 1,492 rows, accumulated in
    float64) within float32 rounding of each summand."""
    torch.manual_seed(1)
    p = points(dtype)[: 1492 * 67].view(1492, 67).requires_grad_()  # 67 columns: four vectors and a tail
    b = torch.randn(67, dtype=dtype, requires_grad=True)
    y = activations.gelu_bias(p, b, form)
    assert "_GeluBiasBackward" in graph_names(y)
    tp, tb = p.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    truth = F.gelu(tp + tb, approximate=form)
    assert ((y.double() - truth).abs() / truth.abs().clamp_min(1.0)).max().item() < tol
    g = torch.randn_like(y)
    y.backward(g)
    truth.backward(g.double())
    assert ((p.grad.double() - tp.grad).abs() / g.double().abs().clamp_min(1.0)).max().item() < tol
    scale = (g.double().abs().sum(0)).clamp_min(1.0)  # |db| ≤ Σ|g| (gelu' is within [-0.13, 1.13])
    assert ((b.grad.double() - tb.grad).abs() / scale).max().item() < 2 * tol


@needs_compiler
@forms
def test_bias_form_gradcheck_double_backward_and_nan(form):
    p = torch.randn(5, 19, dtype=torch.float64, requires_grad=True)
    b = torch.randn(19, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p, b: activations.gelu_bias(p, b, form), (p, b))
    assert torch.autograd.gradgradcheck(lambda p, b: activations.gelu_bias(p, b, form), (p, b))
    p = torch.ones(3, 17, requires_grad=True)
    b = torch.zeros(17, requires_grad=True)
    with torch.no_grad():
        p[1, 4] = float("nan")
    activations.gelu_bias(p, b, form).sum().backward()
    assert torch.isnan(p.grad[1, 4]) and torch.isnan(b.grad[4])
    assert torch.isfinite(p.grad[0]).all() and torch.isfinite(b.grad[:4]).all()


def _mlp_and_inputs(activation="gelu_tanh"):
    torch.manual_seed(0)
    mlp = MLP(16, 40, activation=activation).double()
    return mlp, torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)


@needs_compiler
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("train", [True, False])
def test_mlp_with_the_bias_in_the_gelu_equals_the_written_out_layer(train, activation, graph_names):
    """The MLP's hidden layer through ``gelu_bias`` (W_1's product without b_1, the bias added in the
    kernel): the same output and the same gradient for the input and every parameter."""
    mlp, x = _mlp_and_inputs(activation)
    mlp.train(train)
    out = mlp(x)
    assert "_GeluBiasBackward" in graph_names(out)  # the fused kernel ran
    ref = mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh" if activation == "gelu_tanh" else "none"))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    g = torch.randn_like(out)
    leaves = (x, *mlp.parameters())
    for a, e in zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g), strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-12)


def test_a_hook_on_the_first_linear_layer_still_runs(graph_names):
    """The fused hidden layer skips fc1's call; a forward hook on fc1 sends it back through the call."""
    mlp, x = _mlp_and_inputs()
    seen = []
    mlp.fc1.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    y = mlp(x)
    assert seen == [(3, 5, 40)] and "_GeluBiasBackward" not in graph_names(y)


@pytest.mark.parametrize(
    ("p", "b", "approximate", "match"),
    [
        (
            torch.randn(3, 5),
            torch.randn(4),
            "none",
            r"b \(n,\); got p torch.float32 \(3, 5\) and b torch.float32 \(4,\)",
        ),
        (torch.randn(3, 5), torch.randn(1, 5), "tanh", r"and b torch.float32 \(1, 5\)"),
        (torch.ones(3, 5, dtype=torch.long), torch.ones(5, dtype=torch.long), "none", "got p torch.int64"),
        (torch.randn(3, 5), torch.randn(5), "tan", "approximate must be 'none' or 'tanh'"),
    ],
)
def test_bias_form_refuses_bad_arguments(p, b, approximate, match):
    with pytest.raises(ValueError, match=match):
        activations.gelu_bias(p, b, approximate)
