"""The Mamba-2 block (seqlab.layers.mamba2): the fast path (scan kernel, conv kernel) against the recurrence,
outputs, states and every gradient, with and without a padding mask and a carried state; float32 near float64;
the constructor's refusals; the gated norm's formula. The four token-mixer laws run in
tests/layers/test_mixer_contract.py, HF parity in tests/interop/test_hf_mamba2.py."""

import pytest
import torch
import torch.nn.functional as F

from seqlab.layers import Mamba2
from seqlab.layers.mamba2 import GatedRMSNorm

F64 = torch.float64


def block(seed=0, dtype=F64, **kw):
    torch.manual_seed(seed)
    fields = {"d_state": 6, "headdim": 4, "n_groups": 2, **kw}
    m = Mamba2(12, **fields).to(dtype)
    with torch.no_grad():  # D, the norm weights and Δ's bias away from their initial constants
        m.D.uniform_(-1, 1)
        m.norm.weight.uniform_(0.5, 1.5)
        m.dt_bias.add_(torch.randn_like(m.dt_bias))
    return m


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("carried", [False, True])
def test_fast_path_equals_the_recurrence_with_gradients(padded, carried):
    m = block()
    x = torch.randn(3, 11, 12, dtype=F64)
    mask = torch.arange(11)[None] < torch.tensor([11, 7, 2])[:, None] if padded else None
    state = None
    if carried:
        conv, ssm = m.init_state(3)
        state = (torch.randn_like(conv), torch.randn_like(ssm))
    params = list(m.parameters())
    outs = {}
    for path in ("fast", "ref"):
        fn = m.forward if path == "fast" else m.forward_ref
        y, (conv_state, ssm_state) = fn(x, state, mask)
        keep = slice(None) if mask is None else mask
        loss = (y[keep] ** 2).sum() + (ssm_state * 0.3).sum() + conv_state.sum()
        outs[path] = (y[keep], conv_state, ssm_state, torch.autograd.grad(loss, params))
    for a, b in zip(outs["fast"][:3], outs["ref"][:3], strict=True):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)
    for (name, _), a, b in zip(m.named_parameters(), outs["fast"][3], outs["ref"][3], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"d{name}")


@pytest.mark.parametrize("n_groups", [1, 2])
def test_steps_equal_the_whole_sequence_with_groups(n_groups):
    """step, one position at a time, against forward: each head reads its own group's B and C."""
    m = block(n_groups=n_groups)
    x = torch.randn(2, 9, 12, dtype=F64)
    conv, ssm = m.init_state(2)
    state = (torch.randn_like(conv), torch.randn_like(ssm))
    y, (conv_end, ssm_end) = m(x, state)
    ys = []
    for i in range(9):
        y_t, state = m.step(x[:, i], state)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(state[0], conv_end, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(state[1], ssm_end, atol=1e-12, rtol=1e-12)


def test_float32_fast_path_near_float64():
    m64 = block()
    m32 = block().float()
    x = torch.randn(2, 40, 12, dtype=F64)
    y64, (_, s64) = m64.forward_ref(x)
    y32, (_, s32) = m32(x.float())
    torch.testing.assert_close(y32.double(), y64, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s32.double(), s64, atol=1e-5, rtol=1e-4)


def test_gated_norm_formula():
    norm = GatedRMSNorm(6, 3, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    y, z = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    g = (y * z * torch.sigmoid(z)).view(4, 2, 3)  # y ⊙ silu(z), in 2 groups of 3
    want = (g / torch.sqrt((g**2).mean(-1, keepdim=True) + 1e-5)).view(4, 6) * norm.weight
    torch.testing.assert_close(norm(y, z), want, atol=1e-12, rtol=1e-12)


def test_heads_state_and_parameter_shapes():
    m = Mamba2(16, d_state=8, headdim=8, n_groups=2)
    assert (m.d_inner, m.n_heads, m.conv_dim) == (32, 4, 32 + 2 * 2 * 8)
    assert m.in_proj.weight.shape == (32 + 64 + 4, 16) and m.A_log.shape == m.D.shape == m.dt_bias.shape == (
        4,
    )
    conv, ssm = m.init_state(3)
    assert conv.shape == (3, 64, 4) and ssm.shape == (3, 4, 8, 8)
    A = -torch.exp(m.A_log)
    assert ((A <= -1) & (A >= -16)).all()  # the paper's A ~ -U(1, 16)
    dt = F.softplus(m.dt_bias)
    assert ((dt >= 1e-4) & (dt <= 0.1 + 1e-6)).all()


def test_constructor_refusals():
    with pytest.raises(ValueError, match=r"d_model = 20 must split into heads of headdim=64"):
        Mamba2(10)
    with pytest.raises(ValueError, match="n_groups=3: give a d_model that is a multiple of 12"):
        Mamba2(16, headdim=8, n_groups=3)
    with pytest.raises(ValueError, match="headdim"):
        Mamba2(16, headdim=0)
    with pytest.raises(ValueError, match="dt_min"):
        Mamba2(16, dt_min=0.5, dt_max=0.1)


def test_bad_inputs_and_states_are_named():
    m = Mamba2(16, headdim=8)
    with pytest.raises(ValueError, match=r"Mamba2 expects x of shape \(b, t, 16\)"):
        m(torch.randn(2, 5, 8))
    conv, ssm = m.init_state(2)
    with pytest.raises(ValueError, match="ssm_state"):
        m(torch.randn(2, 5, 16), (conv, ssm[:, :, :, :3]))
    with pytest.raises(ValueError, match="x_t"):
        m.step(torch.randn(2, 8))


def test_fused_gated_norm_equals_the_ops_with_first_and_second_derivatives():
    from seqlab.kernels.gated_norm import _GatedRMSNorm, gated_rms_norm_ref

    g = torch.Generator().manual_seed(3)
    y, z = (torch.randn(3, 5, 12, generator=g, dtype=F64).requires_grad_() for _ in range(2))
    w = (torch.rand(12, generator=g, dtype=F64) + 0.5).requires_grad_()
    out = _GatedRMSNorm.apply(y, z, w, 4, 1e-5)
    want = gated_rms_norm_ref(y, z, w, 4, 1e-5)
    torch.testing.assert_close(out, want, atol=1e-14, rtol=1e-13)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (y, z, w), dout)
    ref = torch.autograd.grad(want, (y, z, w), dout)
    for name, a, b in zip(("dy", "dz", "dw"), got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=name)
    assert torch.autograd.gradcheck(lambda *a: _GatedRMSNorm.apply(*a, 4, 1e-5), (y, z, w))
    assert torch.autograd.gradgradcheck(lambda *a: _GatedRMSNorm.apply(*a, 4, 1e-5), (y, z, w))


def test_fused_gated_norm_keeps_less_for_the_backward():
    """y, z and the groups' 1 / rms only: the ops keep silu(z), the product and its normalized form as well."""
    from seqlab.kernels.gated_norm import _GatedRMSNorm, gated_rms_norm_ref

    y, z = (torch.randn(4, 64, 32).requires_grad_() for _ in range(2))
    w = torch.ones(32, requires_grad=True)

    def saved(fn) -> int:
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() if t.dim() else 0
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(y, z, w, 8, 1e-5).sum().backward()
        return total

    fused, ops = saved(_GatedRMSNorm.apply), saved(gated_rms_norm_ref)
    assert fused <= 2 * y.numel() + w.numel() + 4 * 64 * 4 < ops
