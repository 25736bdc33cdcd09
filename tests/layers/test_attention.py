"""Attention layers: fast path against _ref, the mixer laws, GQA, windows, empty rows, RNN attention."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlab.layers.attention import (
    MultiheadAttention,
    SelfAttention,
    scaled_dot_product_attention,
    scaled_dot_product_attention_ref,
)
from seqlab.layers.linear_attention import (
    LinearAttention,
    linear_attention_causal,
    linear_attention_recurrent_ref,
)
from seqlab.layers.masks import causal_mask, key_padding_mask, sliding_window_mask
from seqlab.layers.positional import RotaryEmbedding
from seqlab.layers.rnn_attention import AdditiveAttention, LuongAttention

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _qkv(b, h, g, t_q, t_k, k, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t_q, k, generator=gen, dtype=dtype, requires_grad=True)
    kk = torch.randn(b, g, t_k, k, generator=gen, dtype=dtype, requires_grad=True)
    v = torch.randn(b, g, t_k, k, generator=gen, dtype=dtype, requires_grad=True)
    return q, kk, v


def _grads(fn, *xs):
    out = fn(*xs)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    gs = [x.grad.clone() for x in xs]
    for x in xs:
        x.grad = None
    return out.detach(), gs


@settings(max_examples=25, deadline=None)
@given(
    t_q=st.integers(1, 7),
    extra=st.integers(0, 5),
    g=st.sampled_from([1, 2, 4]),
    causal=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_sdpa_fast_path_equals_ref_outputs_and_gradients(t_q, extra, g, causal, masked, seed):
    t_k = t_q + extra
    q, k, v = _qkv(2, 4, g, t_q, t_k, 8, seed)
    mask = None
    if masked:
        mask = torch.rand(2, 1, t_q, t_k, generator=torch.Generator().manual_seed(seed)) > 0.4
        mask[0, 0, 0] = False  # at least one empty row, and both values present
        mask[1, 0, -1, 0] = True
    fast, g_fast = _grads(lambda *a: scaled_dot_product_attention(*a, mask=mask, is_causal=causal), q, k, v)
    ref, g_ref = _grads(lambda *a: scaled_dot_product_attention_ref(*a, mask=mask, is_causal=causal), q, k, v)
    torch.testing.assert_close(fast, ref)
    for a, b in zip(g_fast, g_ref, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("path", [scaled_dot_product_attention, scaled_dot_product_attention_ref])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fully_masked_rows_give_zeros_and_finite_gradients(path, dtype):
    q, k, v = _qkv(2, 2, 2, 4, 5, 8, dtype=dtype)
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of sequence 0 sees nothing
    mask[1] = False  # sequence 1 sees nothing at all
    out, grads = _grads(lambda *a: path(*a, mask=mask), q, k, v)
    assert out[0, :, 1].abs().max() == 0 and out[1].abs().max() == 0
    assert out[0, :, 0].abs().max() > 0
    for gr in grads:
        assert torch.isfinite(gr).all()
    assert grads[0][0, :, 1].abs().max() == 0  # the empty row's query gets no gradient
    assert grads[1][1].abs().max() == 0 and grads[2][1].abs().max() == 0


def test_ref_returns_weights_that_sum_to_one_and_respect_the_mask():
    q, k, v = _qkv(1, 2, 2, 5, 5, 4)
    out, w = scaled_dot_product_attention_ref(q, k, v, is_causal=True, return_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 5, dtype=w.dtype))
    assert (w[..., ~causal_mask(5)] == 0).all()
    torch.testing.assert_close(out, w @ v)


def test_causal_with_fewer_queries_aligns_to_the_end_of_the_keys():
    q, k, v = _qkv(1, 2, 2, 2, 5, 4)
    fast = scaled_dot_product_attention(q, k, v, is_causal=True)
    # the last query sees every key, the one before all but the last
    torch.testing.assert_close(fast[..., 1:, :], scaled_dot_product_attention(q[..., 1:, :], k, v))
    torch.testing.assert_close(
        fast[..., :1, :], scaled_dot_product_attention(q[..., :1, :], k[..., :4, :], v[..., :4, :])
    )


def test_gqa_equals_mha_with_repeated_kv_heads():
    q, k, v = _qkv(2, 6, 2, 5, 5, 8)
    gqa = scaled_dot_product_attention(q, k, v, is_causal=True)
    rep = scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True
    )
    torch.testing.assert_close(gqa, rep)
    # and at module level: a GQA layer equals an MHA layer whose k/v weights repeat the groups
    torch.manual_seed(0)
    m = MultiheadAttention(24, 6, n_kv_heads=2).double()
    full = MultiheadAttention(24, 6).double()
    wq, wk, wv = m.in_proj_weight.split([24, 8, 8])
    bq, bk, bv = m.in_proj_bias.split([24, 8, 8])

    def rep_rows(w):
        return w.view(2, 4, *w.shape[1:]).repeat_interleave(3, 0).reshape(24, *w.shape[1:])

    with torch.no_grad():
        full.in_proj_weight.copy_(torch.cat([wq, rep_rows(wk), rep_rows(wv)]))
        full.in_proj_bias.copy_(torch.cat([bq, rep_rows(bk), rep_rows(bv)]))
        full.out_proj.load_state_dict(m.out_proj.state_dict())
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    torch.testing.assert_close(m(x)[0], full(x)[0])


def _mixer(kind, **kw):
    torch.manual_seed(0)
    if kind == "linear":
        return LinearAttention(16, 2, chunk_size=3, **kw).double().eval()
    return SelfAttention(16, 4, n_kv_heads=2, causal=True, rope=RotaryEmbedding(4), **kw).double().eval()


@pytest.mark.parametrize("kind,window", [("softmax", None), ("softmax", 3), ("softmax", 1), ("linear", None)])
def test_step_equals_forward_and_chunked_equals_whole(kind, window):
    m = _mixer(kind, **({} if kind == "linear" else {"window": window}))
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    full, s_full = m(x)
    state, ys = m.init_state(2), []
    for t in range(10):
        y, state = m.step(x[:, t], state)
        ys.append(y)
    torch.testing.assert_close(torch.stack(ys, 1), full, **TOL)
    for a, b in zip(state, s_full, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    for cut in (1, 4, 9):
        a, s = m(x[:, :cut])
        b, s = m(x[:, cut:], state=s)
        torch.testing.assert_close(torch.cat([a, b], 1), full, **TOL)


@torch.no_grad()
def test_buffered_kv_cache_grows_in_place_and_branches_copy_on_write():
    m = _mixer("softmax")
    x = torch.randn(2, 80, 16, dtype=torch.float64)  # 80 > the first buffer's 64 slots: it must grow once
    full, _ = m(x)
    state, ys, buffers = m.init_state(2), [], set()
    for t in range(80):
        y, state = m.step(x[:, t], state)
        ys.append(y)
        buffers.add(id(state.buffer))
    torch.testing.assert_close(torch.stack(ys, 1), full, **TOL)
    assert state.buffer is not None and len(buffers) == 2  # allocated once, doubled once
    # two continuations of one prefix: the second must neither see nor overwrite the first one's keys
    _, prefix = m(x[:, :5])
    _, prefix = m(x[:, 5:6], state=prefix)  # now a buffered state
    a, s_a = m(x[:, 6:9], state=prefix)
    other = torch.randn(2, 3, 16, dtype=torch.float64)
    b, s_b = m(other, state=prefix)
    assert s_b.buffer is not s_a.buffer
    torch.testing.assert_close(a, full[:, 6:9], **TOL)
    torch.testing.assert_close(b, m(torch.cat([x[:, :6], other], 1))[0][:, 6:], **TOL)
    c, _ = m(x[:, 9:12], state=s_a)  # the first continuation is intact and can go on
    torch.testing.assert_close(c, full[:, 9:12], **TOL)


def test_kv_cache_with_gradients_concatenates():
    m = _mixer("softmax")
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    _, s = m(x[:, :3])
    y, s = m(x[:, 3:], state=s)
    assert s.buffer is None and s.k.requires_grad
    y.sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in m.parameters())


@pytest.mark.parametrize("kind", ["softmax", "softmax-window", "linear"])
def test_causal_output_never_depends_on_the_future(kind):
    m = _mixer("linear") if kind == "linear" else _mixer("softmax", window=2 if "window" in kind else None)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 5:] += torch.randn_like(x2[:, 5:])
    y, y2 = m(x)[0], m(x2)[0]
    torch.testing.assert_close(y[:, :5], y2[:, :5])
    assert (y[:, 5:] - y2[:, 5:]).abs().max() > 1e-3


def test_sliding_window_equals_an_explicit_banded_mask():
    torch.manual_seed(0)
    local = MultiheadAttention(16, 4, causal=True, window=3).double()
    dense = MultiheadAttention(16, 4).double()
    dense.load_state_dict(local.state_dict())
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    band = torch.ones(8, 8).tril().triu(-2).bool()  # i - 2 <= j <= i
    torch.testing.assert_close(local(x)[0], dense(x, mask=band)[0])
    torch.testing.assert_close(sliding_window_mask(8, window=3), band)


def test_permutation_equivariance_without_positions():
    torch.manual_seed(0)
    m = MultiheadAttention(16, 4).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    perm = torch.randperm(7)
    torch.testing.assert_close(m(x[:, perm])[0], m(x)[0][:, perm])


def test_padding_mask_makes_padded_keys_irrelevant_and_cross_attention_works():
    torch.manual_seed(0)
    m = MultiheadAttention(16, 4).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mem = torch.randn(2, 6, 16, dtype=torch.float64)
    mem2 = mem.clone()
    mem2[1, 4:] = 100.0  # garbage in the padding of sequence 1
    pad = key_padding_mask([6, 4])  # (b, 1, 1, t_k)
    y, cache = m(x, mem, mask=pad)
    torch.testing.assert_close(y, m(x, mem2, mask=pad)[0])
    torch.testing.assert_close(y[1], m(x[1:], mem[1:, :4])[0][0])
    # the cross-attention cache holds the projected memory and gives the same numbers
    torch.testing.assert_close(m(x, mem, mask=pad, state=cache)[0], y)


def test_need_weights_and_dropout():
    torch.manual_seed(0)
    m = MultiheadAttention(16, 4, causal=True, dropout=0.5).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    m.eval()
    y, _, w = m(x, need_weights=True)
    assert w.shape == (2, 4, 6, 6) and (w[..., ~causal_mask(6)] == 0).all()
    m.train()
    torch.manual_seed(1)
    y_train = m(x)[0]
    assert not torch.allclose(y_train, y)
    m.eval()
    torch.testing.assert_close(m(x)[0], y)


def test_attention_errors_say_what_to_do():
    m = MultiheadAttention(16, 4)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        MultiheadAttention(16, 4, n_kv_heads=3)
    with pytest.raises(TypeError, match="from_torch_mask"):
        m(torch.randn(1, 3, 16), mask=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        m(torch.randn(1, 3, 16), mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="query of shape"):
        m(torch.randn(1, 3, 8))


@settings(max_examples=15, deadline=None)
@given(t=st.integers(1, 20), chunk=st.integers(1, 8), seed=st.integers(0, 100))
def test_linear_attention_chunked_equals_recurrent(t, chunk, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(2, 2, t, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 2, t, 3, generator=gen, dtype=torch.float64)
    s0 = (
        torch.rand(2, 2, 4, 3, generator=gen, dtype=torch.float64),
        torch.rand(2, 2, 4, generator=gen, dtype=torch.float64),
    )
    y, (S, z) = linear_attention_causal(q, k, v, s0, chunk_size=chunk)
    y_ref, (S_ref, z_ref) = linear_attention_recurrent_ref(q, k, v, s0)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(S, S_ref)
    torch.testing.assert_close(z, z_ref)


def test_linear_attention_forms_and_padding():
    m = _mixer("linear")
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(m(x)[0], m.forward_ref(x)[0])
    nc = LinearAttention(16, 2, causal=False).double()
    # non-causal: every position sees the whole sequence, so the last position equals the causal one
    causal = LinearAttention(16, 2, causal=True).double()
    causal.load_state_dict(nc.state_dict())
    torch.testing.assert_close(nc(x)[0][:, -1], causal(x)[0][:, -1])
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    torch.testing.assert_close(nc(x, mask=mask)[0][1, :6], nc(x[1:, :6])[0][0])
    # the non-causal reference writes the (t, t) weights out; with a carried state both agree too
    s0 = nc(torch.randn(2, 3, 16, dtype=torch.float64))[1]
    (y, (S, z)), (y_ref, (S_ref, z_ref)) = nc(x, s0, mask), nc.forward_ref(x, s0, mask)
    for got, want in ((y, y_ref), (S, S_ref), (z, z_ref)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def _refuse(*args, **kwargs):
    raise AssertionError("this path must not run")


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_fast_path_flag_and_forward_ref(kind, monkeypatch):
    """forward_ref is the written-out path whatever fast_path says; fast_path=False makes forward take it."""
    m = _mixer(kind)
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True)
    mask = torch.arange(7)[None, :] < torch.tensor([7, 4])[:, None]
    assert m.why_not_fast_path(x) is None
    (y, _), (y_ref, _) = m(x, mask=mask), m.forward_ref(x, mask=mask)
    g, g_ref = (torch.autograd.grad(out.square().sum(), x)[0] for out in (y, y_ref))
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-10)
    fast = ["seqlab.layers.attention.scaled_dot_product_attention"]
    if kind == "linear":  # the CPU kernel (seqlab.kernels.linear_attention), else the chunked form
        fast = [
            f"seqlab.layers.linear_attention.{f}"
            for f in ("linear_attention_recurrent", "linear_attention_causal")
        ]
    for f in fast:
        monkeypatch.setattr(f, _refuse)
    with pytest.raises(AssertionError, match="must not run"):
        m(x)
    m.fast_path = False
    assert "fast_path=False" in m.why_not_fast_path(x) and "fast_path=False" in repr(m)
    torch.testing.assert_close(m(x, mask=mask)[0], y_ref, atol=0, rtol=0)


def test_self_attention_padding_mask_and_attention_mask():
    """SelfAttention's mask is the token mixer's (b, t) padding mask; attn_mask is MultiheadAttention's."""
    torch.manual_seed(0)
    sa = SelfAttention(16, 4, causal=False).double().eval()
    mha = MultiheadAttention(16, 4, causal=False).double().eval()
    mha.load_state_dict(sa.state_dict())
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    pad = torch.arange(6)[None, :] < torch.tensor([6, 4])[:, None]  # (b, t)
    y, _ = sa(x, mask=pad)
    torch.testing.assert_close(y[1, :4], sa(x[1:, :4])[0][0])  # not causal, yet padded keys are unseen
    torch.testing.assert_close(y, mha(x.masked_fill(~pad[..., None], 0.0), mask=key_padding_mask(pad))[0])
    band = sliding_window_mask(6, window=2, causal=False)
    torch.testing.assert_close(sa(x, attn_mask=band)[0], mha(x, mask=band)[0])
    both = sa(x, mask=pad, attn_mask=band)[0]
    torch.testing.assert_close(both[1, :4], sa(x[1:, :4], attn_mask=band[:4, :4])[0][0])
    with pytest.raises(ValueError, match=r"\(b, t\) = \(2, 6\)"):
        sa(x, mask=key_padding_mask(pad))  # a (b, 1, 1, t) attention mask goes to attn_mask


