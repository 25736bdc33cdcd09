"""Public layer and model calls given wrong input: each one a clear error naming what was expected and what
came, where it was a silent wrong result or an error from inside torch."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from seqlab.interop import from_torch
from seqlab.layers.masks import causal_mask, padding_mask
from seqlab.layers.patch import interpolate_grid_positions
from seqlab.layers.positional import RotaryEmbedding, sinusoidal_table
from seqlab.layers.rnn_attention import AdditiveAttention, LuongAttention
from seqlab.layers.sdpa import scaled_dot_product_attention, scaled_dot_product_attention_ref
from seqlab.models import create
from seqlab.models.encoder import real_tokens


@pytest.mark.parametrize("name", ["test-lm-attention", "test-gpt"])
def test_continuing_the_cache_of_a_padded_batch_is_refused(name):
    """It continued row 0 from its padded keys, at the padded positions (logits off by up to 0.24)."""
    torch.manual_seed(0)
    model = create(name).eval()
    ids = torch.randint(0, 50, (2, 6))
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    with torch.no_grad():
        _, state = model(ids, mask=mask, return_state=True)
        with pytest.raises(ValueError, match="KV cache of a right-padded batch"):
            model.step(torch.tensor([7, 7]), state)
        with pytest.raises(ValueError, match="KV cache of a right-padded batch"):
            model(ids[:, :1], state=state)
        _, full = model(ids, mask=torch.ones(2, 6, dtype=torch.bool), return_state=True)  # no padding
        model.step(torch.tensor([7, 7]), full)


def test_a_recurrent_lm_still_continues_a_padded_batch_from_each_rows_state():
    torch.manual_seed(0)
    model = create("test-lm-lstm").eval()
    ids = torch.randint(0, 50, (2, 6))
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    with torch.no_grad():
        _, state = model(ids, mask=mask, return_state=True)
        batched, _ = model.step(torch.tensor([7, 7]), state)
        _, alone = model(ids[:1, :4], return_state=True)
        torch.testing.assert_close(batched[:1], model.step(torch.tensor([7]), alone)[0])


def test_an_encoder_mask_must_be_ones_and_zeros_not_additive():
    """HF's additive mask (0 / -10000) went through .bool() and was inverted; mean pooling gave 1e13."""
    torch.manual_seed(0)
    model = create("test-bert").eval()
    ids = torch.randint(0, 20, (2, 4))
    additive = torch.tensor([[0.0, 0.0, 0.0, -10000.0], [0.0] * 4])
    with pytest.raises(ValueError, match=r"1 or True at real tokens .* pass attention_mask=\(mask == 0\)"):
        real_tokens(additive, (2, 4), "input_ids")
    with pytest.raises(ValueError, match="must be a tensor of input_ids shape"):
        real_tokens([[1, 1, 1, 0]], (2, 4), "input_ids")
    ones = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert torch.equal(real_tokens(ones, (2, 4), "input_ids"), ones.bool())
    assert torch.equal(real_tokens(ones.float(), (2, 4), "input_ids"), ones.bool())
    encoder = getattr(model, "encoder", model)
    with pytest.raises(ValueError, match="1 or True at real tokens"):
        encoder(ids, attention_mask=additive)
    h = encoder(ids, attention_mask=ones)
    with pytest.raises(ValueError, match="has no real token"):
        encoder.pool(h, torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]]), how="mean")
    torch.testing.assert_close(encoder.pool(h, ones, how="mean")[1], h[1].mean(0))


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.MultiheadAttention(8, 2),
        lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16),
        lambda: nn.TransformerDecoderLayer(8, 2, dim_feedforward=16),
    ],
)
def test_converting_a_sequence_first_torch_attention_warns(make):
    """The converted module is batch-first: the source's (t, b, d) call ran and computed other numbers."""
    with pytest.warns(UserWarning, match=r"batch_first=False .* call the converted module on \(b, t, d\)"):
        from_torch(make())


def test_converting_a_batch_first_torch_attention_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_torch(nn.MultiheadAttention(8, 2, batch_first=True))
        from_torch(nn.LSTM(4, 8))  # keeps its batch_first: nothing to say


