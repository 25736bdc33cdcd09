"""seqlab.kernels.attention (attention.cpp) against torch's scaled_dot_product_attention and seqlab's written-out
reference, and the dispatch in seqlab.layers.sdpa that sends short sequences to it."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from seqlab.kernels import attention as kernel
from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.positional import RotaryEmbedding
from seqlab.layers.sdpa import scaled_dot_product_attention, scaled_dot_product_attention_ref

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


def packed(b, t, h, d, dtype, seed=0):
    """q, k, v (b, h, t, d) as strided views of one (b, t, 3 h d) projection, as the attention layers make them,
    and that projection (the leaf the gradients reach)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, 3 * h * d, generator=g, dtype=dtype).requires_grad_()
    q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in qkv.split(h * d, dim=-1))
    return qkv, q, k, v


def grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, inputs, g)


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("b", "t", "h", "d"),
    [
        (2, 50, 3, 16),
        (1, 1, 2, 16),
        (3, 24, 1, 32),
        (2, 65, 2, 64),
        (1, 97, 2, 48),
    ],  # t around the block of 24
)
def test_matches_reference_in_float64(b, t, h, d, causal):
    d = d // 2  # the same vector widths in doubles
    qkv, q, k, v = packed(b, t, h, d, torch.float64)
    out = kernel.attention(q, k, v, causal)
    ref = scaled_dot_product_attention_ref(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads(out, qkv)[0], grads(ref, qkv)[0], rtol=1e-11, atol=1e-12)


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("b", "t", "h", "d"), [(2, 30, 3, 1), (2, 41, 2, 12), (1, 33, 2, 23), (1, 26, 1, 100)]
)
def test_head_dims_off_the_vector_width(b, t, h, d, causal):
    """A head dim that is not a multiple of the vector width runs zero-padded inside the kernel: the same numbers,
    and the packed path's gradient too."""
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
        qkv, q, k, v = packed(b, t, h, d, dtype)
        out = kernel.attention(q, k, v, causal)
        ref = scaled_dot_product_attention_ref(q, k, v, is_causal=causal)
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        torch.testing.assert_close(grads(out, qkv)[0], grads(ref, qkv)[0], rtol=10 * tol, atol=10 * tol)
        flat = kernel.attention_packed(qkv, h, causal)
        torch.testing.assert_close(flat, ref.transpose(1, 2).flatten(2), rtol=tol, atol=tol)


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("b", "t", "h", "d"), [(4, 50, 4, 32), (2, 256, 2, 64), (1, 37, 3, 16)])
def test_matches_torch_in_float32(b, t, h, d, causal):
    qkv, q, k, v = packed(b, t, h, d, torch.float32)
    out = kernel.attention(q, k, v, causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(grads(out, qkv)[0], grads(ref, qkv)[0], rtol=1e-4, atol=2e-5)


@needs_compiler
def test_cross_attention_lengths_and_scale():
    """t_q != t_k, separate k and v tensors, a scale of the caller's."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 70, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 70, 8, generator=g, dtype=torch.float64, requires_grad=True)
    out = kernel.attention(q, k, v, scale=0.3)
    ref = scaled_dot_product_attention_ref(q, k, v, scale=0.3)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, r in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_and_double_backward(causal):
    g = torch.Generator().manual_seed(4)
    q, k, v = (
        torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)
    )
    fn = lambda q, k, v: kernel.attention(q, k, v, causal)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))
    assert torch.autograd.gradgradcheck(fn, (q, k, v))


@needs_compiler
def test_large_scores_stay_finite():
    """The softmax subtracts each row's maximum: scores of several thousand neither overflow nor give NaN."""
    _, q, k, v = packed(2, 40, 2, 16, torch.float32)
    q, k = q * 30, k * 30
    out = kernel.attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@needs_compiler
def test_output_layout_and_no_grad_path():
    """The output is (b, h, t, d) over (b, t, h, d) memory (merging heads is a view); without autograd the
    kernel is called directly, with the same numbers."""
    _, q, k, v = packed(2, 33, 3, 16, torch.float32)
    out = kernel.attention(q, k, v)
    assert out.shape == (2, 3, 33, 16) and out.transpose(1, 2).is_contiguous()
    with torch.no_grad():
        again = kernel.attention(q, k, v)
    assert not again.requires_grad
    assert torch.equal(out.detach(), again)


@needs_compiler
def test_same_result_on_any_thread_count(torch_threads):
    qkv, q, k, v = packed(3, 70, 4, 32, torch.float32)
    results = []
    for threads in (1, 2):
        torch_threads(threads)
        out = kernel.attention(q, k, v, True)
        results.append((out.detach(), grads(out, qkv)[0]))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_why_not_kernel_names_each_case():
    q = torch.randn(2, 4, 40, 32)
    kv = torch.randn(2, 4, 40, 32)
    why = kernel.why_not_kernel
    assert "mask" in why(q, kv, kv, torch.ones(40, 40, dtype=torch.bool), 0.0, False)
    assert why(q, kv, kv, None, 0.1, False) is None  # attention dropout runs in the kernel
    assert "dropout_p" in why(q, kv, kv, None, 1.0, False)
    assert "heads" in why(q, kv[:, :2], kv[:, :2], None, 0.0, False)
    assert "head dim" in why(q[..., :24], kv[..., :24], kv[..., :24], None, 0.0, False)
    assert why(q[:, :, :, :24], kv[..., :24], kv[..., :24], None, 0.0, True) is None  # causal: padded inside
    wide = torch.randn(1, 1, 40, kernel.MAX_HEAD_DIM + 16)
    assert "head dims up to" in why(wide, wide, wide, None, 0.0, True)
    assert "queries" in why(q[:, :, :1], kv, kv, None, 0.0, False)  # a decoding step
    short = torch.randn(128, 4, 17, 32)  # a batch of short sequences (ViT, 17 tokens): 8,704 query rows
    assert why(short, short, short, None, 0.0, False) is None
    assert "query rows" in why(short[:8], short[:8], short[:8], None, 0.0, False)  # 544 rows: torch
    assert "t_q == t_k" in why(q[:, :, :35], kv, kv, None, 0.0, True)
    assert "float32 or float64" in why(q.half(), kv.half(), kv.half(), None, 0.0, False)
    long = torch.randn(1, 1, kernel.max_keys(False, 64) + 1, 64)
    assert "keys" in why(long, long, long, None, 0.0, False)
    assert why(long, long, long, None, 0.0, True) is None  # causal rows hold out longer


@needs_compiler
@pytest.mark.parametrize("amd", [True, False])
def test_the_key_limits_follow_the_machine(monkeypatch, amd):
    """Past these many keys torch's kernel was measured faster: on an AMD CPU with AVX-512 (torch's products
    slower there) the kernel holds out twice as long at head dim 64, and to 8,192 keys at head dims up to 32;
    elsewhere the limits measured on an Intel Xeon hold at every head dim."""
    monkeypatch.setattr(kernel, "amd_with_avx512", lambda: amd)
    limits = {(c, d): kernel.max_keys(c, d) for c in (True, False) for d in (12, 32, 33, 64)}
    if amd:
        assert limits == {(True, 12): 8192, (False, 12): 8192, (True, 32): 8192, (False, 32): 8192,
                          (True, 33): 2048, (False, 33): 1024, (True, 64): 2048, (False, 64): 1024}  # fmt: skip
    else:
        assert (
            set(limits.values()) == {1024, 512} and limits[(True, 12)] == 1024 and limits[(False, 64)] == 512
        )
    cpu = torch.device("cpu")
    for (c, d), most in limits.items():
        if not c and d % 16:
            continue  # bidirectional head dims off a multiple of 16 go to torch at any length
        assert kernel.why_not_shapes(torch.float32, cpu, 4, 4, most, most, d, c) is None
        past = kernel.why_not_shapes(torch.float32, cpu, 4, 4, most + 1, most + 1, d, c)
        assert f"past {most} keys" in past


@needs_compiler
def test_sdpa_and_the_attention_layer_take_the_kernel():
    """seqlab's SDPA sends an eligible call to the kernel (its output has the kernel's layout) and a masked one
    to torch; MultiheadAttention's outputs and gradients equal its written-out reference path."""
    _, q, k, v = packed(2, 40, 2, 16, torch.float32)
    assert kernel.why_not_kernel(q, k, v, None, 0.0, False) is None
    fast = scaled_dot_product_attention(q, k, v)
    assert type(fast.grad_fn).__name__ == "_AttentionBackward"  # the kernel's autograd node, not torch's
    torch.testing.assert_close(fast, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=2e-6)
    mask = torch.rand(40, 40, generator=torch.Generator().manual_seed(0)) > 0.3
    masked = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(masked, scaled_dot_product_attention_ref(q, k, v, mask), rtol=1e-5, atol=2e-6)

    torch.manual_seed(0)
    mha = MultiheadAttention(64, n_heads=4, causal=True).double()
    x = torch.randn(3, 48, 64, dtype=torch.float64, requires_grad=True)
    y, _ = mha(x)
    y_ref, _ = mha.forward_ref(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads(y, x)[0], grads(y_ref, x)[0], rtol=1e-11, atol=1e-12)


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
def test_packed_path_matches_the_general_one(causal):
    """Self-attention from the packed projection (the layer's path when nothing else is asked) gives the
    general path's outputs, cache and every gradient; its gradient reaches the projection in one piece."""
    torch.manual_seed(0)
    mha = MultiheadAttention(64, n_heads=4, causal=causal).double()
    assert mha._why_not_packed(torch.zeros(1, 40, 64, dtype=torch.float64)) is None
    x = torch.randn(3, 40, 64, dtype=torch.float64, requires_grad=True)
    y, cache = mha(x)
    y_ref, cache_ref = mha.forward_ref(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(cache.k, cache_ref.k) and torch.equal(cache.v, cache_ref.v) and cache.pos == 40
    params = [x, *mha.parameters()]
    for a, r in zip(grads(y, params), grads(y_ref, params), strict=True):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)
    qkv = torch.randn(2, 40, 3 * 64, dtype=torch.float64, requires_grad=True)
    out = kernel.attention_packed(qkv, 4, causal)
    with torch.no_grad():
        assert torch.equal(kernel.attention_packed(qkv, 4, causal), out.detach())


@needs_compiler
def test_packed_gradcheck():
    qkv = torch.randn(1, 7, 3 * 2 * 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: kernel.attention_packed(t, 2, True), (qkv,))
    assert torch.autograd.gradgradcheck(lambda t: kernel.attention_packed(t, 2, True), (qkv,))


def test_the_layer_keeps_its_general_path_where_the_kernel_does_not_apply():
    x = torch.zeros(1, 40, 64)
    assert "RoPE" in MultiheadAttention(64, 4, rope=RotaryEmbedding(16))._why_not_packed(x)
    assert MultiheadAttention(64, 4, dropout=0.1).train()._why_not_packed(x) is None  # dropout in the kernel
    assert "heads" in MultiheadAttention(64, 4, n_kv_heads=2)._why_not_packed(x)
    assert "queries" in MultiheadAttention(64, 4)._why_not_packed(x[:, :3])


@needs_compiler
@pytest.mark.parametrize("scale", [-0.7, 0.0, 3.0])
def test_any_scale(scale):
    """The row maximum is taken of the scaled scores, so a negative (or zero) scale gives the softmax it names."""
    _, q, k, v = packed(2, 35, 2, 16, torch.float32)
    q, k = 6 * q, 6 * k  # scores in the hundreds: shifting by the wrong extreme would overflow float32's exp
    out = kernel.attention(q, k, v, True, scale=scale)
    ref = scaled_dot_product_attention_ref(q.double(), k.double(), v.double(), is_causal=True, scale=scale)
    torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-4)


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask(causal):
    """A key padding mask (b, 1, 1, t_k) runs in the kernel: the written-out reference's outputs and gradients,
    and a batch row whose every key is masked gives zeros and zero gradients (seqlab's law for empty rows)."""
    qkv, q, k, v = packed(3, 37, 2, 8, torch.float64)
    lengths = torch.tensor([37, 20, 0])
    mask = (torch.arange(37)[None, :] < lengths[:, None])[:, None, None, :]  # (b, 1, 1, t_k)
    assert kernel.why_not_kernel(q, k, v, mask, 0.0, causal) is None
    out = scaled_dot_product_attention(q, k, v, mask, is_causal=causal)
    ref = scaled_dot_product_attention_ref(q, k, v, mask, is_causal=causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    got, want = grads(out, qkv)[0], grads(ref, qkv)[0]
    torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)
    small = [x[:, :, :9].detach().requires_grad_() for x in (q, k, v)]
    fn = lambda q, k, v: kernel.attention(q, k, v, causal, keep=mask[:, 0, 0, :9])  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, small)


