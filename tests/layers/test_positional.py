"""Positional encodings: the formulas, RoPE's relative property and layouts, offsets for cached decoding."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlab.layers.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_2d_table,
    sinusoidal_table,
)


def test_sinusoidal_values_match_the_formula():
    pe = sinusoidal_table(50, 16)
    for p in (0, 1, 7, 49):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    enc = SinusoidalPositionalEncoding(16, max_seq_len=50)
    x = torch.zeros(2, 5, 16)
    torch.testing.assert_close(enc(x, offset=3)[0], pe[3:8])
    with pytest.raises(ValueError, match="max_seq_len"):
        enc(x, offset=48)


def test_learned_positions_add_rows_with_offset():
    emb = LearnedPositionalEmbedding(10, 4)
    x = torch.zeros(1, 3, 4)
    torch.testing.assert_close(emb(x, offset=2)[0], emb.weight[2:5])
    with pytest.raises(ValueError, match="max_seq_len"):
        emb(x, offset=8)


def test_2d_sinusoidal_encodes_column_then_row():
    table = sinusoidal_2d_table(3, 4, 8)  # 3 rows x 4 columns of patches
    assert table.shape == (12, 8)
    r, c = 2, 1
    row = table[r * 4 + c]
    omega = torch.tensor([1.0, 10000**-0.5], dtype=torch.float64)
    expect_col = torch.cat([(c * omega).sin(), (c * omega).cos()]).float()
    expect_row = torch.cat([(r * omega).sin(), (r * omega).cos()]).float()
    torch.testing.assert_close(row, torch.cat([expect_col, expect_row]))
    # patches in the same column share the first half
    torch.testing.assert_close(table[1, :4], table[4 + 1, :4])


@settings(max_examples=20, deadline=None)
@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(0, 300), interleaved=st.booleans())
def test_rope_inner_product_depends_only_on_the_distance(m, n, shift, interleaved):
    rope = RotaryEmbedding(8, interleaved=interleaved)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=gen), torch.randn(1, 1, 1, 8, generator=gen)

    def score(a, b):
        return (rope(q, offset=a) * rope(k, offset=b)).sum().item()

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-3)


def test_rope_layouts_rotate_the_right_pairs_and_keep_norms():
    x = torch.randn(2, 3, 5, 8)
    for interleaved in (False, True):
        y = RotaryEmbedding(8, interleaved=interleaved)(x)
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
        torch.testing.assert_close(y[:, :, 0], x[:, :, 0])  # position 0: no rotation
    # rotate-half layout (HF Llama): pair (i, i + k/2) at angle p θ_i
    half = RotaryEmbedding(8)(x)
    p, theta = 3, 10000 ** (-2 * 1 / 8)
    c, s = math.cos(p * theta), math.sin(p * theta)
    torch.testing.assert_close(half[..., p, 1], x[..., p, 1] * c - x[..., p, 5] * s)
    torch.testing.assert_close(half[..., p, 5], x[..., p, 5] * c + x[..., p, 1] * s)
    inter = RotaryEmbedding(8, interleaved=True)(x)
    torch.testing.assert_close(inter[..., p, 2], x[..., p, 2] * c - x[..., p, 3] * s)
    # the two layouts are the same rotation up to a permutation of channels
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    torch.testing.assert_close(RotaryEmbedding(8, interleaved=True)(x[..., perm]), half[..., perm])


def test_rope_offsets_positions_and_partial_rotary():
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 2, 6, 8)
    torch.testing.assert_close(rope(x)[:, :, 4:], rope(x[:, :, 4:], offset=4))
    torch.testing.assert_close(rope(x[:, :, 4:], offset=torch.tensor(4)), rope(x)[:, :, 4:])
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 2]])  # a left-padded second row
    y = rope(x, positions=pos)
    torch.testing.assert_close(y[1, :, 3:], rope(x[1:, :, 3:])[0])
    part = RotaryEmbedding(8, rotary_dim=4)
    yp = part(x)
    torch.testing.assert_close(yp[..., 4:], x[..., 4:])
    with pytest.raises(ValueError, match="rotary_dim"):
        RotaryEmbedding(8, rotary_dim=3)
