"""TransformerEncoderLayer.forward_first: the first n rows of forward, outputs and gradients, for every form of
the layer (pre- and post-norm, causal, masks, RoPE's fallback), and a clear error for an n out of range."""

import pytest
import torch

from seqlab.layers.positional import RotaryEmbedding
from seqlab.layers.transformer_blocks import TransformerEncoderLayer


def _layer(seed=0, **kw):
    torch.manual_seed(seed)
    return TransformerEncoderLayer(
        16, 4, 32, dropout=0.0, activation="gelu", dtype=torch.float64, **kw
    ).eval()


def _x(b=3, t=7, seed=1):
    return torch.randn(b, t, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 3, 7])
def test_first_rows_and_gradients_equal_the_full_forward(norm_first, causal, n):
    layer = _layer(norm_first=norm_first, causal=causal)
    x1, x2 = _x().requires_grad_(), _x().requires_grad_()
    full, first = layer(x1)[:, :n], layer.forward_first(x2, n)
    torch.testing.assert_close(first, full, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(full)
    g1 = torch.autograd.grad((full * w).sum(), [x1, *layer.parameters()])
    g2 = torch.autograd.grad((first * w).sum(), [x2, *layer.parameters()])
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_masks_keep_their_meaning(causal):
    layer, x = _layer(causal=causal), _x()
    keys = torch.tensor([[True] * 7, [True] * 4 + [False] * 3, [True] * 2 + [False] * 5])[:, None, None, :]
    torch.testing.assert_close(layer.forward_first(x, 2, keys), layer(x, keys)[:, :2], rtol=1e-12, atol=1e-12)
    full = torch.rand(3, 1, 7, 7, generator=torch.Generator().manual_seed(2)) > 0.3
    full[..., 0] = True  # every query sees at least one key
    torch.testing.assert_close(layer.forward_first(x, 4, full), layer(x, full)[:, :4], rtol=1e-12, atol=1e-12)
    square = full[0, 0]  # a (t, t) mask: its rows are cut to n before the causal structure joins them
    torch.testing.assert_close(
        layer.forward_first(x, 3, square), layer(x, square)[:, :3], rtol=1e-12, atol=1e-12
    )


def test_rope_takes_the_full_layer_and_slices():
    layer = _layer(rope=RotaryEmbedding(4), causal=True)
    x = _x()
    torch.testing.assert_close(layer.forward_first(x, 2), layer(x)[:, :2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [0, 8, -1, 1.5, True])
def test_n_out_of_range_or_not_an_int_is_refused(n):
    with pytest.raises(ValueError, match=r"n must be an int in \[1, 7\] for an input of 7 positions, got"):
        _layer().forward_first(_x(), n)


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (
            torch.randn(7, 16, dtype=torch.float64),
            r"expects x of shape \(b, t, 16\) with t >= 1, got \(7, 16\)",
        ),
        (
            torch.randn(2, 7, 15, dtype=torch.float64),
            r"expects x of shape \(b, t, 16\) with t >= 1, got \(2, 7, 15\)",
        ),
        (torch.randn(2, 7, 16), r"has torch.float64 parameters but x is torch.float32"),
    ],
)
def test_a_wrong_input_is_refused_naming_the_layer(x, message):
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer.forward_first " + message):
        _layer().forward_first(x, 1)
