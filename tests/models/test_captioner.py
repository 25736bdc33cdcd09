"""The image captioners: teacher forcing equals stepping, attention is a distribution over the regions, the
shared beam search batches correctly, and bad input is refused at the boundary."""

from __future__ import annotations

import math

import pytest
import torch

from seqlab.models import create
from seqlab.models.captioner import Captioner, CaptionerConfig

TEST_PRESETS = ["test-show-tell", "test-show-attend-tell", "test-vit-captioner"]
COMBOS = [  # the other encoder/decoder pairings the config allows
    {"encoder": "vit", "decoder": "lstm", "attention": "soft", "patch_size": 4, "d_encoder": 16},
    {"encoder": "vit", "decoder": "lstm", "attention": "none", "patch_size": 4, "d_encoder": 16},
    {"encoder": "cnn", "decoder": "transformer", "attention": "soft", "channels": [8, 16], "n_heads": 2},
    {"encoder": "cnn", "decoder": "lstm", "attention": "soft", "channels": [8, 16], "gate": False},
    {
        "encoder": "cnn",
        "decoder": "lstm",
        "attention": "soft",
        "channels": [8, 16],
        "region_position": "learned",
    },
]


def _model(name_or_fields, **over) -> Captioner:
    torch.manual_seed(0)
    if isinstance(name_or_fields, str):
        return create(name_or_fields, dtype=torch.float64, **over).eval()
    base = {"vocab_size": 24, "image_size": 16, "d_model": 32, "n_decoder_layers": 1, "dropout": 0.0}
    base.update({"n_encoder_layers": 1, "n_encoder_heads": 2})
    return Captioner(CaptionerConfig(**{**base, **name_or_fields, **over}), dtype=torch.float64).eval()


def _inputs(b=3, t=7, vocab=24, size=16):
    g = torch.Generator().manual_seed(1)
    images = torch.randn(b, 3, size, size, generator=g, dtype=torch.float64)
    tgt = torch.randint(3, vocab, (b, t), generator=g)
    tgt[:, 0] = 1  # bos
    return images, tgt


@pytest.mark.parametrize(
    "spec",
    TEST_PRESETS + COMBOS,
    ids=lambda s: s if isinstance(s, str) else "-".join(str(v) for v in s.values()),
)
def test_step_loop_equals_teacher_forcing(spec):
    model = _model(spec)
    images, tgt = _inputs()
    soft = model.config.attention == "soft"
    out = model(images, tgt, return_attention=soft)
    logits, alpha = out if soft else (out, None)
    state, steps, alphas = model.start(images), [], []
    for t in range(tgt.size(1)):
        step_logits, state, a = model.step(tgt[:, t], state)
        steps.append(step_logits)
        alphas.append(a)
    torch.testing.assert_close(torch.stack(steps, 1), logits, atol=1e-10, rtol=1e-10)
    if soft:
        torch.testing.assert_close(torch.stack(alphas, 1), alpha, atol=1e-12, rtol=1e-12)
        grid = model.config.grid**2
        assert alpha.shape == (3, tgt.size(1), grid)
        torch.testing.assert_close(alpha.sum(-1), torch.ones(3, tgt.size(1), dtype=torch.float64))
        assert (alpha >= 0).all()
    else:
        assert all(a is None for a in alphas)


@pytest.mark.parametrize("name", TEST_PRESETS)
def test_every_parameter_gets_a_finite_gradient(name):
    model = _model(name).train()
    images, tgt = _inputs()
    out = model(images, tgt, return_attention=model.config.attention == "soft")
    logits = out[0] if isinstance(out, tuple) else out
    loss = logits.logsumexp(-1).mean() - logits[..., 5].mean()
    if isinstance(out, tuple):
        loss = loss + ((1 - out[1].sum(1)) ** 2).mean()
    loss.backward()
    for name_, p in model.named_parameters():
        assert p.grad is not None, f"{name_} got no gradient"
        assert torch.isfinite(p.grad).all(), name_


@pytest.mark.parametrize("name", [*TEST_PRESETS, "vit-captioner", "show-attend-tell"])
def test_an_untrained_captioner_starts_near_the_uniform_loss(name):
    """Cross-entropy at initialization close to ln(vocabulary): no word favoured yet. The Transformer decoder's
    head is tied to its embedding, whose N(0, 1) default gave logits of standard deviation √d (a first loss of
    27 nats against ln 24 = 3.2 for test-vit-captioner)."""
    model = _model(name, vocab_size=24, image_size=16)
    images, tgt = _inputs()
    logits = model(images, tgt)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tgt[:, 1:].flatten())
    assert abs(loss.item() - math.log(24)) < 0.5, loss.item()


