"""SSM layers: discretization, the S4D mixer's two views, the Mamba mixer; the token-mixer laws for both."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlab.layers.ssm import S4D, Mamba, discretize, discretize_bilinear, discretize_zoh

F64 = torch.float64


def _state_close(a, b, tol=1e-9):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    else:
        for u, v in zip(a, b, strict=True):
            _state_close(u, v, tol)


def _make(kind, d, n, seed):
    torch.manual_seed(seed)
    if kind == "s4d-zoh-lin":
        return S4D(d, 2 * n, dtype=F64)
    if kind == "s4d-bilinear-inv":
        return S4D(d, 2 * n, discretization="bilinear", init="inv", dtype=F64)
    return Mamba(d, d_state=n, d_conv=3, chunk_size=4, dtype=F64)


KINDS = ["s4d-zoh-lin", "s4d-bilinear-inv", "mamba"]


# ---- discretization ----------------------------------------------------------------------------------------


def test_zoh_equals_the_exact_solution_of_the_ode():
    # x' = a x + b u, u constant over [0, Δ], x(0) = 0: x(Δ) = (e^{aΔ} - 1)/a · b u (matrix exponential
    # of the augmented system [[a, b], [0, 0]] gives the same Ā, B̄).
    a = torch.tensor([-0.5 + 3.0j, -2.0 + 0.0j], dtype=torch.complex128)
    b = torch.tensor([1.0 + 0.5j, 2.0 + 0.0j], dtype=torch.complex128)
    dt = torch.tensor(0.3, dtype=F64)
    dA, dB = discretize_zoh(a, b, dt)
    for i in range(2):
        M = torch.zeros(2, 2, dtype=torch.complex128)
        M[0, 0], M[0, 1] = a[i] * dt, b[i] * dt
        E = torch.linalg.matrix_exp(M)
        torch.testing.assert_close(dA[i], E[0, 0])
        torch.testing.assert_close(dB[i], E[0, 1])


def test_bilinear_formula_and_agreement_for_small_steps():
    a = torch.tensor([-0.5, -3.0], dtype=F64)
    b = torch.ones(2, dtype=F64)
    dA, dB = discretize_bilinear(a, b, torch.tensor(0.2, dtype=F64))
    torch.testing.assert_close(dA, (1 - 0.1 * a.neg()) / (1 + 0.1 * a.neg()))
    torch.testing.assert_close(dB, 0.2 / (1 - 0.1 * a))
    z, zb = discretize(a, b, torch.tensor(1e-3, dtype=F64), "zoh")
    l, lb = discretize(a, b, torch.tensor(1e-3, dtype=F64), "bilinear")
    torch.testing.assert_close(z, l, atol=1e-8, rtol=0)  # both are e^{aΔ} to second order
    torch.testing.assert_close(zb, lb, atol=1e-8, rtol=0)
    with pytest.raises(ValueError, match="zoh"):
        discretize(a, b, torch.tensor(0.1), "euler")


# ---- S4D ---------------------------------------------------------------------------------------------------


def test_s4d_kernel_is_the_unrolled_recurrence():
    torch.manual_seed(0)
    m = S4D(3, 8, dtype=F64)
    t = 20
    impulse = torch.zeros(1, t, 3, dtype=F64)
    impulse[:, 0] = 1.0
    y, _ = m.ssm_conv(impulse)  # impulse response: K_k + D δ_k
    _, dA, dB, C = m._discrete()
    K = torch.stack([2 * (C * dB * dA**k).sum(-1).real for k in range(t)], dim=0)  # (t, d)
    K[0] += m.D
    torch.testing.assert_close(y[0], K)


@pytest.mark.parametrize("n", [1, 2, 7, 16, 17, 1025])
def test_s4d_powers_in_blocks_equal_one_exp_per_power(n):
    """The convolution view's Ā^k, k < n, as products of two complex exps (one per block of about √n powers, one
    within the block) equal exp(k log Ā) to float64 rounding, gradients too, at block counts and sizes that do and
    do not divide n."""
    from seqlab.layers.s4d import _powers

    torch.manual_seed(n)
    log_a = torch.complex(-torch.rand(3, 4, dtype=F64) * 0.05, torch.randn(3, 4, dtype=F64)).requires_grad_()
    got = _powers(log_a, n)
    want = torch.exp(log_a[..., None] * torch.arange(n, dtype=F64))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn(got.shape, dtype=torch.complex128)
    (d_got,) = torch.autograd.grad(got, log_a, g)
    (d_want,) = torch.autograd.grad(want, log_a, g)
    torch.testing.assert_close(d_got, d_want, rtol=1e-10, atol=1e-10)


def test_s4d_lin_and_inv_initializations():
    m = S4D(2, 8, init="lin")
    torch.testing.assert_close(-torch.exp(m.A_log_re), torch.full((2, 4), -0.5))
    torch.testing.assert_close(m.A_im[0], math.pi * torch.arange(4.0))
    inv = S4D(2, 8, init="inv")
    torch.testing.assert_close(inv.A_im[0], (8 / math.pi) * (8 / (2 * torch.arange(4.0) + 1) - 1))
    dt = torch.exp(m.log_dt)
    assert ((dt >= 1e-3) & (dt <= 1e-1)).all()
    with pytest.raises(ValueError, match="even d_state"):
        S4D(4, 5)


# ---- the token-mixer laws ----------------------------------------------------------------------------------


@settings(deadline=None, max_examples=8)
@given(kind=st.sampled_from(KINDS), t=st.integers(1, 12), n=st.integers(1, 4), seed=st.integers(0, 999))
def test_step_equals_forward(kind, t, n, seed):
    """For S4D this is the recurrent view (step) against the convolution view (FFT) of the same SSM."""
    m = _make(kind, 4, n, seed)
    x = torch.randn(2, t, 4, dtype=F64)
    y, s_full = m(x)
    state, ys = m.init_state(2), []
    for i in range(t):
        y_t, state = m.step(x[:, i], state)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y, atol=1e-9, rtol=1e-9)
    _state_close(state, s_full)


@settings(deadline=None, max_examples=8)
@given(kind=st.sampled_from(KINDS), t=st.integers(2, 14), data=st.data())
def test_chunked_with_carried_state_equals_whole(kind, t, data):
    m = _make(kind, 4, 3, data.draw(st.integers(0, 999)))
    s = data.draw(st.integers(1, t - 1))
    x = torch.randn(2, t, 4, dtype=F64)
    y, s_full = m(x)
    a, state = m(x[:, :s])
    b, state = m(x[:, s:], state)
    torch.testing.assert_close(torch.cat([a, b], 1), y, atol=1e-9, rtol=1e-9)
    _state_close(state, s_full)


@settings(deadline=None, max_examples=8)
@given(kind=st.sampled_from(KINDS), t=st.integers(2, 14), data=st.data())
def test_causal(kind, t, data):
    m = _make(kind, 4, 3, data.draw(st.integers(0, 999)))
    s = data.draw(st.integers(1, t - 1))
    x = torch.randn(2, t, 4, dtype=F64)
    x2 = x.clone()
    x2[:, s:] = torch.randn_like(x2[:, s:])
    torch.testing.assert_close(m(x)[0][:, :s], m(x2)[0][:, :s], atol=1e-12, rtol=0)


# ---- fast paths against the references ---------------------------------------------------------------------


def _outputs_and_grads(run, m, x, state=None):
    """y, the final state's parts and the gradients of x, the initial state and every parameter."""
    y, final = run(x, state)
    parts = [final] if isinstance(final, torch.Tensor) else list(final)
    gen = torch.Generator().manual_seed(1)
    loss = (y * torch.randn(y.shape, generator=gen, dtype=y.dtype)).sum()
    loss = loss + sum((torch.view_as_real(p) if p.is_complex() else p).sum() for p in parts)
    inputs = [x, *([] if state is None else ([state] if isinstance(state, torch.Tensor) else list(state)))]
    grads = torch.autograd.grad(loss, [*inputs, *m.parameters()])
    return [y, *parts, *grads]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("masked", [False, True])
