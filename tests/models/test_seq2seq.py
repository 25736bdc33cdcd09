"""The RNN encoder–decoders: teacher-forced forward equals the step loop, the padding law for the whole model,
zero attention on padding, every parameter learns, configs and inputs are checked at the boundary."""

from __future__ import annotations

import pytest
import torch

from seqlab.models import count_parameters, create
from seqlab.models.seq2seq import Seq2Seq, Seq2SeqConfig, reverse_padded

VARIANTS = [
    {"attention": "none"},
    {"attention": "bahdanau"},
    {
        "attention": "bahdanau",
        "cell": "lstm",
        "n_decoder_layers": 2,
        "encoder": "lstm",
        "n_encoder_layers": 2,
    },
    {"attention": "luong", "score": "dot"},
    {"attention": "luong", "score": "general", "input_feeding": False},
    {"attention": "luong", "score": "concat", "cell": "lstm", "n_decoder_layers": 2},
    {"attention": "bahdanau", "encoder": "mamba", "n_encoder_layers": 2},
    {"attention": "luong", "encoder": "attention", "n_encoder_layers": 2, "encoder_config": {"n_heads": 2}},
    {"attention": "bahdanau", "encoder": "rnn", "bidirectional": False},
]


def _model(**fields) -> Seq2Seq:
    torch.manual_seed(0)
    config = Seq2SeqConfig(vocab_size=30, d_model=16, d_embed=12, dropout=0.0, **fields)
    return Seq2Seq(config, dtype=torch.float64).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 30, (3, 7), generator=g)
    src[1, 5:] = 0  # right padding (pad_id 0)
    src[2, 2:] = 0
    return src, torch.randint(3, 30, (3, 6), generator=g)


@pytest.mark.parametrize("fields", VARIANTS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_step_loop_equals_teacher_forcing(fields):
    model = _model(**fields)
    src, tgt = _batch()
    logits, weights = model(src, tgt, return_attention=True)
    state, steps, alphas = model.start(src), [], []
    for i in range(tgt.size(1)):
        out, state, w = model.step(tgt[:, i], state)
        steps.append(out)
        alphas.append(w)
    torch.testing.assert_close(torch.stack(steps, 1), logits, rtol=0, atol=1e-12)
    if fields["attention"] == "none":
        assert weights is None and alphas[0] is None
    else:
        torch.testing.assert_close(torch.stack(alphas, 1), weights, rtol=0, atol=1e-12)
        pad = (src == 0)[:, None, :].expand_as(weights)
        assert bool((weights[pad] == 0).all())  # padded source positions: exactly zero attention
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 6, dtype=torch.float64))


@pytest.mark.parametrize("fields", VARIANTS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_padding_law_for_the_whole_model(fields):
    """A sentence in a padded batch gets the logits it gets alone, whatever fills the padding."""
    model = _model(**fields)
    src, tgt = _batch()
    batched = model(src, tgt)
    for row, length in enumerate([7, 5, 2]):
        alone = model(src[row : row + 1, :length], tgt[row : row + 1])
        torch.testing.assert_close(batched[row : row + 1], alone, rtol=0, atol=1e-10)
    noisy = src.clone()
    noisy[src == 0] = 17  # other tokens under the mask
    torch.testing.assert_close(model(noisy, tgt, src_mask=src != 0), batched, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fields", VARIANTS[:6], ids=lambda f: "-".join(str(v) for v in f.values()))
def test_every_parameter_gets_a_finite_gradient(fields):
    model = _model(**fields).train()
    src, tgt = _batch()
    model(src, tgt).logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "src_embed" not in n)


def test_reverse_padded_reverses_each_row_within_its_length():
    x = torch.arange(12).view(2, 6, 1)
    out = reverse_padded(x, torch.tensor([6, 3]))
    assert out[0, :, 0].tolist() == [5, 4, 3, 2, 1, 0]
    assert out[1, :, 0].tolist() == [8, 7, 6, 9, 10, 11]
    torch.testing.assert_close(reverse_padded(out, torch.tensor([6, 3])), x)


def test_presets_build_and_count():
    for name in ("seq2seq-gru", "seq2seq-gru-bahdanau", "seq2seq-lstm-luong", "seq2seq-mamba-bahdanau"):
        assert count_parameters(name, vocab_size=1000) > 0
    model = create("test-seq2seq")
    src = torch.randint(3, 64, (2, 5))
    assert model(src, torch.randint(3, 64, (2, 4))).shape == (2, 4, 64)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"attention": "cross"}, "attention"),
        ({"attention": "luong", "score": "bilinear"}, "score"),
        ({"attention": "bahdanau", "score": "dot"}, "belong to attention='luong'"),
        ({"attention": "none", "input_feeding": False}, "belong to attention='luong'"),
        ({"encoder": "transformer-xl"}, "transformer-xl"),
        ({"encoder": "attention"}, "one block never sees later tokens"),  # bidirectional, one block
        ({"d_model": 15}, "odd"),
        ({"encoder": "gru", "encoder_config": {"n_heads": 2}}, "encoder_config"),
        ({"pad_id": 1}, "distinct"),
        ({"d_model": 0}, "d_model"),
        ({"dropout": 1.5}, "dropout"),
    ],
)
def test_config_errors(fields, message):
    with pytest.raises(ValueError, match=message):
        Seq2SeqConfig(vocab_size=30, **fields)