def test_key_mask_recognizes_padding_masks_only():
    b, t = 3, 5
    keys = torch.rand(b, t) > 0.3
    assert torch.equal(kernel.key_mask(keys[:, None, None, :], b, t), keys)
    assert torch.equal(kernel.key_mask(keys[0], b, t), keys[0].expand(b, t))  # (t_k,) broadcasts over batch
    assert kernel.key_mask(torch.ones(b, 1, t, t, dtype=torch.bool), b, t) is None  # per query
    assert kernel.key_mask(torch.ones(b, 2, 1, t, dtype=torch.bool), b, t) is None  # per head
    assert kernel.key_mask(torch.ones(b, 1, 1, t), b, t) is None  # not boolean


@needs_compiler
def test_padded_self_attention_goes_through_the_kernel():
    """The LM mixer with a padding mask: its key mask and causal structure reach the kernel (not a combined
    (b, 1, t, t) mask), with the reference path's outputs at the real positions."""
    from seqlab.layers.attention import SelfAttention

    torch.manual_seed(0)
    attn = SelfAttention(64, n_heads=4, causal=True).double()
    x = torch.randn(2, 40, 64, dtype=torch.float64)
    pad = torch.tensor([[True] * 40, [True] * 25 + [False] * 15])
    seen = []
    real = kernel.attention
    kernel.attention = lambda *a, **kw: (
        seen.append(kw.get("keep", a[5] if len(a) > 5 else None)) or real(*a, **kw)
    )
    try:
        y, _ = attn(x, mask=pad)
    finally:
        kernel.attention = real
    assert len(seen) == 1 and seen[0] is not None and torch.equal(seen[0], pad)
    y_ref, _ = attn.forward_ref(x, mask=pad)
    torch.testing.assert_close(y[pad], y_ref[pad], rtol=1e-12, atol=1e-12)


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_matches_the_written_out_form_with_the_same_mask(causal):
    """Attention dropout in the kernel: the mask it draws (dropout_mask, regenerated by the backward from the
    seed) applied to the written-out softmax gives its outputs and gradients; about p of P is dropped; the same
    seed from torch.manual_seed repeats the mask; the packed path agrees."""
    p = 0.3
    qkv, q, k, v = packed(2, 45, 3, 8, torch.float64)
    torch.manual_seed(7)
    out = kernel.attention(q, k, v, causal, dropout_p=p)
    torch.manual_seed(7)
    seed = kernel._seed(p)
    drop = kernel.dropout_mask(q, k, p, seed)
    kept = (drop > 0).double().mean().item()
    assert abs(kept - (1 - p)) < 0.03 and set(drop.unique().tolist()) == {0.0, 1 / (1 - p)}
    ref = kernel._written_out(q, k, v, causal, q.size(-1) ** -0.5, None, drop)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads(out, qkv)[0], grads(ref, qkv)[0], rtol=1e-11, atol=1e-12)
    torch.manual_seed(7)
    flat = kernel.attention_packed(qkv, 3, causal, dropout_p=p)
    torch.testing.assert_close(flat, ref.transpose(1, 2).flatten(2), rtol=1e-12, atol=1e-12)
    torch.manual_seed(8)
    assert not torch.equal(kernel.attention(q, k, v, causal, dropout_p=p), out)  # another seed, another mask