def test_fast_path_equals_reference_with_gradients(kind, masked):
    """S4D: FFT convolution against the recurrence; Mamba: chunked scan against the loop. With a carried
    state and (masked) right padding, outputs, final states and every gradient agree in float64."""
    m = _make(kind, 8, 3, 0)
    m.chunk_size = 5
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 13, 8, generator=gen, dtype=F64, requires_grad=True)
    with torch.no_grad():
        _, state = m(torch.randn(3, 4, 8, generator=gen, dtype=F64))
    leaf = lambda s: s.clone().requires_grad_()  # noqa: E731
    state = leaf(state) if isinstance(state, torch.Tensor) else tuple(leaf(s) for s in state)
    mask = (torch.arange(13)[None, :] < torch.tensor([13, 7, 2])[:, None]) if masked else None
    fast = _outputs_and_grads(lambda x, s: m(x, s, mask), m, x, state)
    ref = _outputs_and_grads(lambda x, s: m.forward_ref(x, s, mask), m, x, state)
    for a, b in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


def _refuse(*args, **kwargs):
    raise AssertionError("this path must not run")


@pytest.mark.parametrize("kind", KINDS)
def test_fast_path_flag_selects_the_path(kind, monkeypatch):
    m = _make(kind, 4, 2, 0)
    x = torch.randn(2, 6, 4, dtype=F64)
    assert m.why_not_fast_path(x) is None
    want, _ = m.forward_ref(x)
    slow = "selective_scan_ref" if kind == "mamba" else None
    if slow:
        monkeypatch.setattr(f"seqlab.layers.mamba.{slow}", _refuse)
    else:
        monkeypatch.setattr(m, "ssm_recurrent_ref", _refuse)
    torch.testing.assert_close(m(x)[0], want, atol=1e-10, rtol=0)
    monkeypatch.undo()
    m.fast_path = False
    assert "fast_path=False" in m.why_not_fast_path(x)
    if kind == "mamba":
        monkeypatch.setattr("seqlab.layers.mamba.selective_scan", _refuse)
    else:
        monkeypatch.setattr(m, "ssm_conv", _refuse)
    torch.testing.assert_close(m(x)[0], want, atol=1e-10, rtol=0)