@pytest.mark.parametrize("name", TEST_PRESETS)
def test_greedy_generation_is_the_argmax_of_each_step(name):
    model = _model(name)
    images, _ = _inputs()
    got = model.generate(images, max_new_tokens=6)
    state, last, rows = model.start(images), torch.full((3,), 1), [torch.full((3,), 1)]
    done = torch.zeros(3, dtype=torch.bool)
    for _ in range(6):
        logits, state, _ = model.step(last, state)
        logits[:, [0, 1]] = float("-inf")  # the search never emits pad or bos
        last = torch.where(done, torch.zeros_like(last), logits.argmax(-1))
        rows.append(last)
        done |= last == 2
        if done.all():
            break
    torch.testing.assert_close(got, torch.stack(rows, 1))


@pytest.mark.parametrize("name", TEST_PRESETS)
def test_batched_beam_search_equals_one_image_at_a_time(name):
    model = _model(name)
    images, _ = _inputs(b=4)
    soft = model.config.attention == "soft"
    out = model.generate(images, max_new_tokens=6, beam_size=3, return_attention=soft)
    tokens = out[0] if soft else out
    for i in range(4):
        one = model.generate(images[i : i + 1], max_new_tokens=6, beam_size=3, return_attention=soft)
        one_tokens = one[0] if soft else one
        n = one_tokens.size(1)
        assert torch.equal(tokens[i, :n], one_tokens[0])
        assert (tokens[i, n:] == 0).all()
        if soft:
            torch.testing.assert_close(out[1][i, : n - 1], one[1][0])


def test_generated_attention_rows_are_distributions_until_eos():
    model = _model("test-show-attend-tell")
    images, _ = _inputs()
    tokens, alpha = model.generate(images, max_new_tokens=5, beam_size=2, return_attention=True)
    assert alpha.shape == (3, tokens.size(1) - 1, 16)
    for i in range(3):
        words = tokens[i, 1:]
        real = (words != 0).cumsum(0) == torch.arange(1, words.numel() + 1)  # up to the first pad
        torch.testing.assert_close(alpha[i][real].sum(-1), torch.ones(int(real.sum()), dtype=torch.float64))
        assert (alpha[i][~real] == 0).all()


def test_show_and_tell_has_no_attention_to_return():
    model = _model("test-show-tell")
    images, tgt = _inputs()
    with pytest.raises(ValueError, match="no attention"):
        model(images, tgt, return_attention=True)
    with pytest.raises(ValueError, match="no attention"):
        model.generate(images, return_attention=True)


def test_the_image_reaches_show_and_tell_only_through_its_first_state():
    """Two images give different captions' logits, and the words after the first depend on the image only
    through the recurrent state (the bottleneck): zeroing the image projection makes every image alike."""
    model = _model("test-show-tell")
    images, tgt = _inputs()
    logits = model(images, tgt)
    assert not torch.allclose(logits[0], logits[1])
    with torch.no_grad():
        model.image_proj.weight.zero_()
    same = model(images, tgt[[0, 0, 0]])
    torch.testing.assert_close(same[0], same[1])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m, x, y: m(x[:, :, :8], y), r"expected images \(b, 3, 16, 16\)"),
        (lambda m, x, y: m((x * 100).long(), y), "floats"),
        (lambda m, x, y: m(x, y[:2]), r"tgt_in must be \(b, t\) with b = 3"),
        (lambda m, x, y: m(x, y + 100), "token ids"),
        (lambda m, x, y: m(x[0], y), "expected images"),
    ],
)
def test_bad_inputs_get_clear_errors(call, match):
    model = _model("test-show-attend-tell")
    images, tgt = _inputs()
    with pytest.raises(ValueError, match=match):
        call(model, images, tgt)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"image_size": 20, "channels": [8, 16, 32]}, "divisible by 2\\^3"),
        ({"encoder": "vit", "image_size": 18, "patch_size": 4}, "multiple of patch_size"),
        ({"decoder": "transformer", "attention": "none"}, "cross-attention"),
        ({"pad_id": 1}, "distinct"),
        ({"attention_penalty": -1.0}, "attention_penalty"),
        ({"encoder": "rnn"}, "encoder must be one of"),
    ],
)
def test_config_errors(fields, match):
    with pytest.raises(ValueError, match=match):
        CaptionerConfig(**fields)


def test_transformer_captions_longer_than_its_positions_are_refused():
    model = _model("test-vit-captioner", max_len=6)
    images, tgt = _inputs(t=7)
    with pytest.raises(ValueError, match="max_len=6"):
        model(images, tgt)