@pytest.mark.parametrize("cls", ["additive", "dot", "general"])
def test_rnn_attention_weights_context_and_mask(cls):
    torch.manual_seed(0)
    if cls == "additive":
        attn = AdditiveAttention(6, 8, 10).double()
    else:
        attn = LuongAttention(8, 8, score=cls).double()
    d_q = 6 if cls == "additive" else 8
    query, keys = torch.randn(3, d_q, dtype=torch.float64), torch.randn(3, 5, 8, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    ctx, w = attn(query, keys, mask=mask)
    assert ctx.shape == (3, 8) and w.shape == (3, 5)
    torch.testing.assert_close(w.sum(-1), torch.tensor([1.0, 1.0, 0.0], dtype=w.dtype))
    assert (w[~mask] == 0).all()
    torch.testing.assert_close(ctx, (w.unsqueeze(-1) * keys).sum(1))
    ctx1, _ = attn(query[1:2], keys[1:2, :3])
    torch.testing.assert_close(ctx[1:2], ctx1)
    query.requires_grad_(True)
    attn(query, keys, mask=mask)[0].sum().backward()
    assert torch.isfinite(query.grad).all()
    if cls == "dot":
        torch.testing.assert_close(w[0], (keys[0] @ query[0].detach()).softmax(-1))