# ---- Mamba -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_conv", [2, 4])
def test_mamba_conv_state_of_a_padded_row_is_its_last_real_inputs(d_conv):
    """Rows shorter than d_conv keep the carried conv inputs in front, as when run alone."""
    torch.manual_seed(0)
    m = Mamba(4, d_state=3, d_conv=d_conv, dtype=F64)
    x = torch.randn(3, 6, 4, dtype=F64)
    mask = torch.arange(6)[None, :] < torch.tensor([6, 3, 1])[:, None]
    _, (conv, h) = m(x, mask=mask)
    for i, n in enumerate([6, 3, 1]):
        _, (conv_i, h_i) = m(x[i : i + 1, :n])
        torch.testing.assert_close(conv[i : i + 1], conv_i, atol=1e-12, rtol=0)
        torch.testing.assert_close(h[i : i + 1], h_i, atol=1e-12, rtol=0)


def test_mamba_initialization_and_parameter_names():
    m = Mamba(32, d_state=16, d_conv=4, expand=2)
    names = {n.split(".")[0] for n, _ in m.named_parameters()}
    assert names == {"in_proj", "conv1d", "x_proj", "dt_proj", "A_log", "D", "out_proj"}
    assert m.dt_rank == 2 and m.x_proj.out_features == 2 + 32
    torch.testing.assert_close(-torch.exp(m.A_log[5]), -torch.arange(1.0, 17.0))
    dt = torch.nn.functional.softplus(m.dt_proj.bias)
    assert ((dt >= 1e-3 * 0.999) & (dt <= 1e-1 * 1.001)).all()
    assert torch.all(m.D == 1)
    conv, h = m.init_state(3)
    assert conv.shape == (3, 64, 4) and h.shape == (3, 64, 16)
    conv, h = m.init_state(2, dtype=F64)
    assert conv.dtype == h.dtype == F64
    with pytest.raises(ValueError, match="expects x of shape"):
        m(torch.randn(2, 5, 31))


@pytest.mark.parametrize("kind", KINDS)
def test_every_parameter_learns(kind):
    m = _make(kind, 4, 2, 0).float()
    y, _ = m(torch.randn(2, 9, 4))
    y.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["s4d", "mamba"])
def test_half_precision_layers_run_forward_and_step_alike(name, dtype):
    """A bf16 or fp16 S4D or Mamba (not autocast: the parameters themselves) runs its recurrence in float32, as
    its scan does: forward, forward_ref and step agree to the precision's rounding (S4D failed on complex half
    numbers, a bf16 Mamba on its conv kernel's dtype check, an fp16 Mamba's step on a float32 state)."""
    from seqlab.layers import create_mixer
    from seqlab.models.lm import LM, LMConfig

    torch.manual_seed(0)
    layer = create_mixer(name, 8, dtype=dtype)
    x = torch.randn(2, 5, 8, dtype=dtype)
    y, _ = layer(x)
    ref, _ = layer.forward_ref(x)
    state, steps = None, []
    for i in range(5):
        out, state = layer.step(x[:, i], state if state is not None else layer.init_state(2))
        steps.append(out)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    assert y.dtype == dtype
    torch.testing.assert_close(ref, y, rtol=tol, atol=tol)
    torch.testing.assert_close(torch.stack(steps, 1), y, rtol=tol, atol=tol)
    lm = LM(LMConfig(mixer=name, vocab_size=20, d_model=16, n_layers=1), dtype=dtype).eval()
    assert lm.generate(torch.tensor([[1, 2]]), 3).shape == (1, 5)


def test_s4d_step_from_no_state_starts_at_zeros():
    from seqlab.layers import S4D

    layer = S4D(8, d_state=4)
    x = torch.randn(2, 8)
    a, sa = layer.step(x, None)
    b, sb = layer.step(x, layer.init_state(2))
    assert torch.equal(a, b) and torch.equal(sa, sb)
