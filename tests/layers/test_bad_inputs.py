"""The cases a hostile tester found, one by one: each is now a clear ValueError at the boundary."""

import pytest
import torch

from seqlab.layers import S4D, Mamba, MultiheadAttention, create_mixer, list_mixers
from seqlab.models import create


def test_states_are_checked_not_broadcast():
    s4d = S4D(16, d_state=8)
    with pytest.raises(ValueError, match=r"S4D state must have shape \(1, 16, 4\)"):
        s4d.step(torch.randn(1, 16), s4d.init_state(3))  # used to return a batch of 3
    with pytest.raises(ValueError, match="state"):
        s4d.step(torch.randn(1, 16), S4D(16, d_state=16).init_state(1))  # another layer's state
    mamba = Mamba(16, d_state=4)
    conv, ssm = mamba.init_state(3)
    with pytest.raises(ValueError, match="state"):
        mamba.step(torch.randn(3, 16), (conv, ssm[:1]))  # a batch-1 ssm state over a batch of 3
    attn = create_mixer("attention", 16)
    _, cache = attn(torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="2"):
        attn(torch.randn(3, 1, 16), state=cache)  # a KV cache from another batch


def test_dtypes_empty_sequences_and_masks():
    lstm = create_mixer("lstm", 8)
    with pytest.raises(ValueError, match=r"float64.*float32|float32.*float64"):
        lstm(torch.randn(2, 3, 8, dtype=torch.float64))
    for name in ("s4d", "mamba"):
        with pytest.raises(ValueError):
            create_mixer(name, 8)(torch.randn(2, 0, 8))
    attn = MultiheadAttention(8, 2)
    with pytest.raises(ValueError):
        attn(torch.randn(2, 3, 8), mask=torch.ones(1, 1, 1, 3, 3, dtype=torch.bool))
    with pytest.raises((ValueError, TypeError)):
        attn(torch.randn(2, 3, 8), mask=[[True, True, True]])


@pytest.mark.parametrize(
    "build",
    [
        lambda: MultiheadAttention(32, 0),
        lambda: create_mixer("attention", 32, n_heads=-4),
        lambda: create_mixer("mamba", 32, dt_rank=0),
        lambda: create_mixer("attention", 32, head_dim=0),
        lambda: create_mixer("mamba", 32, d_conv=0),
        lambda: create_mixer("s4d", 32, d_state=0),
        lambda: S4D(0),
        lambda: S4D(16, dt_min=0.5, dt_max=0.1),
        lambda: create("test-gpt-llama", rope_base=0),
        lambda: create("test-gpt", norm_eps=-1),
        lambda: create("test-gpt", d_ff=-5),
        lambda: create("test-lm-gru", d_input=0),
    ],
)
def test_configs_that_gave_nan_or_zero_division_are_refused(build):
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize("layer", ["TransformerEncoderLayer", "TransformerDecoderLayer"])
@pytest.mark.parametrize(
    "fields,message",
    [
        ({"d_model": 0, "n_heads": 1}, "d_model must be a positive integer, got 0"),
        ({"d_model": 8, "n_heads": 3}, "divisible by n_heads=3"),
        ({"d_model": 8, "n_heads": 2, "d_ff": -1}, "d_ff must be a positive integer, got -1"),
        ({"d_model": 8, "n_heads": 2, "dropout": 2.0}, "dropout must be a probability"),
        ({"d_model": 8, "n_heads": 2, "norm_eps": -1}, "eps must be a positive finite number"),
        ({"d_model": 8, "n_heads": 2, "activation": "tanh"}, "activation must be one of"),
    ],
)
def test_transformer_layers_refuse_bad_arguments_by_name(layer, fields, message):
    from seqlab.layers import transformer_blocks

    with pytest.raises(ValueError, match=message):
        getattr(transformer_blocks, layer)(**fields)


@pytest.mark.parametrize("name", list_mixers())
def test_autocast_lifts_the_dtype_check_only(name):
    """Outside autocast a bf16 input into a float32 mixer is refused by name; inside torch.autocast (where a
    lower precision is the point) it runs, and a wrong width is still refused."""
    mixer = create_mixer(name, 16)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        mixer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = mixer(x)
        assert y.shape == (2, 5, 16) and bool(torch.isfinite(y.float()).all())
        with pytest.raises(ValueError, match="16"):
            mixer(torch.randn(2, 5, 8, dtype=torch.bfloat16))


