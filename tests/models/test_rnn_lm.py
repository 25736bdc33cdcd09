import dataclasses

import pytest
import torch

from seqlab.models import build, count_parameters, create, list_models
from seqlab.models.generation import generate, sample_next
from seqlab.models.lm import LMConfig


@pytest.mark.parametrize("name", ["test-rnn-lm", "test-lstm-lm", "test-gru-lm"])
def test_step_by_step_equals_forward(name):
    torch.manual_seed(0)
    model = create(name, vocab_size=11).eval()
    x = torch.randint(0, 11, (3, 9))
    full = model(x)
    state, outs = model.init_state(3), []
    for t in range(9):
        y, state = model.step(x[:, t], state)
        outs.append(y)
    torch.testing.assert_close(torch.stack(outs, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["test-rnn-lm", "test-lstm-lm", "test-gru-lm"])
def test_chunked_with_carried_state_equals_whole(name):
    torch.manual_seed(0)
    model = create(name, vocab_size=11).eval()
    x = torch.randint(0, 11, (2, 12))
    whole, s_whole = model(x, return_state=True)
    a, s = model(x[:, :5], return_state=True)
    b, s = model(x[:, 5:], state=s, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), whole, atol=1e-5, rtol=1e-5)
    for u, v in zip(
        s if isinstance(s, tuple) else (s,),
        s_whole if isinstance(s_whole, tuple) else (s_whole,),
        strict=True,
    ):
        torch.testing.assert_close(u, v, atol=1e-5, rtol=1e-5)


def test_causal():
    torch.manual_seed(0)
    model = create("test-lstm-lm", vocab_size=7).eval()
    x = torch.randint(0, 7, (2, 10))
    x2 = x.clone()
    x2[:, 6:] = (x2[:, 6:] + 1) % 7
    torch.testing.assert_close(model(x)[:, :6], model(x2)[:, :6])
    assert not torch.allclose(model(x)[:, 6:], model(x2)[:, 6:])


def test_continuous_inputs_and_outputs():
    model = create("test-gru-lm", d_input=3, d_output=1)
    y = model(torch.randn(4, 6, 3))
    assert y.shape == (4, 6, 1)
    with pytest.raises(ValueError, match="d_input=3"):
        model(torch.randn(4, 6, 2))


def test_token_model_rejects_float_input():
    model = create("test-lstm-lm", vocab_size=5)
    with pytest.raises(ValueError, match="token ids"):
        model(torch.randn(2, 3))


def test_tied_weights_share_one_tensor():
    model = create("test-lstm-lm", vocab_size=9, tie_weights=True)
    assert model.head.weight is model.embed.weight
    assert count_parameters(model) == count_parameters("test-lstm-lm", vocab_size=9) - 9 * 32


def test_config_validation():
    with pytest.raises(ValueError, match="unknown mixer"):
        LMConfig(mixer="transformer")
    with pytest.raises(ValueError, match="dropout"):
        LMConfig(dropout=1.0)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['n_layer'\]"):
        create("test-lstm-lm", n_layer=2)
    with pytest.raises(ValueError, match="stacked layout has no channel MLP"):
        create("test-lstm-lm", d_ff=64)
    with pytest.raises(
        ValueError, match=r"model.tie_weights .* needs token inputs .* got d_input=3, .*: set it false"
    ):
        create("test-lstm-lm", tie_weights=True, d_input=3)
    with pytest.raises(ValueError, match="unknown model"):
        create("no-such-model")


def test_registry_round_trip_and_every_parameter_gets_a_gradient():
    from seqlab.models import PRESETS

    for name in list_models():
        if PRESETS[name][1].get("layout") != "stacked":
            continue  # the char-RNN presets; other layouts have their own conformance tests
        meta = not name.startswith("test-")  # full-size presets are only built on the meta device
        model = create(name, vocab_size=13, device=torch.device("meta") if meta else None)
        assert model.config.vocab_size == 13
        clone = build(model.family, dataclasses.asdict(model.config), device=torch.device("meta"))
        assert clone.config == model.config
        if not meta:
            model(torch.randint(0, 13, (2, 5))).sum().backward()
            for pname, p in model.named_parameters():
                assert p.grad is not None and torch.isfinite(p.grad).all(), pname