@needs_compiler
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("b", "t", "h", "d"), [(2, 50, 4, 32), (1, 37, 3, 12), (2, 64, 2, 48)])
def test_bfloat16_is_the_float32_kernel_on_the_same_values(b, t, h, d, causal):
    """bfloat16 (CPU autocast's dtype), packed and through `attention` with a key mask and dropout: each output
    is the float32 kernel's on the same values rounded once (exactly), the gradients (in bf16, the packed one in
    the projection's layout) within bf16's rounding of the float32 kernel's."""
    qkv, q, k, v = packed(b, t, h, d, torch.bfloat16)
    wide, qw, kw, vw = packed(b, t, h, d, torch.bfloat16)
    wide = wide.detach().float().requires_grad_()
    qw, kw, vw = (x.view(b, t, h, d).transpose(1, 2) for x in wide.split(h * d, dim=-1))
    keep = torch.ones(b, t, dtype=torch.bool)
    keep[0, -5:] = False
    for run in ("packed", "masked with dropout"):
        torch.manual_seed(3)
        if run == "packed":
            out, ref = kernel.attention_packed(qkv, h, causal), kernel.attention_packed(wide, h, causal)
        else:
            out = kernel.attention(q, k, v, causal, keep=keep, dropout_p=0.2)
            torch.manual_seed(3)
            ref = kernel.attention(qw, kw, vw, causal, keep=keep, dropout_p=0.2)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, ref.to(torch.bfloat16), rtol=0, atol=0)
        (g16,), (g32,) = grads(out.float(), qkv), grads(ref, wide)
        assert g16.dtype == torch.bfloat16
        assert (g16.float() - g32).abs().max().item() < 2**-7 * g32.abs().max().item()


