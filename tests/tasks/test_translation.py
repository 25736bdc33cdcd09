"""The translation task: batches, the loss, tokenizers saved with checkpoints, sacrebleu scores, bad input."""

from __future__ import annotations

import pytest
import torch

from seqlab.models import create
from seqlab.tasks import create_task
from seqlab.tasks.tokenizers import TranslationTokenizer, tokenizer_from_json
from seqlab.tasks.translation import BOS, EOS, PAD, translate

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sees",
    "eats",
    "big",
    "small",
    "red",
    "house",
    "tree",
    "runs",
    "sleeps",
    "under",
    "over",
]
SPANISH = [
    "el",
    "un",
    "gato",
    "perro",
    "ve",
    "come",
    "grande",
    "pequeño",
    "rojo",
    "casa",
    "árbol",
    "corre",
    "duerme",
    "bajo",
    "sobre",
]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    """A toy word-for-word 'language' of 600 sentences: enough to train the BPE and fill every split."""
    g = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(600):
        idx = torch.randint(
            0, len(WORDS), (int(torch.randint(2, 9, (1,), generator=g)),), generator=g
        ).tolist()
        lines.append(" ".join(WORDS[i] for i in idx) + "\t" + " ".join(SPANISH[i] for i in idx))
    path = tmp_path_factory.mktemp("pairs") / "toy.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def task(pairs_file):
    return create_task("translation", source=str(pairs_file), vocab_size=300, batch_size=16, max_len=24)


def test_batches_are_shifted_padded_and_reproducible(task, pairs_file):
    b = task.get_batch("train", 3)
    assert b["x"].shape[0] == 16 and b["tgt_in"].shape == b["y"].shape
    assert bool((b["tgt_in"][:, 0] == BOS).all())
    words = (b["y"][:, :-1] != PAD) & (b["y"][:, :-1] != EOS)  # the decoder reads y shifted right by one
    torch.testing.assert_close(b["tgt_in"][:, 1:][words], b["y"][:, :-1][words])
    lengths = (b["y"] != PAD).sum(1)
    assert bool((b["y"][torch.arange(16), lengths - 1] == EOS).all())  # every target ends in </s>
    assert bool((b["x"][torch.arange(16), (b["x"] != PAD).sum(1) - 1] == EOS).all())
    again = create_task("translation", source=str(pairs_file), vocab_size=300, batch_size=16, max_len=24)
    for split, index in [("train", 3), ("train", 400), ("val", 0), ("test", 1)]:
        for key, value in task.get_batch(split, index).items():
            torch.testing.assert_close(value, again.get_batch(split, index)[key])


def test_an_epoch_visits_every_training_pair_once(task):
    per = task.batches_per_epoch()
    seen = sorted(i for k in range(per) for i in task._epoch(0)[k])
    assert seen == list(range(task.train_pairs))
    assert task.train_pairs + task.val_pairs + task.test_pairs + task.dropped_long == 600


def test_loss_metrics_and_overrides(task):
    model = create("test-seq2seq", **task.model_overrides())
    loss, metrics, state = task.loss(model, task.get_batch("train", 0))
    assert state is None and loss.requires_grad
    assert set(metrics) == {"loss", "nll", "ppl", "acc"}
    assert abs(metrics["nll"] - torch.log(torch.tensor(float(task.source_vocab_size))).item()) < 1.0
    assert task.evaluate(model, 2, split="test").keys() == {"test_loss", "test_nll", "test_ppl", "test_acc"}
    tf = create("test-transformer", **task.model_overrides())  # the Transformer speaks the same convention
    assert task.loss(tf, task.get_batch("val", 0))[0].isfinite()


def test_a_tiny_model_learns_to_translate_the_toy_language(task):
    """A golden run: word-for-word translation is learnt to a BLEU far above chance in a few hundred steps."""
    torch.manual_seed(0)
    model = create("test-seq2seq", d_model=32, **task.model_overrides())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(300):
        loss, _, _ = task.loss(model, task.get_batch("train", step))
        loss.backward()
        opt.step()
        opt.zero_grad()
    scores = task.score(model.eval(), "test", beam_size=3)
    assert scores["bleu"] > 50, scores["hypotheses"][:3]
    assert scores["signature"].startswith("nrefs:1")


