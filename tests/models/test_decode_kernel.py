"""seqlab.kernels.decode (decode.cpp): the float32 decoding step as one C++ call, against the torch-op step of
StaticCacheDecoder (itself held to LM.step in test_gpt_decode.py), and its fallback."""

import shutil

import pytest
import torch
from test_gpt_decode import CONFIGS, make, reference  # the same folder (pytest puts it on sys.path)

from seqlab.kernels import decode as decode_kernel
from seqlab.layers.positional import RotaryEmbedding
from seqlab.models.generation import sample_next
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


SAMPLINGS = [
    {"temperature": 1.0},
    {"temperature": 0.8, "top_k": 7},
    {"temperature": 1.3, "top_p": 0.85},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.6},
    {"temperature": 2.0, "top_k": 1},
]


@needs_compiler
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@torch.inference_mode()
def test_sampling_in_one_call_draws_what_step_then_sample_next_draws(batch, sampling):
    """The kernel's sampler against stepping the decoder and drawing with sample_next (torch.topk, torch.sort,
    torch.softmax and torch.multinomial), from one generator state: the same tokens."""
    for name, model in models():
        ids = torch.randint(0, 50, (batch, 5))
        one, many = StaticCacheDecoder(model, 30), StaticCacheDecoder(model, 30)
        logits, pos = one(ids)
        many(ids)
        first = logits[:, -1].argmax(-1)
        tokens = one.sample(first, pos, 25, generator=torch.Generator().manual_seed(3), **sampling)
        g, nxt, expected = torch.Generator().manual_seed(3), first, []
        for _ in range(25):
            step_logits, pos = many.step(nxt, pos)
            nxt = sample_next(step_logits, generator=g, **sampling)
            expected.append(nxt)
        assert torch.equal(tokens, torch.stack(expected, 1)), name
        assert one.pos == many.pos == 30
        if sampling.get("top_k") == 1:  # one token left: the argmax, whatever the draw
            assert torch.equal(tokens, one_greedy(model, ids, first, 25)), name


def one_greedy(model, ids, first, n):
    dec = StaticCacheDecoder(model, 30)
    _, pos = dec(ids)
    return dec.greedy(first, pos, n)


@needs_compiler
@torch.inference_mode()
def test_generate_samples_through_the_kernel_with_the_module_paths_tokens():
    """LM.generate with sampling runs the kernel's loop and gives the tokens of fast_path=False (LM.step and
    sample_next) for the same seed, torch's default generator included; past the position table both slide."""
    model = make("gpt2", torch.float32)  # 32 positions
    prompt = torch.randint(0, 50, (2, 6))
    ref = reference(model)  # built before seeding: building draws initial weights from the default generator
    ran = []
    original = StaticCacheDecoder.sample

    def spy(self, *args, **kwargs):
        ran.append(args[2])
        return original(self, *args, **kwargs)

    for n, sampling in [(20, {"top_k": 10}), (26, {"top_p": 0.9}), (40, {"temperature": 0.9})]:
        torch.manual_seed(11)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(StaticCacheDecoder, "sample", spy)
            fast = model.generate(prompt, n, **sampling)
        torch.manual_seed(11)
        slow = ref.generate(prompt, n, **sampling)
        assert torch.equal(fast, slow), sampling
    assert ran == [19, 25]  # 6 + 40 positions do not fit 32: that one steps token by token and slides


@needs_compiler
@torch.inference_mode()
def test_sampling_refuses_bad_arguments_and_nan_logits_with_a_clear_error():
    model = make("gpt2", torch.float32)
    dec = StaticCacheDecoder(model, 10)
    _, pos = dec(torch.zeros(1, 3, dtype=torch.long))
    one = torch.tensor([1])
    with pytest.raises(RuntimeError, match=r"temperature > 0 \(0 is greedy\), got 0"):
        dec.native.sample(one, pos, 2, 0.0, 0, 1.0, None)
    with pytest.raises(RuntimeError, match=r"top_p in \(0, 1\], got 0 and 1.5"):
        dec.native.sample(one, pos, 2, 1.0, 0, 1.5, None)
    with pytest.raises(RuntimeError, match="do not fit the buffers' 10"):
        dec.native.sample(one, pos, 8, 1.0, 0, 1.0, None)
    model.head.weight.data[3, 0] = float("nan")
    dec = StaticCacheDecoder(model, 10)
    _, pos = dec(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="the logits hold NaN or \\+inf, or a row is all -inf"):
        dec.sample(one, pos, 2, 1.0)
    with pytest.raises(RuntimeError, match="the logits hold NaN"):  # greedy too: no silent token 0
        dec.greedy(one, pos, 2)
    with pytest.raises(ValueError, match="the logits hold NaN"):  # and the module path, in sample_next
        reference(model).generate(torch.zeros(1, 3, dtype=torch.long), 2, temperature=0)