@needs_compiler
def test_dropout_gradcheck_with_a_fixed_seed():
    """With the seed fixed (as autograd's backward sees it), the dropped attention is a smooth function:
    gradcheck and gradgradcheck through the kernel's own Function."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (
        torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)
    )
    fn = lambda q, k, v: kernel._Attention.apply(q, k, v, True, 0.35, None, 0.25, 12345)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))
    assert torch.autograd.gradgradcheck(fn, (q, k, v))


def test_seqlab_disable_kernels_switches_kernels_off(monkeypatch):
    """SEQLAB_DISABLE_KERNELS names kernels to leave out (or all): the code they stand in for runs, with the same
    numbers; an unknown name is an error that lists the known ones."""
    from seqlab.kernels import build, layer_norm

    _, q, k, v = packed(2, 40, 2, 16, torch.float32)
    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "attention,scan")
    assert "SEQLAB_DISABLE_KERNELS" in kernel.why_not_kernel(q, k, v, None, 0.0, False)
    assert "SEQLAB_DISABLE_KERNELS" in build.kernel_unavailable()
    assert kernel.EXTENSION.load() is None
    off = scaled_dot_product_attention(q, k, v)
    assert "Flash" in type(off.grad_fn).__name__  # torch's fused kernel ran
    torch.testing.assert_close(off, F.scaled_dot_product_attention(q, k, v), rtol=1e-6, atol=1e-6)
    assert build.disabled_reason("layer_norm") is None  # only the named ones
    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "all")
    assert "SEQLAB_DISABLE_KERNELS" in layer_norm.EXTENSION.unbuilt_reason()
    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "atention")
    with pytest.raises(ValueError, match="attention"):
        kernel.why_not_kernel(q, k, v, None, 0.0, False)
    monkeypatch.delenv("SEQLAB_DISABLE_KERNELS")
    if shutil.which("c++") is not None:
        assert kernel.why_not_kernel(q, k, v, None, 0.0, False) is None


@needs_compiler
def test_bad_input_is_named_at_the_boundary():
    """Wrong shapes and dtypes get an error that says what was expected and what came."""
    q = torch.randn(2, 2, 40, 16)
    with pytest.raises(RuntimeError, match=r"\(b, h, t, d\).*got shape \[2, 40, 16\]"):
        kernel.attention(q[0], q[0], q[0])
    with pytest.raises(RuntimeError, match="got Half"):
        kernel.attention(q, q.half(), q)
    with pytest.raises(RuntimeError, match=r"got q \[2, 2, 40, 16\], k \[2, 2, 40, 16\], v \[2, 2, 30, 16\]"):
        kernel.attention(q, q, q[:, :, :30])
    with pytest.raises(RuntimeError, match=r"\(b, t_k\) = \(2, 40\).*got Bool \[3, 40\]"):
        kernel.attention(q, q, q, keep=torch.ones(3, 40, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="got t_q 30, t_k 40"):
        kernel.attention(q[:, :, :30], q, q, True)
    with pytest.raises(ValueError, match=r"n_heads = 4.*got shape \(2, 40, 50\)"):
        kernel.attention_packed(torch.randn(2, 40, 50), 4)
    with pytest.raises(ValueError, match=r"got shape \(40, 48\)"):
        kernel.attention_packed(torch.randn(40, 48), 4)
