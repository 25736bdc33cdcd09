"""seqlab.kernels.mingru_scan (mingru_scan.cpp): minGRU's recurrence in one C++ pass each way, against the loop of
torch ops (values, gradients for the projection and the initial state, second derivatives), across the kernel's
blocks of 32 channels, on a strided view, with several threads, and its input checks."""

import shutil

import pytest
import torch

from seqlab.kernels.mingru_scan import EXTENSION, mingru_scan, mingru_scan_ref
from seqlab.layers.mingru import log_space_scan_ref

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")
F64 = torch.float64


def inputs(b=3, t=17, e=37, dtype=F64, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    ku = (torch.randn(b, t, 2 * e, generator=g, dtype=dtype) * scale).requires_grad_()
    h0 = torch.randn(b, e, generator=g, dtype=dtype).requires_grad_()
    return ku, h0


def both_grads(h, h_ref, wanted):
    g = torch.randn_like(h)
    return torch.autograd.grad(h, wanted, g), torch.autograd.grad(h_ref, wanted, g)


@needs_compiler
@pytest.mark.parametrize(("dtype", "tol"), [(F64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize(("b", "t", "e"), [(3, 17, 37), (1, 1, 1), (2, 40, 32), (2, 5, 64), (1, 3, 100)])
def test_values_and_gradients_match_the_loop(dtype, tol, b, t, e):
    """e = 37, 100: full 32-channel blocks and a partial one; 32, 64: blocks exactly; t = 1: one step."""
    ku, h0 = inputs(b, t, e, dtype)
    h, ref = mingru_scan(ku, h0), mingru_scan_ref(ku, h0)
    assert "MinGRUScan" in type(h.grad_fn).__name__  # the kernel ran
    torch.testing.assert_close(h, ref, rtol=tol, atol=tol)
    for got, want in zip(*both_grads(h, ref, [ku, h0]), strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * 10)


@needs_compiler
def test_the_recurrence_is_the_linear_one_in_log_space_terms():
    """The same h as log_space_scan_ref's h_t = a_t h_{t-1} + b_t, with log a = log σ(-k), log b = log σ(k) +
    log g(u): an independent statement of the equations."""
    ku, h0 = inputs(2, 30, 9)
    k, u = ku.detach().chunk(2, -1)
    log_g = torch.where(u >= 0, torch.log(u.clamp(min=0) + 0.5), torch.nn.functional.logsigmoid(u))
    log_a, log_b = torch.nn.functional.logsigmoid(-k), torch.nn.functional.logsigmoid(k) + log_g
    want = log_space_scan_ref(log_a, log_b, h0.detach())
    torch.testing.assert_close(mingru_scan(ku.detach(), h0.detach()), want, rtol=1e-12, atol=1e-12)


@needs_compiler
def test_gradcheck_and_second_derivatives():
    ku, h0 = inputs(2, 6, 5, scale=1.0)
    assert torch.autograd.gradcheck(mingru_scan, (ku, h0))
    assert torch.autograd.gradgradcheck(mingru_scan, (ku, h0))  # create_graph: through the reference


@needs_compiler
def test_saturated_gates_stay_exact_in_float32():
    """k = ±40: σ(-k) is 4e-18 or 1 - 4e-18; 1 - σ(k) would round it to 0 in float32, the kernel keeps it: with
    h_0 = 1e20 the kept part, 4.2e2, is most of h_1."""
    ku = torch.zeros(1, 4, 2)
    ku[0, :, 0] = torch.tensor([40.0, -40.0, 40.0, 30.0])
    h0 = torch.full((1, 1), 1e20)
    want = mingru_scan_ref(ku.double(), h0.double())
    assert want[0, 0, 0] > 400  # σ(-40) h_0 + σ(40) g(0)
    torch.testing.assert_close(mingru_scan(ku, h0).double(), want, rtol=1e-5, atol=0.0)


@needs_compiler
def test_a_view_with_strided_rows_is_read_in_place():
    """ku as a view whose rows are wider than 2e (part of a wider projection) is read without a copy."""
    wide, h0 = inputs(2, 12, 15)
    ku = wide[..., :20]  # (2, 12, 20): e = 10, rows 30 apart
    h, ref = mingru_scan(ku, h0[:, :10]), mingru_scan_ref(ku, h0[:, :10])
    torch.testing.assert_close(h, ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(EXTENSION.load().forward(ku, h0[:, :10].contiguous()), ref)
    for got, want in zip(*both_grads(h, ref, [wide, h0]), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


@needs_compiler
def test_threads_give_the_same_numbers():
    """Units of work are (batch row, block of channels): each is computed whole by one thread."""
    ku, h0 = inputs(4, 50, 70)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mingru_scan(ku, h0)
        g1 = torch.autograd.grad(one.sum(), [ku, h0])
        torch.set_num_threads(2)
        two = mingru_scan(ku, h0)
        g2 = torch.autograd.grad(two.sum(), [ku, h0])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two) and all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))


def test_other_devices_and_dtypes_take_the_reference(monkeypatch):
    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "mingru_scan")
    ku, h0 = inputs(2, 5, 3)
    h = mingru_scan(ku, h0)
    assert "MinGRUScan" not in type(h.grad_fn).__name__
    torch.testing.assert_close(h, mingru_scan_ref(ku, h0))
    bf = mingru_scan(ku.detach().bfloat16(), h0.detach().bfloat16())  # the kernel takes float32/64 only
    assert bf.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("ku", "h0", "message"),
    [
        (torch.zeros(2, 5, 7), torch.zeros(2, 3), r"ku of shape \(b, t, 2e\) with t >= 1, got \(2, 5, 7\)"),
        (torch.zeros(2, 0, 6), torch.zeros(2, 3), r"t >= 1, got \(2, 0, 6\)"),
        (torch.zeros(5, 6), torch.zeros(2, 3), r"got \(5, 6\)"),
        (torch.zeros(2, 5, 6), torch.zeros(3, 3), r"h0 of shape \(b, e\) = \(2, 3\), got \(3, 3\)"),
        (torch.zeros(2, 5, 6), None, r"h0 of shape \(b, e\) = \(2, 3\), got NoneType"),
        (torch.zeros(2, 5, 6, dtype=torch.long), torch.zeros(2, 3), "floating ku and h0 of one dtype"),
        (torch.zeros(2, 5, 6), torch.zeros(2, 3, dtype=F64), "got torch.float32 on cpu and torch.float64"),
    ],
)
def test_bad_inputs_say_what_was_expected(ku, h0, message):
    with pytest.raises(ValueError, match=message):
        mingru_scan(ku, h0)


@needs_compiler
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda k: k.forward(torch.zeros(2, 5, 7), torch.zeros(2, 3)), "ku must be \\(b, t, 2e\\)"),
        (lambda k: k.forward(torch.zeros(2, 5, 6), torch.zeros(2, 4)), "h0 must be a contiguous \\(b, e\\)"),
        (
            lambda k: k.forward(torch.zeros(2, 5, 6, dtype=torch.long), torch.zeros(2, 3)),
            "float32 or float64",
        ),
        (
            lambda k: k.backward(
                torch.zeros(2, 4, 3), torch.zeros(2, 5, 6), torch.zeros(2, 3), torch.zeros(2, 5, 3)
            ),
            "grad and h must be contiguous \\(b, t, e\\)",
        ),
    ],
)
def test_the_cpp_entry_checks_its_arguments_on_its_own(call, message):
    """The compiled functions refuse what they cannot read (an error, never a read out of bounds)."""
    with pytest.raises(RuntimeError, match=message):
        call(EXTENSION.load())


def test_torch_compile_traces_the_log_space_scan():
    """Under torch.compile the layer takes its log-space scan (torch ops, traced) instead of the C++ call."""
    from seqlab.layers import MinGRU

    torch.manual_seed(0)
    m = MinGRU(8)
    x = torch.randn(2, 12, 8)
    seen = []
    compiled = torch.compile(m, backend=lambda gm, inputs: seen.append(gm) or gm.forward)
    torch.testing.assert_close(compiled(x)[0], m(x)[0], rtol=1e-5, atol=1e-6)
    assert len(seen) == 1  # one graph, no break at the kernel's pybind call