def test_input_errors_name_what_was_expected():
    model = create("test-seq2seq", max_src_len=8)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 64\)"):
        model(torch.tensor([[3, 64]]), torch.tensor([[1, 4]]))
    with pytest.raises(ValueError, match="max_src_len=8"):
        model(torch.randint(3, 64, (1, 9)), torch.tensor([[1, 4]]))
    with pytest.raises(ValueError, match="right-padded"):
        model(torch.tensor([[0, 5, 6]]), torch.tensor([[1, 4]]))
    with pytest.raises(ValueError, match="tgt_in"):
        model(torch.tensor([[5, 6]]), torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="src must be token ids"):
        model(torch.tensor([5, 6]), torch.tensor([[1, 4]]))


@pytest.mark.parametrize("fields", VARIANTS[:6], ids=lambda f: "-".join(str(v) for v in f.values()))
@pytest.mark.parametrize("beam", [1, 3])
def test_generate_batched_equals_one_sentence_at_a_time(fields, beam):
    """Beam search drops finished sentences from the batch and keeps per-sentence tensors across beams: the
    result of each sentence must be what it gets alone."""
    model = _model(**fields)
    src, _ = _batch()
    weights = fields["attention"] != "none"

    def generate(s):
        out = model.generate(s, max_new_tokens=6, beam_size=beam, return_attention=weights)
        return out if weights else (out, None)

    ids, attn = generate(src)
    for row, length in enumerate([7, 5, 2]):
        alone, w = generate(src[row : row + 1, :length])
        n = alone.size(1)
        assert torch.equal(ids[row, :n], alone[0]) and bool((ids[row, n:] == 0).all())
        if weights:
            torch.testing.assert_close(attn[row, : n - 1, :length], w[0], rtol=0, atol=1e-12)


def test_steps_and_empty_targets_are_refused_by_name():
    """Seq2Seq and the captioners: a step's tokens must be (b,) ids for the state's batch, a target t >= 1."""
    torch.manual_seed(0)
    s2s = create("test-seq2seq").eval()
    src = torch.randint(4, 20, (2, 5))
    state = s2s.start(src)
    for bad in (torch.tensor([4, 4, 4]), torch.tensor([[4], [4]])):
        with pytest.raises(ValueError, match=r"Seq2Seq\.step expects one token id per row, \(2,\)"):
            s2s.step(bad, state)
    with pytest.raises(ValueError, match=r"and t >= 1, got \(2, 0\)"):
        s2s(src, src[:, :0])
    for name in ("test-show-attend-tell", "test-vit-captioner"):
        cap = create(name).eval()
        cs = cap.start(torch.rand(2, 3, 16, 16))
        with pytest.raises(ValueError, match=r"Captioner\.step expects one token id per row, \(2,\)"):
            cap.step(torch.tensor([1, 1, 1]), cs)
        with pytest.raises(ValueError, match=r"token ids must be in \[0, 24\)"):
            cap.step(torch.tensor([1, 99]), cs)
        with pytest.raises(ValueError, match=r"token ids as an int64 \(or int32\) tensor"):
            cap.step(torch.tensor([1.0, 2.0]), cs)
        with pytest.raises(ValueError, match=r"t >= 1, got \(2, 0\)"):
            cap.decode(cs, torch.zeros(2, 0, dtype=torch.long))


def test_generate_checks_its_inputs_before_reading_them():
    from seqlab.layers.transformer_blocks import TransformerDecoderLayer

    with pytest.raises(ValueError, match="src must be token ids of shape"):
        create("test-seq2seq").generate([[3, 4]])
    with pytest.raises(ValueError, match=r"expected images \(b, c, S, S\) as a tensor .* got list"):
        create("test-show-attend-tell").generate([[1]])
    src = torch.randint(4, 20, (2, 5))
    for model in (create("test-transformer"), create("test-seq2seq")):
        with pytest.raises(ValueError, match=r"max_len must be a number >= 0 .* got None"):
            model.generate(src, max_new_tokens=None)
    dec = TransformerDecoderLayer(16, 2)
    with pytest.raises(ValueError, match=r"state must be a pair .* got KVCache"):
        dec(torch.randn(2, 3, 16), torch.randn(2, 4, 16), state=dec.self_attn.init_state(2))