@pytest.mark.parametrize("sdpa", [scaled_dot_product_attention, scaled_dot_product_attention_ref])
def test_sdpa_refuses_integer_or_mixed_dtypes_and_a_dropout_outside_0_1(sdpa):
    """The reference returned zeros for integer q, k, v; dropout -1 reported 'dropout > 0' from torch."""
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match=r"floating tensors of one dtype, got torch\.int64"):
        sdpa(q.long(), q.long(), q.long())
    with pytest.raises(TypeError, match=r"got torch\.float32, torch\.float64, torch\.float32"):
        sdpa(q, q.double(), q)
    for p in (-1.0, 1.0, 2.0):
        with pytest.raises(ValueError, match=r"dropout_p must be a number in \[0, 1\)"):
            sdpa(q, q, q, None, p)


def test_padding_mask_refuses_impossible_lengths():
    """Lengths past max_len were cut, negative ones gave an all-padding row, fractional ones were accepted."""
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, max_len=5\], got values from 3 to 7"):
        padding_mask([3, 7], max_len=5)
    with pytest.raises(ValueError, match=r"lengths must be >= 0, got values from -1 to 3"):
        padding_mask([3, -1])
    with pytest.raises(ValueError, match="lengths must be integers of shape"):
        padding_mask([2.5, 3.0])
    with pytest.raises(ValueError, match="needs max_len"):
        padding_mask([])
    assert padding_mask([], max_len=3).shape == (0, 3)
    assert padding_mask([1, 3]).int().tolist() == [[1, 0, 0], [1, 1, 1]]


def test_rnn_attention_sizes_are_checked():
    with pytest.raises(ValueError, match="AdditiveAttention: d_attn must be a positive integer, got 0"):
        AdditiveAttention(6, 8, 0)
    with pytest.raises(ValueError, match=r"AdditiveAttention: d_query must be a positive integer, got 6\.0"):
        AdditiveAttention(6.0, 8, 4)
    with pytest.raises(ValueError, match="LuongAttention: d_key must be a positive integer, got -3"):
        LuongAttention(4, -3)


def test_rotary_offsets_and_positions_are_checked():
    rope = RotaryEmbedding(8)
    q = torch.randn(2, 1, 3, 8)
    with pytest.raises(ValueError, match=r"offset must be an int or a 0-d integer tensor >= 0, got 1\.5"):
        rope(q, 1.5)
    with pytest.raises(
        ValueError, match=r"offset must be an int or a 0-d integer tensor >= 0, got torch.int64 of"
    ):
        rope(q, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"positions must be integers of shape \(t,\) = \(3,\) or \(b, t\)"):
        rope(q, positions=torch.arange(5))
    with pytest.raises(ValueError, match=r"positions must be integers"):
        rope(q, positions=torch.zeros(3, 3, dtype=torch.long))
    torch.testing.assert_close(rope(q, torch.tensor(2)), rope(q, 2))
    torch.testing.assert_close(rope(q, positions=torch.arange(2, 5)), rope(q, 2))
    torch.testing.assert_close(rope(q, positions=torch.arange(2, 5).expand(2, 3)), rope(q, 2))


def test_lm_state_entries_are_checked_before_they_are_read():
    """state=[None] read .pos off None ('NoneType' object has no attribute 'pos')."""
    model = create("test-gpt").eval()
    ids = torch.randint(0, 50, (1, 4))
    with pytest.raises(ValueError, match=r"one entry per layer \(2\), as init_state makes; got 1 entries"):
        model(ids, state=[None])
    fresh = model(ids, state=[None] * len(model.blocks))  # None entries: fresh states, position 0
    torch.testing.assert_close(fresh, model(ids))


def test_size_helpers_refuse_negative_sizes():
    with pytest.raises(ValueError, match="t_q must be an integer >= 0"):
        causal_mask(-1)
    with pytest.raises(ValueError, match="n_positions must be an integer >= 0, got -1"):
        sinusoidal_table(-1, 8)
    with pytest.raises(ValueError, match=r"new_grid must be two positive integers"):
        interpolate_grid_positions(torch.randn(9, 4), (3, 3), (0, 4))
    assert causal_mask(0).shape == (0, 0)


def test_attention_init_state_refuses_a_batch_size_that_is_not_a_count():
    from seqlab.layers import MultiheadAttention

    for bad in (-1, 1.5, True):
        with pytest.raises(
            ValueError, match=r"MultiheadAttention\.init_state: batch_size must be an integer >= 0"
        ):
            MultiheadAttention(8, 2, causal=True).init_state(bad)
    assert MultiheadAttention(8, 2, causal=True).init_state(0).k.shape == (0, 2, 0, 4)
