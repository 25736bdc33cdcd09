"""The mixer backbone: the DESIGN laws at model level, for every registered mixer."""

import re

import pytest
import torch

from seqlab.layers import list_mixers
from seqlab.layers.attention import KVCache
from seqlab.models import create
from seqlab.models.lm import LM, LMConfig

TEST_PRESETS = {
    "lstm": "test-lm-lstm",
    "gru": "test-lm-gru",
    "rnn": "test-lm-rnn",
    "attention": "test-lm-attention",
    "linear-attention": "test-lm-linear-attention",
    "s4d": "test-s4d",
    "mamba": "test-mamba",
}


def _states_close(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    elif isinstance(a, KVCache):  # the values, not where they are stored (a preallocated buffer or not)
        assert isinstance(b, KVCache)
        _states_close((a.k, a.v, a.pos), (b.k, b.v, b.pos))
    else:
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _states_close(u, v)


@pytest.mark.parametrize("mixer", sorted(TEST_PRESETS))
def test_step_equals_forward_and_chunked_equals_whole(mixer):
    torch.manual_seed(0)
    model = create(TEST_PRESETS[mixer], vocab_size=13).eval()
    x = torch.randint(0, 13, (2, 11))
    full, s_full = model(x, return_state=True)
    state, outs = model.init_state(2), []
    for t in range(11):
        y, state = model.step(x[:, t], state)
        outs.append(y)
    torch.testing.assert_close(torch.stack(outs, 1), full, atol=1e-5, rtol=1e-5)
    _states_close(state, s_full)
    a, s = model(x[:, :4], return_state=True)
    b, s = model(x[:, 4:], state=s, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mixer", sorted(TEST_PRESETS))
def test_causal_and_every_parameter_learns(mixer):
    torch.manual_seed(0)
    model = create(TEST_PRESETS[mixer], vocab_size=7)
    x = torch.randint(0, 7, (2, 9))
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % 7
    model.eval()
    torch.testing.assert_close(model(x)[:, :5], model(x2)[:, :5])
    model.train()
    model(x).logsumexp(-1).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    out = model.generate(x[:, :3], 5, temperature=0)
    assert out.shape == (2, 8) and torch.equal(out[:, :3], x[:, :3])


def test_weights_are_tied_and_features_work():
    model = create("test-lm-lstm", vocab_size=11)
    assert model.head.weight is model.embed.weight
    reg = create("test-lm-gru", d_input=3, d_output=1)
    assert reg(torch.randn(2, 5, 3)).shape == (2, 5, 1)
    assert reg.head.weight is not getattr(reg.embed, "weight", None)


def test_config_errors():
    with pytest.raises(ValueError, match="unknown mixer"):
        LMConfig(mixer="transformer-xl")
    with pytest.raises(ValueError, match="mlp"):
        LMConfig(mlp="tanh")
    assert {"rnn", "lstm", "gru"} <= set(list_mixers())


@pytest.mark.parametrize("mixer", list_mixers())
def test_every_registered_mixer_builds_a_language_model(mixer):
    """The registry is the only place the LM learns mixers from: each one builds, reads, steps and learns."""
    from seqlab.layers import mixer_spec

    torch.manual_seed(0)
    model = LM(LMConfig(mixer=mixer, vocab_size=9, d_model=16, n_layers=2)).eval()
    assert (model.blocks[0].mlp is not None) == mixer_spec(mixer).channel_mlp
    x = torch.randint(0, 9, (2, 6))
    full = model(x)
    state, outs = model.init_state(2), []
    for t in range(6):
        y, state = model.step(x[:, t], state)
        outs.append(y)
    torch.testing.assert_close(torch.stack(outs, 1), full, atol=1e-5, rtol=1e-5)
    model.train()
    model(x).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_bad_inputs_get_clear_errors_at_the_boundary():
    model = create("test-gpt", vocab_size=11)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 11\).*from 0 to 11"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match="from -1"):
        model.step(torch.tensor([-1]))
    for bad in (torch.tensor([[True, False]]), torch.tensor([[1, 2]], dtype=torch.uint8)):
        with pytest.raises(
            ValueError, match=r"token ids as an int64 \(or int32\) tensor, got torch\.(bool|uint8)"
        ):
            model(bad)
    with pytest.raises(ValueError, match="one entry per layer"):
        model(torch.tensor([[1, 2]]), state=model.init_state(1)[:1])
    with pytest.raises(ValueError, match="top_p"):
        model.generate(torch.tensor([1, 2]), 0, top_p=-0.1)  # checked even when nothing is drawn
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.tensor([1, 2]), 2.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.tensor([1, 2]), None)  # before the decoder is sized from it
    with pytest.raises(ValueError, match=r"prompt_ids must be a non-empty long tensor .* got list"):
        model.generate([1, 2], 3)
    wide = create("test-gpt", vocab_size=11, d_output=12, tie_weights=False)  # a drawn 11 has no embedding
    with pytest.raises(ValueError, match="d_output=12 and vocab_size=11"):
        wide.generate(torch.tensor([1, 2]), 3)
    features = create("test-lm-gru", d_input=3, d_output=1)
    with pytest.raises(ValueError, match=r"dtype torch\.float32"):
        features(torch.randn(2, 4, 3, dtype=torch.float64))


def test_generation_gives_every_module_its_own_mode_back():
    """A part frozen in eval mode (no dropout) stays so after generating; the rest goes back to training."""
    for name, kwargs in [("test-gpt", {"vocab_size": 20}), ("test-lm-gru", {"vocab_size": 20})]:
        model = create(name, **kwargs)
        model.train()
        model.blocks[0].eval()
        model.generate(torch.tensor([[1, 2]]), 3)
        assert model.training and not model.blocks[0].training and model.blocks[1].training, name
    for name in ("test-transformer", "test-seq2seq"):
        model = create(name)
        model.train()
        model.encoder.eval()
        src = torch.randint(4, 20, (2, 5))
        model.generate(src, max_new_tokens=3, beam_size=2)
        model.generate(src, max_new_tokens=3)
        assert not any(m.training for m in model.encoder.modules()), name
        assert all(m.training for n, m in model.named_modules() if not n.startswith("encoder")), name


def test_true_false_fields_take_only_true_or_false():
    """A YAML 'maybe' or a 2 was stored in config.json as given (and read as true)."""
    for fields, message in [
        ({"tie_weights": "maybe"}, "model.tie_weights must be true, false or null, got 'maybe'"),
        ({"bias": 2}, "model.bias must be true or false, got 2"),
        ({"rope": "yes"}, "the attention mixer.rope must be true or false, got 'yes'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            create("test-gpt", **fields)
    assert create("test-gpt", tie_weights=None, bias=False) is not None


@pytest.mark.parametrize("mixer", [m for m in list_mixers() if m != "attention"])
def test_learned_positions_with_a_mixer_whose_state_counts_none_are_refused_before_training(mixer):
    with pytest.raises(
        ValueError, match=rf"position='learned' needs a mixer whose state counts positions .*{mixer}"
    ):
        LMConfig(mixer=mixer, position="learned", vocab_size=16, d_model=16, n_layers=1)
    model = LM(LMConfig(mixer="attention", position="learned", vocab_size=16, d_model=16, n_layers=1))
    assert model.generate(torch.zeros(1, 2, dtype=torch.long), max_new_tokens=3).shape == (1, 5)
