"""The speech model: heads and gradients for every preset, padding invariance for every mixer and front end,
causality (and its absence when bidirectional), bad inputs, and a tiny CTC model that learns to transcribe
without an alignment."""

import pytest
import torch

from seqlab.layers import list_mixers
from seqlab.models import create
from seqlab.models.speech import SpeechConfig, reverse_padded

PRESETS = ["test-speech", "test-speech-ctc", "test-speech-linear", "speech-bilstm"]


def _features(b=3, t=21, m=16, dtype=torch.float32, seed=0):
    return torch.randn(b, t, m, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("name", PRESETS)
def test_heads_shapes_and_every_parameter_gets_a_gradient(name):
    model = create(name, n_mels=16)
    c, x = model.config, _features()
    mask = torch.arange(21)[None, :] < torch.tensor([21, 12, 5])[:, None]
    out = model(x, mask=mask)
    t_out = int(model.output_lengths(torch.tensor(21)))
    assert out.shape == ((3, c.n_outputs) if c.head == "classify" else (3, t_out, c.n_outputs))
    assert model.output_lengths(mask.sum(1)).tolist() == [-(-n // c.subsample) for n in (21, 12, 5)]
    out.float().pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing


@pytest.mark.parametrize("mixer", list_mixers())
@pytest.mark.parametrize(
    "fields",
    [
        {"head": "ctc"},
        {"head": "classify", "pool": "last"},
        {"head": "ctc", "frontend": "linear", "subsample": 3},
        {"head": "ctc", "bidirectional": True},
    ],
)
def test_padding_invariance(mixer, fields):
    """Each utterance of a right-padded batch gets the outputs it gets alone."""
    torch.manual_seed(0)
    model = create("test-speech-ctc", mixer=mixer, **fields).double().eval()
    x, lengths = _features(dtype=torch.float64), [21, 13, 6]
    x = x * (torch.arange(21)[None, :, None] < torch.tensor(lengths)[:, None, None])  # zeros after the end
    x[1, 13:] = 5.0  # padding holds anything: the mask must hide it
    x[2, 6:10], x[2, 10:] = float("-inf"), float("nan")  # even -inf (the log-mel of zero power) or NaN
    mask = torch.arange(21)[None, :] < torch.tensor(lengths)[:, None]
    batch = model(x, mask=mask)
    for i, n in enumerate(lengths):
        alone = model(x[i : i + 1, :n])[0]
        got = batch[i, : alone.size(0)] if model.config.head == "ctc" else batch[i]
        torch.testing.assert_close(got, alone, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mixer", ["lstm", "attention", "mamba"])
def test_causal_up_to_the_front_ends_look_ahead(mixer):
    """kernel 3, stride 2, then kernel 3: output frame j reads input frames up to 2 j + 3."""
    torch.manual_seed(0)
    model = create("test-speech-ctc", mixer=mixer).double().eval()
    x = _features(b=1, dtype=torch.float64)
    y = x.clone()
    y[:, 12:] += 1.0
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-12)  # 2 * 4 + 3 < 12
    assert not torch.allclose(a[:, 5:], b[:, 5:])
    bi = create("test-speech-ctc", mixer=mixer, bidirectional=True).double().eval()
    assert not torch.allclose(bi(x)[:, :5], bi(y)[:, :5])  # the backward stack hears the future


def test_reverse_padded_reverses_within_each_length_and_is_an_involution():
    x = torch.arange(10.0).view(2, 5, 1)
    lengths = torch.tensor([5, 3])
    r = reverse_padded(x, lengths)
    assert r[:, :, 0].tolist() == [[4, 3, 2, 1, 0], [7, 6, 5, 8, 9]]
    assert torch.equal(reverse_padded(r, lengths), x)


def test_bad_inputs_and_configs():
    model = create("test-speech-ctc")
    with pytest.raises(ValueError, match=r"n_mels=16"):
        model(torch.randn(2, 10, 40))
    with pytest.raises(ValueError, match="as floats"):
        model(torch.zeros(2, 10, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="mask must be bool"):
        model(torch.randn(2, 10, 16), mask=torch.ones(2, 9, dtype=torch.bool))
    holey = torch.ones(2, 10, dtype=torch.bool)
    holey[1, 3] = False  # a real frame after padding would be dropped without a word
    with pytest.raises(ValueError, match=r"right-padded .* row 1 has a real position at 4 after padding"):
        model(torch.randn(2, 10, 16), mask=holey)
    with pytest.raises(
        ValueError, match=r"SpeechModel has torch.float32 parameters but x \(the features\) is torch.float64"
    ):
        model(torch.randn(2, 10, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="odd"):
        SpeechConfig(kernel_size=4)
    with pytest.raises(ValueError, match="pool='mean'"):
        SpeechConfig(head="classify", pool="last", bidirectional=True)
    with pytest.raises(ValueError, match="head must be one of"):
        SpeechConfig(head="seq2seq")


def _toy_utterances(n: int, g: torch.Generator):
    """Labels of 1-3 tokens from {1, 2, 3}; each token a few frames of its own mel pattern, with noise and
    pauses of random length: an alignment the model is never told."""
    patterns = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)) * 2  # the same language always
    xs, ys = [], []
    for _ in range(n):
        label = torch.randint(1, 4, (int(torch.randint(1, 4, (), generator=g)),), generator=g)
        frames = []
        for tok in label.tolist():
            frames += [patterns[0]] * int(torch.randint(1, 4, (), generator=g))
            frames += [patterns[tok]] * int(torch.randint(3, 6, (), generator=g))
        frames += [patterns[0]] * 2
        xs.append(torch.stack(frames) + 0.3 * torch.randn(len(frames), 16, generator=g))
        ys.append(label)
    return xs, ys


def test_a_tiny_ctc_model_learns_to_transcribe_without_alignments():
    from seqlab.tasks.speech_decode import greedy_decode

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = create("test-speech-ctc", mixer="gru", n_outputs=4, d_model=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(100):
        xs, ys = _toy_utterances(16, g)
        x = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)
        mask = torch.arange(x.size(1))[None, :] < torch.tensor([len(s) for s in xs])[:, None]
        log_probs = model(x, mask=mask).log_softmax(-1)
        loss = torch.nn.functional.ctc_loss(
            log_probs.transpose(0, 1),
            torch.nn.utils.rnn.pad_sequence(ys, batch_first=True),
            model.output_lengths(mask.sum(1)),
            torch.tensor([len(y) for y in ys]),
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    xs, ys = _toy_utterances(32, torch.Generator().manual_seed(99))
    x = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)
    mask = torch.arange(x.size(1))[None, :] < torch.tensor([len(s) for s in xs])[:, None]
    with torch.no_grad():
        hyps = greedy_decode(model(x, mask=mask).log_softmax(-1), model.output_lengths(mask.sum(1)))
    exact = sum(h == y.tolist() for h, y in zip(hyps, ys, strict=True)) / len(ys)
    assert exact >= 0.9, exact
