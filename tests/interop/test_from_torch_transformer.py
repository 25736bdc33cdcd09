"""nn.Transformer -> seqlab Transformer: the same outputs and gradients, with causal and padding masks."""

import pytest
import torch
from torch import nn

from seqlab.interop import from_torch
from seqlab.layers.masks import from_torch_mask
from seqlab.layers.transformer_blocks import Transformer


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # torch's own note about norm_first
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_matches_torch(norm_first, activation):
    torch.manual_seed(0)
    ref = nn.Transformer(
        d_model=32,
        nhead=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=64,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=norm_first,
    ).double()
    ours = from_torch(ref)
    assert isinstance(ours, Transformer)
    src = torch.randn(3, 7, 32, dtype=torch.double, requires_grad=True)
    tgt = torch.randn(3, 5, 32, dtype=torch.double, requires_grad=True)
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.bool)  # True = NOT allowed
    src_pad = torch.zeros(3, 7, dtype=torch.bool)
    src_pad[1, 4:] = True  # torch: True at padding
    y_ref = ref(
        src,
        tgt,
        tgt_mask=causal,
        src_key_padding_mask=src_pad,
        memory_key_padding_mask=src_pad,
        tgt_is_causal=True,
    )
    y = ours(
        src,
        tgt,
        src_mask=from_torch_mask(None, src_pad),
        tgt_mask=from_torch_mask(causal, None),
        memory_mask=from_torch_mask(None, src_pad),
    )
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    g = torch.randn_like(y)
    grads_ref = torch.autograd.grad(y_ref, [src, tgt, *ref.parameters()], g)
    grads = torch.autograd.grad(y, [src, tgt, *ours.parameters()], g)
    assert len(grads) == len(grads_ref)
    for a, b in zip(grads[:2], grads_ref[:2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    ref_by_name = dict(zip([n for n, _ in ref.named_parameters()], grads_ref[2:], strict=True))
    ours_by_name = dict(zip([n for n, _ in ours.named_parameters()], grads[2:], strict=True))
    assert len(ours_by_name) == len(ref_by_name)
    torch.testing.assert_close(ours_by_name["encoder_norm.weight"], ref_by_name["encoder.norm.weight"])
    torch.testing.assert_close(
        ours_by_name["decoder_layers.1.cross_attn.in_proj_weight"],
        ref_by_name["decoder.layers.1.multihead_attn.in_proj_weight"],
    )
    torch.testing.assert_close(
        ours_by_name["decoder_layers.0.mlp.fc1.weight"], ref_by_name["decoder.layers.0.linear1.weight"]
    )


def test_causal_flag_replaces_the_explicit_mask():
    torch.manual_seed(0)
    ref = nn.Transformer(
        d_model=16,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=32,
        dropout=0.0,
        batch_first=True,
    )
    ours = from_torch(ref)
    for layer in ours.decoder_layers:
        layer.self_attn.causal = True
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.bool)
    torch.testing.assert_close(
        ours(src, tgt), ref(src, tgt, tgt_mask=causal, tgt_is_causal=True), atol=1e-5, rtol=1e-5
    )