@needs_compiler
@torch.inference_mode()
def test_a_tiny_temperature_is_greedy_on_both_paths():
    """Logits over 1e-40 overflow float32 unless the top is taken off first (as both samplers do)."""
    model = make("gpt2", torch.float32)
    prompt = torch.randint(0, 50, (2, 4))
    greedy = model.generate(prompt, 12, temperature=0)
    assert torch.equal(model.generate(prompt, 12, temperature=1e-40), greedy)
    assert torch.equal(reference(model).generate(prompt, 12, temperature=1e-40), greedy)
    # below float32's smallest value the temperature is 0 there (logits / T = 0 / 0): greedy too, on every path
    assert torch.equal(model.generate(prompt, 12, temperature=1e-50), greedy)
    assert torch.equal(reference(model).generate(prompt, 12, temperature=1e-50), greedy)
    dec, dec_greedy = StaticCacheDecoder(model, 32), StaticCacheDecoder(model, 32)
    logits, pos = dec(prompt)
    dec_greedy(prompt)
    first = logits[:, -1].argmax(-1)
    assert torch.equal(dec.sample(first, pos, 6, 1e-50), dec_greedy.greedy(first, pos, 6))


@torch.inference_mode()
def test_float64_logits_are_sampled_in_float64():
    """Finite float64 logits past float32's range (3.4e38) would turn inf in a float32 cast."""
    logits = torch.tensor([[1e39, 0.0, 1e39 - 1e24]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    picks = {int(sample_next(logits, temperature=1e24, generator=g)) for _ in range(200)}
    assert picks == {0, 2}  # e^-1: both drawn, token 1 (1e15 temperatures below) never


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
    # the decoder's own step says it by name on both paths (-1 would wrap to the last row on the torch one)
    for use_kernel in (True, False):
        d = StaticCacheDecoder(model, 10, use_kernel=use_kernel)
        _, p = d(torch.zeros(1, 3, dtype=torch.long))
        for bad in (-1, 50):
            with pytest.raises(ValueError, match=rf"token ids must be in \[0, 50\).*from {bad} to {bad}"):
                d.step(torch.tensor([bad]), p)
        got, _ = d.step(torch.tensor([7], dtype=torch.int32), p)  # int32 ids as torch's embedding takes them
        assert got.shape == (1, 50)
    from seqlab.models.gpt_decode import _decode_kernel, _native_decoder

    # key caches that do not match the capacity of 10 positions
    short = [(k[:, :, :4].contiguous(), v) for k, v in dec.buffers]
    with pytest.raises(RuntimeError, match="layer tensor 14 has"):
        _native_decoder(_decode_kernel(model), model, 1, 10, short, None, None, None)


def test_float64_and_a_failed_build_take_the_torch_path(failed_build):
    model64 = make("gpt2")  # float64: the kernel is float32 only
    dec = StaticCacheDecoder(model64, 8)
    with torch.inference_mode():
        dec(torch.zeros(1, 3, dtype=torch.long))
    assert dec.native is None

    failed_build(decode_kernel.EXTENSION)
    model = make("gpt2", torch.float32)
    prompt = torch.randint(0, 50, (2, 4))
    with failed_build.warns_once("decoding kernel"):
        out = model.generate(prompt, 12, temperature=0)
        model.generate(prompt, 3, temperature=0)
    assert torch.equal(out, reference(model).generate(prompt, 12, temperature=0))
