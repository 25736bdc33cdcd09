"""Edge cases of the layers: casts that must not round RoPE's frequencies, float64 kept float64, the RNN
attentions' inputs checked at the boundary, a KV cache's mask, and Mamba's step from no state."""

import pytest
import torch
import torch.nn.functional as F

from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.mamba import Mamba
from seqlab.layers.norms import RMSNorm
from seqlab.layers.patch import interpolate_grid_positions
from seqlab.layers.positional import RotaryEmbedding
from seqlab.layers.rnn_attention import AdditiveAttention, LuongAttention


def test_a_cast_module_rotates_like_one_built_in_that_dtype():
    exact = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.double()):
        rope = cast(RotaryEmbedding(64))
        assert rope.inv_freq.dtype == torch.float32
        assert torch.allclose(rope.inv_freq.double(), exact, rtol=1e-6)  # bfloat16 rounding was 0.4%
    x = torch.randn(1, 2, 3, 64)
    built, cast = RotaryEmbedding(64), RotaryEmbedding(64).to(torch.bfloat16)
    assert torch.equal(cast(x, offset=2000), built(x, offset=2000))
    meta = RotaryEmbedding(64, device="meta")
    meta.to_empty(device="cpu")  # the frequencies come back computed, not uninitialized memory
    assert torch.equal(meta(x, offset=7), built(x, offset=7))
    with pytest.raises(ValueError, match=r"offset must be a position >= 0, got tensor\(-3\)"):
        built(x, offset=torch.tensor(-3))


def test_float64_stays_float64_in_rms_norm_and_grid_interpolation():
    torch.manual_seed(0)
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    norm, ref = (
        RMSNorm(16, eps=1e-6, dtype=torch.float64),
        torch.nn.RMSNorm(16, eps=1e-6, dtype=torch.float64),
    )
    assert (norm(x) - ref(x)).abs().max() < 1e-14  # float32 inside: 5e-7
    assert torch.autograd.gradcheck(norm, (x,))
    table = torch.randn(16, 8, dtype=torch.float64)
    img = table.reshape(1, 4, 4, 8).permute(0, 3, 1, 2)
    exact = (
        F.interpolate(img, size=(6, 6), mode="bicubic", align_corners=False)
        .permute(0, 2, 3, 1)
        .reshape(36, 8)
    )
    assert torch.equal(interpolate_grid_positions(table, (4, 4), (6, 6)), exact)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            {"keys": torch.randn(2, 7, 5)},
            r"keys \(b, s, 6\) with the same b; got query \(2, 4\) and keys \(2, 7, 5\)",
        ),
        (
            {"values": torch.randn(2, 8, 3)},
            r"values \(b, s, d_v\) with the keys' \(b, s\) = \(2, 7\); got \(2, 8, 3\)",
        ),
        (
            {"values": torch.randn(3, 7, 3)},
            r"values \(b, s, d_v\) with the keys' \(b, s\) = \(2, 7\); got \(3, 7, 3\)",
        ),
        (
            {"query": torch.randn(2, 4, dtype=torch.float64)},
            r"float32 parameters but query is torch\.float64",
        ),
    ],
)
def test_rnn_attentions_name_what_they_expected(args, match):
    inputs = {"query": torch.randn(2, 4), "keys": torch.randn(2, 7, 6), **args}
    for attn in (AdditiveAttention(4, 6, 5), LuongAttention(4, 6, score="general")):
        with pytest.raises(ValueError, match=match):
            attn(**inputs)
    bahdanau = AdditiveAttention(4, 6, 5)
    other_source = bahdanau.project_keys(torch.randn(2, 5, 6))
    with pytest.raises(
        ValueError, match=r"keys_proj \(b, s, 5\) with the keys' \(b, s\) = \(2, 7\); got \(2, 5, 5\)"
    ):
        bahdanau(torch.randn(2, 4), torch.randn(2, 7, 6), keys_proj=other_source)
    with pytest.raises(ValueError, match=r"keys \(b, s, 4\)"):  # dot: the keys as wide as the query
        LuongAttention(4, score="dot")(torch.randn(2, 4), torch.randn(2, 7, 5))


def test_a_mask_that_leaves_out_the_cached_keys_is_named():
    torch.manual_seed(0)
    attn, x = MultiheadAttention(16, 4, causal=True), torch.randn(2, 5, 16)
    _, cache = attn(x)
    with pytest.raises(
        ValueError, match=r"\(b, h, t_q, t_k\) = \(2, 4, 5, 10\); t_k counts the 5 cached keys"
    ):
        attn(x, state=cache, mask=torch.ones(5, 5, dtype=torch.bool))
    y, _ = attn(x, state=cache, mask=torch.ones(5, 10, dtype=torch.bool))  # what it expects runs
    assert y.shape == (2, 5, 16)


def test_mamba_steps_from_no_state_like_from_its_initial_state():
    torch.manual_seed(0)
    mamba, x = Mamba(8, d_state=4), torch.randn(3, 8)
    y0, s0 = mamba.step(x, None)
    y1, s1 = mamba.step(x, mamba.init_state(3))
    assert torch.equal(y0, y1) and all(torch.equal(a, b) for a, b in zip(s0, s1, strict=True))
