"""from_torch for attention: nn.MultiheadAttention and nn.Transformer{Encoder,Decoder}Layer parity, with masks."""

import pytest
import torch
from torch import nn

from seqlab.interop import from_torch
from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.masks import causal_mask, from_torch_mask
from seqlab.layers.transformer_blocks import TransformerDecoderLayer, TransformerEncoderLayer
from seqlab.models.flops import matmul_params
from seqlab.models.init import normal_init_

B, T, S, D, H = 3, 6, 5, 16, 4


def _torch_masks(t_q, t_k, causal):
    """torch polarity: attn_mask True = not allowed; key_padding_mask True = padding (last keys of row 1)."""
    attn = ~causal_mask(t_q, t_k) if causal else None
    kpm = torch.zeros(B, t_k, dtype=torch.bool)
    kpm[1, t_k - 2 :] = True
    return attn, kpm


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_multihead_attention_parity_outputs_and_gradients(cross, causal, bias):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True)
    ours = from_torch(theirs)
    assert isinstance(ours, MultiheadAttention) and ours.training
    x = torch.randn(B, T, D, requires_grad=True)
    mem = torch.randn(B, S if cross else T, D, requires_grad=True) if cross else x
    attn, kpm = _torch_masks(T, mem.size(1), causal and not cross)
    ref, w_ref = theirs(x, mem, mem, attn_mask=attn, key_padding_mask=kpm, average_attn_weights=False)
    out, _, w = ours(x, mem if cross else None, mask=from_torch_mask(attn, kpm), need_weights=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w, w_ref)
    grad = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, [x, *theirs.parameters()], grad)
    g = torch.autograd.grad(out, [x, *ours.parameters()], grad)
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("kdim", "vdim"), [(8, 8), (8, 12), (D, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_multihead_attention_over_a_memory_of_other_widths(kdim, vdim, bias):
    """kdim/vdim (cross-attention to keys and values of other widths than the queries): torch.nn's separate
    q_proj_weight, k_proj_weight, v_proj_weight convert by name; outputs, weights and every gradient agree in
    float64, on both paths, with a key padding mask."""
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(
        D, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=True, dtype=torch.float64
    )
    ours = from_torch(theirs)
    assert (ours.kdim, ours.vdim, ours.in_proj_weight) == (kdim, vdim, None)
    assert {n for n, _ in ours.named_parameters()} == {n for n, _ in theirs.named_parameters()}
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, S, kdim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, S, vdim, dtype=torch.float64, requires_grad=True)
    _, kpm = _torch_masks(T, S, causal=False)
    ref, w_ref = theirs(x, k, v, key_padding_mask=kpm, average_attn_weights=False)
    grad = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, [x, k, v, *theirs.parameters()], grad)
    for call in (ours.forward, ours.forward_ref):
        out, cache, w = call(x, k, v, mask=from_torch_mask(None, kpm), need_weights=True)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
        torch.testing.assert_close(w, w_ref, atol=1e-12, rtol=0)
        g = torch.autograd.grad(out, [x, k, v, *ours.parameters()], grad)
        for a, b in zip(g, g_ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
        # the projected memory as a cache: the next queries attend to it without projecting it again
        again, _ = ours(x, k, v, mask=from_torch_mask(None, kpm), state=cache)
        torch.testing.assert_close(again, out)


def test_attention_over_other_widths_refuses_what_it_cannot_attend_by_name():
    ours = MultiheadAttention(D, H, kdim=8, vdim=12)
    x = torch.randn(B, T, D)
    with pytest.raises(ValueError, match=r"kdim=8, vdim=12 \(d_model=16\).*needs key and value"):
        ours(x)  # self-attention: its keys would be D wide
    with pytest.raises(ValueError, match="value defaults to key, but vdim=12 differs from kdim=8"):
        ours(x, torch.randn(B, S, 8))
    with pytest.raises(ValueError, match=r"key of shape \(b, t, 8\)"):
        ours(x, torch.randn(B, S, D), torch.randn(B, S, 12))
    with pytest.raises(ValueError, match=r"value of shape \(b, t, 12\)"):
        ours(x, torch.randn(B, S, 8), torch.randn(B, S, 8))
    with pytest.raises(ValueError, match="kdim"):
        MultiheadAttention(D, H, kdim=0)
    assert (
        "kdim=8, vdim=12" in repr(ours)
        and MultiheadAttention(D, H, kdim=D, vdim=D).in_proj_weight is not None
    )
    normal_init_(ours, std=0.5)  # the models' initialization and FLOP count see the three weights
    assert all(0.4 < w.std() < 0.6 for w in ours.projection_weights())
    assert matmul_params(ours) == D * D + D * 8 + D * 12 + D * D  # W_q, W_k, W_v, W_o


def test_multihead_attention_rejects_what_it_cannot_represent():
    with pytest.raises(ValueError, match="add_bias_kv"):
        from_torch(nn.MultiheadAttention(D, H, add_bias_kv=True))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_parity(norm_first, activation):
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(
        D, H, dim_feedforward=32, activation=activation, norm_first=norm_first, batch_first=True
    ).eval()
    ours = from_torch(theirs)
    assert isinstance(ours, TransformerEncoderLayer) and not ours.training
    x = torch.randn(B, T, D, requires_grad=True)
    attn, kpm = _torch_masks(T, T, causal=True)
    ref = theirs(x, src_mask=attn, src_key_padding_mask=kpm)
    out = ours(x, mask=from_torch_mask(attn, kpm))
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, [x, *theirs.parameters()], grad)
    g = torch.autograd.grad(out, [x, *ours.parameters()], grad)
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # torch's inference fast path (fused encoder kernel) gives the same numbers
        torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_parity_and_incremental_decoding(norm_first, activation):
    torch.manual_seed(0)
    theirs = nn.TransformerDecoderLayer(
        D, H, dim_feedforward=32, activation=activation, norm_first=norm_first, batch_first=True
    ).eval()
    ours = from_torch(theirs)
    assert isinstance(ours, TransformerDecoderLayer)
    x, mem = torch.randn(B, T, D, requires_grad=True), torch.randn(B, S, D, requires_grad=True)
    tgt_mask = ~causal_mask(T)
    mem_kpm = torch.zeros(B, S, dtype=torch.bool)
    mem_kpm[2, 3:] = True
    ref = theirs(x, mem, tgt_mask=tgt_mask, memory_key_padding_mask=mem_kpm)
    memory_mask = from_torch_mask(None, mem_kpm)
    out, _ = ours(x, mem, mask=from_torch_mask(tgt_mask), memory_mask=memory_mask)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, [x, mem, *theirs.parameters()], grad)
    g = torch.autograd.grad(out, [x, mem, *ours.parameters()], grad)
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b)
    # causal self-attention plus a carried state: token by token equals the whole sequence
    ours.self_attn.causal = True
    with torch.no_grad():
        whole, _ = ours(x, mem, memory_mask=memory_mask)
        torch.testing.assert_close(whole, ref)
        state, ys = ours.init_state(B), []
        for t in range(T):
            y, state = ours(x[:, t : t + 1], mem, memory_mask=memory_mask, state=state)
            ys.append(y)
        torch.testing.assert_close(torch.cat(ys, 1), ref)
