"""from_torch for attention: nn.MultiheadAttention and nn.Transformer{Encoder,Decoder}Layer parity, with masks."""

import pytest
import torch
from torch import nn

from seqlab.interop import from_torch
from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.masks import causal_mask, from_torch_mask
from seqlab.layers.transformer_blocks import TransformerDecoderLayer, TransformerEncoderLayer

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


def test_multihead_attention_rejects_what_it_cannot_represent():
    with pytest.raises(ValueError, match="kdim"):
        from_torch(nn.MultiheadAttention(D, H, kdim=8, vdim=8))
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
