"""Masks: one polarity (True = may attend), bottom-right causal alignment, windows, padding, torch's masks."""

import pytest
import torch

from seqlab.layers.masks import (
    causal_mask,
    combine_masks,
    from_torch_mask,
    key_padding_mask,
    padding_mask,
    sliding_window_mask,
)


def test_causal_mask_square_and_cached():
    torch.testing.assert_close(causal_mask(4), torch.ones(4, 4).tril().bool())
    # 2 new queries after 3 cached keys: the queries are positions 3 and 4 of 5 keys
    assert causal_mask(2, 5).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("window", [1, 2, 5])
def test_sliding_window_is_the_causal_band(window):
    m = sliding_window_mask(6, 8, window=window)
    for i in range(6):
        p = i + 2  # the query's position among the keys
        allowed = [j for j in range(8) if m[i, j]]
        assert allowed == list(range(max(0, p - window + 1), p + 1))
    sym = sliding_window_mask(5, window=2, causal=False)
    assert sym.int().tolist()[2] == [0, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(3, window=0)


def test_padding_and_key_padding_masks():
    assert padding_mask([3, 1]).int().tolist() == [[1, 1, 1], [1, 0, 0]]
    assert padding_mask(torch.tensor([2]), max_len=4).int().tolist() == [[1, 1, 0, 0]]
    kp = key_padding_mask([3, 1])
    assert kp.shape == (2, 1, 1, 3) and kp[1, 0, 0].tolist() == [True, False, False]
    assert key_padding_mask(torch.tensor([[True, False]])).shape == (1, 1, 1, 2)


def test_combine_masks_broadcasts_and_skips_none():
    assert combine_masks(None, None) is None
    m = combine_masks(causal_mask(3), None, key_padding_mask([2, 3]))
    assert m.shape == (2, 1, 3, 3)
    assert m[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    with pytest.raises(TypeError, match="boolean"):
        combine_masks(torch.zeros(2, 2))


def test_from_torch_mask_flips_polarity():
    attn = torch.tensor([[False, True], [False, False]])  # torch: True = NOT allowed
    kpm = torch.tensor([[False, True], [False, False]])  # torch: True = padding
    m = from_torch_mask(attn, kpm)
    assert m.shape == (2, 1, 2, 2)
    assert m[0, 0].int().tolist() == [[1, 0], [1, 0]] and m[1, 0].int().tolist() == [[1, 0], [1, 1]]
    additive = torch.tensor([[0.0, float("-inf")], [0.0, 0.0]])
    torch.testing.assert_close(from_torch_mask(additive), ~attn)
    with pytest.raises(ValueError, match="no boolean equivalent"):
        from_torch_mask(torch.tensor([[0.0, -1.0]]))
    assert from_torch_mask() is None


@pytest.mark.parametrize("t", [7, 40])  # torch's SDPA below the kernel's 32 queries, seqlab's kernel above
def test_a_one_dimensional_key_mask_means_the_same_on_every_path(t):
    """A (t_k,) key mask masks those keys for every query; torch's SDPA wants a 2-D mask, so the fast path
    used to fail with an IndexError below the kernel's lengths while the reference path worked."""
    from seqlab.layers.attention import MultiheadAttention
    from seqlab.layers.sdpa import scaled_dot_product_attention, scaled_dot_product_attention_ref

    torch.manual_seed(0)
    keys = torch.ones(t, dtype=torch.bool)
    keys[5:] = False
    q = torch.randn(2, 2, t, 16)
    for mask in (keys, torch.zeros(t, dtype=torch.bool)):  # the second masks every key: zeros
        want = scaled_dot_product_attention_ref(q, q, q, mask)
        torch.testing.assert_close(scaled_dot_product_attention(q, q, q, mask), want)
        torch.testing.assert_close(
            scaled_dot_product_attention(q, q, q, mask),
            scaled_dot_product_attention_ref(q, q, q, mask[None, None, None]),
        )
    mha = MultiheadAttention(16, 2)
    x = torch.randn(3, t, 16)
    torch.testing.assert_close(mha(x, mask=keys)[0], mha.forward_ref(x, mask=keys)[0])


def test_an_integer_padding_mask_is_named_as_a_mask():
    """It was read as lengths and refused as 'lengths must be 1-D'."""
    with pytest.raises(
        ValueError, match=r"a padding mask must be boolean \(b, t_k\).* got torch\.int64 \(2, 6\)"
    ):
        key_padding_mask(torch.ones(2, 6, dtype=torch.long))
    assert key_padding_mask(torch.tensor([2, 3]), 4).shape == (2, 1, 1, 4)