def test_list_models_filter():
    assert "lstm-lm-small" in list_models()
    assert all(n.startswith("test-") for n in list_models("test-*"))
    assert list_models("LSTM-*") == list_models("lstm-*") == ["lstm-lm-small"]  # as `seqlab list` matches
    assert count_parameters("lstm-lm-small") > count_parameters("test-lstm-lm")


def test_sample_next_filters():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    assert sample_next(logits, temperature=0).item() == 3
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {2, 3}
    # probabilities ~ [0.03, 0.09, 0.24, 0.64]: top_p=0.7 keeps {3, 2}, top_p=0.5 keeps {3} only
    draws = {sample_next(logits, top_p=0.7, generator=g).item() for _ in range(200)}
    assert draws == {2, 3}
    assert {sample_next(logits, top_p=0.5, generator=g).item() for _ in range(50)} == {3}
    with pytest.raises(ValueError, match="top_p"):
        sample_next(logits, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, temperature=-1)
    for bad in (float("inf"), True, None, "1"):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            sample_next(logits, temperature=bad)
    for bad in (True, "0.9", float("nan")):
        with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\]"):
            sample_next(logits, top_p=bad)
    # no overflow at a tiny temperature: the most likely token, as greedy
    assert sample_next(torch.tensor([[1e3, 2e3, -5e3]]), temperature=1e-40).item() == 1
    for bad in ([[0.0, float("nan")]], [[0.0, float("inf")]], [[float("-inf")] * 2]):
        for t in (0, 1.0):
            with pytest.raises(ValueError, match="the logits hold NaN or \\+inf, or a row is all -inf"):
                sample_next(torch.tensor(bad), temperature=t)
    for bad in (torch.zeros(2, 3, 4), torch.zeros(2, 0), torch.zeros(2, 3, dtype=torch.long), [[0.0, 1.0]]):
        with pytest.raises(ValueError, match=r"expected logits \(b, vocab\) of floats"):
            sample_next(bad, temperature=1.0)


def test_generate_greedy_matches_argmax_rollout():
    torch.manual_seed(0)
    model = create("test-gru-lm", vocab_size=10).eval()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 6, temperature=0)
    assert out.shape == (1, 9) and torch.equal(out[:, :3], prompt)
    ids = prompt
    for _ in range(6):  # greedy continuation recomputed with full forwards, no state
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ids)
    assert generate(model, prompt[0], 2, temperature=0).shape == (5,)
    with pytest.raises(ValueError, match="prompt_ids"):
        model.generate(torch.tensor([[0.5]]), 2)


def test_char_rnn_equals_torch_nn_stacked_lstm():
    """The stacked layout is embedding -> torch.nn.LSTM(num_layers=2) -> linear head, weight for weight."""
    torch.manual_seed(0)
    model = create("test-lstm-lm", vocab_size=11).double().eval()
    embed, head = torch.nn.Embedding(11, 32).double(), torch.nn.Linear(32, 11).double()
    lstm = torch.nn.LSTM(32, 32, num_layers=2, batch_first=True).double()
    state = {"embed.weight": embed.weight, "head.weight": head.weight, "head.bias": head.bias}
    state.update({f"rnn.{k}": v for k, v in lstm.state_dict().items()})  # the 0.1 RNNLM's names
    model.load_state_dict(state)
    x = torch.randint(0, 11, (3, 8))
    ref, (h, c) = lstm(embed(x))
    logits, states = model(x, return_state=True)
    torch.testing.assert_close(logits, head(ref), rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat([s[0] for s in states]), h, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat([s[1] for s in states]), c, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mixer", ["rnn", "gru", "lstm"])
def test_training_goes_on_after_generate(mixer):
    """generate runs under torch.inference_mode; the recurrent kernels' kept scratch must stay writable by the
    training steps after it (sampling text between steps is common)."""
    torch.manual_seed(0)
    model = create(f"test-lm-{mixer}", vocab_size=20)
    ids = torch.randint(0, 20, (2, 7))
    model(ids).sum().backward()
    model.generate(torch.randint(0, 20, (8, 40)), 3, temperature=0)  # a larger scratch than the step's
    model(ids).sum().backward()
    with torch.no_grad():
        model(ids)
    assert all(p.grad is not None for p in model.parameters())