def test_norms_and_positions_refuse_what_they_would_misread():
    """Integer inputs came back truncated, a wrong width gave the kernel's message about the weight, and a
    negative offset read rows from the end of the position table."""
    from seqlab.layers.norms import LayerNorm, RMSNorm
    from seqlab.layers.positional import (
        LearnedPositionalEmbedding,
        RotaryEmbedding,
        SinusoidalPositionalEncoding,
    )

    for norm in (LayerNorm(4), RMSNorm(4)):
        name = type(norm).__name__
        with pytest.raises(
            ValueError, match=rf"{name} normalizes x \(\.\.\., 4\) over its last axis, got \(2, 3\)"
        ):
            norm(torch.randn(2, 3))
        with pytest.raises(ValueError, match=rf"{name} normalizes x .* got \(\)"):
            norm(torch.tensor(1.0))
        with pytest.raises(ValueError, match="floating tensor"):
            norm(torch.tensor([[1, 2, 3, 10]]))
        with pytest.raises(ValueError, match=r"float32 parameters but x is torch\.float64"):
            norm(torch.randn(2, 4, dtype=torch.float64))
    for pe in (SinusoidalPositionalEncoding(8, max_seq_len=16), LearnedPositionalEmbedding(16, 8)):
        name = type(pe).__name__
        for bad in (-5, -1, 1.5, True):
            with pytest.raises(ValueError, match=rf"{name}: offset must be an int >= 0"):
                pe(torch.zeros(1, 3, 8), offset=bad)
        with pytest.raises(ValueError, match=rf"{name} adds positions to x \(\.\.\., t, 8\)"):
            pe(torch.zeros(1, 3, 6))
        with pytest.raises(ValueError, match=r"of floats, got torch\.int64"):
            pe(torch.zeros(1, 3, 8, dtype=torch.long))
    rope = RotaryEmbedding(8)
    with pytest.raises(ValueError, match="RotaryEmbedding expects floats"):
        rope(torch.ones(1, 1, 3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="offset must be a position >= 0"):
        rope(torch.ones(1, 1, 3, 8), offset=-2)
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    assert torch.equal(rope(q), q)  # position 0 is the identity, in float64 too (it was rotated in float32)


def test_cells_mlps_and_the_conv_grid_say_what_they_expected():
    from seqlab.layers.conv import ConvGridEncoder
    from seqlab.layers.mlp import MLP, SwiGLU
    from seqlab.layers.recurrent import GRU
    from seqlab.layers.recurrent_cells import GRUCell, LSTMCell, RNNCell

    for mlp in (MLP(4, 8), SwiGLU(4, 8)):
        name = type(mlp).__name__
        with pytest.raises(ValueError, match=rf"{name} expects x of shape \(\.\.\., 4\), got \(2, 3\)"):
            mlp(torch.randn(2, 3))
        with pytest.raises(
            ValueError, match=rf"{name} has torch\.float32 parameters but x is torch\.float64"
        ):
            mlp(torch.randn(2, 4, dtype=torch.float64))
    for cell in (GRUCell(3, 4), LSTMCell(3, 4), RNNCell(3, 4)):
        name = type(cell).__name__
        with pytest.raises(
            ValueError, match=rf"{name} has torch\.float32 parameters but x is torch\.float64"
        ):
            cell(torch.randn(2, 3, dtype=torch.float64))
        h = torch.zeros(2, 4, dtype=torch.float64)
        with pytest.raises(
            ValueError, match=rf"{name} has torch\.float32 parameters but h is torch\.float64"
        ):
            cell(torch.randn(2, 3), (h, h) if name == "LSTMCell" else h)
        for bad in (0, -1, 2.5, True, None):
            with pytest.raises(ValueError, match=rf"{name}: input_size must be a positive integer"):
                type(cell)(bad, 4)
    for bad in (3.5, None, True, 0):
        with pytest.raises(ValueError, match="GRU: input_size must be a positive integer"):
            GRU(bad, 4)
    with pytest.raises(ValueError, match=r"GRU: dropout must be a probability in \[0, 1\], got True"):
        GRU(3, 4, num_layers=2, dropout=True)
    grid = ConvGridEncoder(3, [4, 8])
    with pytest.raises(
        ValueError, match=r"expects images \(b, 3, H, W\) with H and W positive multiples of 4"
    ):
        grid(torch.rand(1, 3, 18, 18))  # was cropped to a 4 x 4 grid without a word
    with pytest.raises(ValueError, match=r"got \(2, 1, 16, 16\)"):
        grid(torch.rand(2, 1, 16, 16))
    with pytest.raises(ValueError, match=r"torch\.float32 parameters but images is torch\.float64"):
        grid(torch.rand(2, 3, 16, 16, dtype=torch.float64))


def test_constructors_and_lm_steps_refuse_bad_sizes_by_name():
    from seqlab.layers.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
    from seqlab.layers.transformer_blocks import Transformer

    with pytest.raises(
        ValueError, match="SinusoidalPositionalEncoding: max_seq_len must be a positive integer"
    ):
        SinusoidalPositionalEncoding(8, max_seq_len=-1)
    with pytest.raises(
        ValueError, match="LearnedPositionalEmbedding: max_seq_len must be a positive integer"
    ):
        LearnedPositionalEmbedding(-1, 8)
    with pytest.raises(ValueError, match="Transformer: n_encoder_layers must be a positive integer, got -1"):
        Transformer(16, 2, -1, -1, d_ff=32)  # was accepted: a stack of no layers
    lm = create("test-gpt", vocab_size=11)
    with pytest.raises(
        ValueError, match=r"LM\.step expects one position per row, \(b,\) token ids; got \(\)"
    ):
        lm.step(torch.tensor(3))
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 0"):
            lm.init_state(bad)


def test_cross_attention_key_and_value_of_different_lengths():
    attn = MultiheadAttention(32, 4)
    with pytest.raises(ValueError, match="key and value must hold the same positions, got 3 and 4"):
        attn(torch.randn(2, 5, 32), key=torch.randn(2, 3, 32), value=torch.randn(2, 4, 32))
