"""seqlab.kernels.decode (decode.cpp): the float32 decoding step as one C++ call, against the torch-op step of
StaticCacheDecoder (itself held to LM.step in test_gpt_decode.py), and its fallback."""

import shutil
import warnings

import pytest
import torch
from test_gpt_decode import CONFIGS, make, reference  # the same folder (pytest puts it on sys.path)

from seqlab.kernels import decode as decode_kernel
from seqlab.layers.positional import RotaryEmbedding
from seqlab.models.gpt_decode import StaticCacheDecoder

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


def interleaved_partial_rope(model):
    """The llama config with RoPE on the pairs (2i, 2i + 1) of the first half of each head only."""
    for blk in model.blocks:
        blk.mixer.rope = RotaryEmbedding(
            blk.mixer.head_dim, interleaved=True, rotary_dim=blk.mixer.head_dim // 2
        )
    return model


def models():
    for name in sorted(CONFIGS):
        yield name, make(name, torch.float32)
    yield "llama-interleaved-partial-rope", interleaved_partial_rope(make("llama", torch.float32))


@needs_compiler
@pytest.mark.parametrize("batch", [1, 3])
@torch.inference_mode()
def test_kernel_step_equals_the_torch_op_step(batch):
    for name, model in models():
        ids = torch.randint(0, 50, (batch, 24))
        fast, slow = StaticCacheDecoder(model, 24), StaticCacheDecoder(model, 24, use_kernel=False)
        (_, p1), (_, p2) = fast(ids[:, :4]), slow(ids[:, :4])
        assert fast.native is not None and slow.native is None, name
        for t in range(4, 24):
            (got, p1), (want, p2) = fast.step(ids[:, t], p1), slow.step(ids[:, t], p2)
            # float32 sums in another order: relative to the logits' scale, a few ulps
            torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * want.abs().max().item(), msg=name)
        assert p1 == p2 == 24


@needs_compiler
@torch.inference_mode()
def test_greedy_in_one_call_equals_step_then_argmax():
    model = make("gpt2", torch.float32)
    ids = torch.randint(0, 50, (2, 5))
    one, many = StaticCacheDecoder(model, 30), StaticCacheDecoder(model, 30)
    logits, pos = one(ids)
    many(ids)
    first = logits[:, -1].argmax(-1)
    tokens = one.greedy(first, pos, 20)
    nxt, expected = first, []
    for _ in range(20):
        step_logits, pos = many.step(nxt, pos)
        nxt = step_logits.argmax(-1)
        expected.append(nxt)
    assert torch.equal(tokens, torch.stack(expected, 1))
    assert one.pos == many.pos == 25
    assert one.greedy(nxt, 25, 6) is None  # 31 positions do not fit 30: the caller steps (and slides) instead


@needs_compiler
@torch.inference_mode()
def test_kernel_refuses_bad_tokens_and_positions_with_a_clear_error():
    model = make("gpt2", torch.float32)
    dec = StaticCacheDecoder(model, 10)
    _, pos = dec(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"token id 50 is not in \[0, 50\)"):
        dec.native.step(torch.tensor([50]), pos)
    with pytest.raises(RuntimeError, match="do not fit the buffers' 10"):
        dec.native.greedy(torch.tensor([1]), pos, 8)
    with pytest.raises(RuntimeError, match=r"expected ids of shape \(1,\) int64"):
        dec.native.step(torch.tensor([1.0]), pos)
    from seqlab.models.gpt_decode import _decode_kernel, _native_decoder

    # key caches that do not match the capacity of 10 positions
    short = [(k[:, :, :4].contiguous(), v) for k, v in dec.buffers]
    with pytest.raises(RuntimeError, match="layer tensor 14 has"):
        _native_decoder(_decode_kernel(model), model, 1, 10, short, None, None, None)


def test_float64_and_a_failed_build_take_the_torch_path(monkeypatch):
    model64 = make("gpt2")  # float64: the kernel is float32 only
    dec = StaticCacheDecoder(model64, 8)
    with torch.inference_mode():
        dec(torch.zeros(1, 3, dtype=torch.long))
    assert dec.native is None

    def no_compiler():
        raise RuntimeError("error: c++: command not found")

    monkeypatch.setattr(decode_kernel.EXTENSION, "_loaded", {})
    monkeypatch.setattr(decode_kernel.EXTENSION, "_compile", no_compiler)
    model = make("gpt2", torch.float32)
    prompt = torch.randint(0, 50, (2, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(prompt, 12, temperature=0)
        model.generate(prompt, 3, temperature=0)
    mine = [w for w in caught if "decoding kernel could not be built" in str(w.message)]
    assert len(mine) == 1 and "command not found" in str(mine[0].message)
    assert torch.equal(out, reference(model).generate(prompt, 12, temperature=0))