def test_tokenizer_round_trips_through_json(task):
    tok = tokenizer_from_json(task.tokenizer.to_json())
    assert isinstance(tok, TranslationTokenizer) and tok.shared
    assert [tok.source.token_to_id(s) for s in TranslationTokenizer.SPECIALS] == [PAD, BOS, EOS]
    assert tok.target.decode(tok.target.encode("el gato grande")) == "el gato grande"


def test_separate_vocabularies(pairs_file):
    t = create_task("translation", source=str(pairs_file), vocab_size=300, shared_vocab=False, max_len=24)
    tok = tokenizer_from_json(t.tokenizer.to_json())
    assert not tok.shared and t.model_overrides()["tgt_vocab_size"] == t.target_vocab_size
    model = create("test-seq2seq", **t.model_overrides())
    out = translate(model, tok, ["the cat", "a big red house"], beam_size=2, max_new_tokens=5)
    assert len(out) == 2 and all(isinstance(s, str) for s in out)


def test_translate_returns_alignments_with_token_labels(task):
    model = create("test-seq2seq", **task.model_overrides())
    (_line,), ((source, target, weights),) = translate(
        model, task.tokenizer, ["the cat sees the dog"], beam_size=2, max_new_tokens=6, return_attention=True
    )
    assert weights.shape == (len(target), len(source)) and source[-1] == "</s>"
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(target)))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"source": "bible", "src_lang": "fr"}, "fr"),
        ({"source": "klingon.xml"}, "unknown translation source"),
        ({"vocab_size": 10}, "vocab_size"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"max_len": 1}, "max_len"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"vocab_size": 10**9}, "vocab_size must be at most 1,000,000"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        create_task("translation", **kwargs)


def test_too_long_source_for_the_model(task):
    model = create("test-seq2seq", max_src_len=4, **task.model_overrides())
    with pytest.raises(ValueError, match="at most max_src_len=4"):
        translate(model, task.tokenizer, ["the cat sees the big red dog under the tree"])


def test_a_file_whose_pairs_all_land_outside_training_is_refused(tmp_path):
    path = tmp_path / "same.tsv"
    path.write_text("a\tb\n" * 50, encoding="utf-8")
    with pytest.raises(ValueError, match=r"training split .* is empty"):
        create_task("translation", source=str(path))


def test_too_long_source_for_the_transformer(task):
    model = create("test-transformer", max_seq_len=6, **task.model_overrides())
    with pytest.raises(
        ValueError, match=r"the source has .* tokens; this model accepts at most max_seq_len=6"
    ):
        translate(model, task.tokenizer, ["the cat", "the cat sees the big red dog under the tree"])


def test_the_loss_is_torchs_smoothed_cross_entropy_from_one_log_softmax():
    """smoothed_cross_entropy against F.cross_entropy(ignore_index=PAD, label_smoothing=ε): value, gradient and the
    plain NLL beside it, pads among the targets."""
    import torch.nn.functional as F

    from seqlab.tasks.translation import PAD, smoothed_cross_entropy

    g = torch.Generator().manual_seed(0)
    for eps in (0.0, 0.1, 0.3):
        x = torch.randn(40, 25, generator=g, dtype=torch.float64, requires_grad=True)
        t = torch.randint(0, 25, (40,), generator=g)
        t[::6] = PAD
        loss, nll = smoothed_cross_entropy(x, t, eps)
        want = F.cross_entropy(x, t, ignore_index=PAD, label_smoothing=eps)
        torch.testing.assert_close(loss, want, atol=1e-12, rtol=0)
        torch.testing.assert_close(
            torch.autograd.grad(loss, x)[0], torch.autograd.grad(want, x)[0], atol=1e-12, rtol=0
        )
        assert abs(nll - F.cross_entropy(x, t, ignore_index=PAD).item()) < 1e-12
