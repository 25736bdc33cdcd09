"""Selective copy, multi-query associative recall and induction heads: layout, causality, baselines, loss."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from seqlab.tasks import create_task, list_tasks
from seqlab.tasks.probes import IGNORE_INDEX, AssociativeRecallTask, InductionHeadsTask, SelectiveCopyTask

# ---- stand-in models following the call protocol: out = model(x) ------------------------------------------


class PrefixOracle(nn.Module):
    """Causal by construction: the output at position s is computed from x[:, : s + 1] alone.

    ``answer(row_prefix) -> int`` is the rule a perfect model would apply; the output is a confident one-hot.
    """

    def __init__(self, answer, vocab_size: int):
        super().__init__()
        self.answer, self.vocab_size = answer, vocab_size

    def forward(self, x):
        b, t = x.shape
        answers = torch.tensor([[self.answer(x[i, : s + 1].tolist()) for s in range(t)] for i in range(b)])
        return 50.0 * nn.functional.one_hot(answers, self.vocab_size).float()  # (b, t, v)


def recall_after_first_occurrence(prefix: list[int]) -> int:
    """The token that followed the first earlier occurrence of the current token (0 if there is none).

    This one rule answers both associative recall (the current token is a query key) and induction heads
    (the current token is the trigger).
    """
    current = prefix[-1]
    for i, token in enumerate(prefix[:-1]):
        if token == current:
            return prefix[i + 1]
    return 0


def selective_copy_answer(task: SelectiveCopyTask):
    def answer(prefix: list[int]) -> int:
        if task.delimiter not in prefix:
            return 0
        d = prefix.index(task.delimiter)
        written = len(prefix) - 1 - d  # placeholders seen so far, this one included
        symbols = [token for token in prefix[:d] if token != task.blank]
        return symbols[written - 1] if 1 <= written <= len(symbols) else 0

    return answer


class UniformOver(nn.Module):
    """Equal logits on ``allowed`` tokens, effectively zero probability elsewhere: the chance predictor."""

    def __init__(self, vocab_size: int, allowed: range):
        super().__init__()
        self.logits = torch.full((vocab_size,), -1e4)
        self.logits[list(allowed)] = 0.0

    def forward(self, x):
        return self.logits.expand(*x.shape, -1).clone()


class EmbeddingLinear(nn.Module):
    def __init__(self, vocab_size: int, d_model: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, x):
        return self.head(self.embed(x))


def answer_positions(y):
    return [(row != IGNORE_INDEX).nonzero().flatten().tolist() for row in y]


# ---- selective copy --------------------------------------------------------------------------------------


def test_selective_copy_shapes_and_overrides():
    task = SelectiveCopyTask(seq_len=20, n_tokens=4, n_symbols=5, batch_size=6)
    batch = task.get_batch("train", 0)
    assert batch["x"].shape == batch["y"].shape == (6, 25)
    assert batch["x"].dtype == batch["y"].dtype == torch.long
    assert task.model_overrides() == {"vocab_size": 7}
    assert (task.blank, task.delimiter, task.vocab_size, task.total_len, task.max_seq_len) == (
        0,
        6,
        7,
        25,
        25,
    )
    assert task.name == "selective_copy" and not task.stateful


@settings(max_examples=25, deadline=None)
@given(
    seq_len=st.integers(1, 30),
    n_tokens=st.integers(1, 8),
    n_symbols=st.integers(1, 10),
    index=st.integers(0, 10_000),
    split=st.sampled_from(["train", "val", "test"]),
)
def test_selective_copy_layout(seq_len, n_tokens, n_symbols, index, split):
    n_tokens = min(n_tokens, seq_len)
    task = SelectiveCopyTask(seq_len=seq_len, n_tokens=n_tokens, n_symbols=n_symbols, batch_size=3)
    x, y = task.get_batch(split, index).values()
    L, k = seq_len, n_tokens
    region = x[:, :L]
    assert (x[:, L] == task.delimiter).all() and (x == task.delimiter).sum(dim=1).eq(1).all()
    assert (x[:, L + 1 :] == task.blank).all()  # placeholders
    assert ((region >= 0) & (region <= n_symbols)).all()
    assert (region != task.blank).sum(dim=1).eq(k).all()  # exactly k symbols in the region
    assert (y[:, : L + 1] == IGNORE_INDEX).all()
    for row_x, row_y in zip(x, y, strict=True):
        symbols = row_x[:L][row_x[:L] != task.blank]  # read in order, independently of the generator
        assert torch.equal(row_y[L + 1 :], symbols)
        # Causality: every symbol sits strictly before every answer position.
        assert row_x[:L].nonzero().max() < L + 1


def test_selective_copy_positions_vary_and_cover_the_region():
    task = SelectiveCopyTask(seq_len=10, n_tokens=2, n_symbols=3, batch_size=3000)
    region = task.get_batch("train", 0)["x"][:, :10]
    occupied = (region != 0).float()  # (b, L)
    assert len({tuple(row.nonzero().flatten().tolist()) for row in occupied}) == math.comb(10, 2)
    assert (occupied.mean(dim=0) - 0.2).abs().max() < 0.03  # each position holds a symbol with p = k / L
    counts = torch.bincount(region[region != 0], minlength=4)[1:].float()
    assert (counts / counts.sum() - 1 / 3).abs().max() < 0.03


def test_selective_copy_is_deterministic_and_splits_differ():
    a, b = SelectiveCopyTask(seed=5), SelectiveCopyTask(seed=5)
    assert torch.equal(a.get_batch("val", 3)["x"], b.get_batch("val", 3)["x"])
    assert not torch.equal(a.get_batch("train", 3)["x"], a.get_batch("val", 3)["x"])
    assert not torch.equal(a.get_batch("train", 3)["x"], a.get_batch("train", 4)["x"])
    assert not torch.equal(a.get_batch("train", 3)["x"], SelectiveCopyTask(seed=6).get_batch("train", 3)["x"])


def test_selective_copy_causal_oracle_is_perfect_and_only_answers_are_scored():
    task = SelectiveCopyTask(seq_len=12, n_tokens=3, n_symbols=4, batch_size=5)
    oracle = PrefixOracle(selective_copy_answer(task), task.vocab_size)
    _, metrics, state = task.loss(oracle, task.get_batch("train", 0))
    assert state is None
    # The oracle writes blanks (wrong targets) outside the answer positions: a near-zero loss shows those
    # positions are not scored.
    assert metrics["accuracy"] == 1.0 and metrics["loss"] < 1e-6
    result = task.evaluate(oracle, max_batches=2)
    assert set(result) == {"val_loss", "val_accuracy"} and result["val_accuracy"] == 1.0


def test_selective_copy_uniform_guess_scores_the_baseline():
    task = SelectiveCopyTask(seq_len=16, n_tokens=4, n_symbols=6, batch_size=8)
    model = UniformOver(task.vocab_size, range(1, 7))
    _, metrics, _ = task.loss(model, task.get_batch("train", 0))
    assert metrics["loss"] == pytest.approx(task.baseline_loss, rel=1e-5)
    assert task.baseline_loss == pytest.approx(math.log(6))


def test_selective_copy_fixed_positions_reader_fails():
    # Reading the symbols as if they sat at fixed positions (the copy task's layout) does not solve it:
    # the point of the probe is that the positions move.
    task = SelectiveCopyTask(seq_len=32, n_tokens=4, n_symbols=8, batch_size=64)

    def fixed_reader(prefix):
        written = len(prefix) - 1 - 32
        return prefix[written - 1] if 1 <= written <= 4 else 0

    _, metrics, _ = task.loss(PrefixOracle(fixed_reader, task.vocab_size), task.get_batch("val", 0))
    assert metrics["accuracy"] < 0.3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 0}, "seq_len must be an integer >= 1, got 0"),
        ({"n_tokens": 0}, "n_tokens must be an integer >= 1, got 0"),
        ({"n_symbols": 2.0}, "n_symbols must be an integer >= 1, got 2.0"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"seq_len": 4, "n_tokens": 5}, "n_tokens=5 symbols need distinct positions.*seq_len=4"),
    ],
)
def test_selective_copy_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SelectiveCopyTask(**kwargs)


# ---- multi-query associative recall ----------------------------------------------------------------------


def test_associative_recall_shapes_and_vocabulary():
    task = AssociativeRecallTask(n_pairs=4, n_queries=3, vocab_size=21, seq_len=12, batch_size=5)
    x, y = task.get_batch("train", 0).values()
    assert x.shape == y.shape == (5, 15) and x.dtype == y.dtype == torch.long
    assert (task.n_keys, task.n_values, task.total_len, task.max_seq_len) == (10, 11, 15, 15)
    assert task.model_overrides() == {"vocab_size": 21}
    assert task.baseline_loss == pytest.approx(math.log(11))


@settings(max_examples=25, deadline=None)
@given(
    n_pairs=st.integers(1, 6),
    n_queries=st.integers(1, 6),
    extra_keys=st.integers(0, 5),
    odd_vocab=st.booleans(),
    padding=st.integers(0, 10),
    index=st.integers(0, 10_000),
)
def test_associative_recall_layout(n_pairs, n_queries, extra_keys, odd_vocab, padding, index):
    n_queries = min(n_queries, n_pairs)
    n_keys = n_pairs + extra_keys
    n_values = n_keys + odd_vocab  # keys are the lower floor(V / 2) tokens, values the rest
    task = AssociativeRecallTask(
        n_pairs=n_pairs,
        n_queries=n_queries,
        vocab_size=n_keys + n_values,
        seq_len=2 * n_pairs + padding,
        batch_size=3,
    )
    assert (task.n_keys, task.n_values) == (n_keys, n_values)
    x, y = task.get_batch("train", index).values()
    L = task.seq_len
    is_key = x < n_keys
    for row_x, row_y, row_key in zip(x, y, is_key, strict=True):
        keys, values = row_x[0 : 2 * n_pairs : 2], row_x[1 : 2 * n_pairs : 2]
        assert row_key[0 : 2 * n_pairs : 2].all() and not row_key[1 : 2 * n_pairs : 2].any()
        assert len(set(keys.tolist())) == n_pairs  # distinct keys
        assert not row_key[2 * n_pairs : L].any()  # noise comes from the value range
        queries = row_x[L:]
        assert len(set(queries.tolist())) == n_queries and set(queries.tolist()) <= set(keys.tolist())
        assert answer_positions([row_y])[0] == list(range(L, L + n_queries))
        lookup = dict(zip(keys.tolist(), values.tolist(), strict=True))
        assert row_y[L:].tolist() == [lookup[k] for k in queries.tolist()]
        # Causality: the pair that answers a query ends before the query position.
        for position, key in zip(range(L, L + n_queries), queries.tolist(), strict=True):
            assert (row_x[:position] == key).nonzero().max() + 1 < position


def test_associative_recall_queries_are_shuffled_and_values_uniform():
    task = AssociativeRecallTask(n_pairs=4, n_queries=4, vocab_size=16, seq_len=8, batch_size=2000)
    x = task.get_batch("train", 0)["x"]
    keys = x[:, 0:8:2]
    order = [
        tuple((keys[i].unsqueeze(1) == x[i, 8:].unsqueeze(0)).int().argmax(0).tolist()) for i in range(2000)
    ]
    assert len(set(order)) == 24  # all 4! query orders occur
    counts = torch.bincount(x[:, 1:8:2].flatten() - 8, minlength=8).float()
    assert (counts / counts.sum() - 1 / 8).abs().max() < 0.02


def test_associative_recall_is_deterministic_and_splits_differ():
    a, b = AssociativeRecallTask(seed=1), AssociativeRecallTask(seed=1)
    assert torch.equal(a.get_batch("train", 9)["x"], b.get_batch("train", 9)["x"])
    assert not torch.equal(a.get_batch("train", 9)["x"], a.get_batch("val", 9)["x"])
    assert not torch.equal(a.get_batch("val", 9)["x"], a.get_batch("val", 10)["x"])


def test_associative_recall_causal_oracle_is_perfect():
    task = AssociativeRecallTask(n_pairs=5, n_queries=4, vocab_size=24, seq_len=16, batch_size=4)
    oracle = PrefixOracle(recall_after_first_occurrence, task.vocab_size)
    _, metrics, _ = task.loss(oracle, task.get_batch("train", 0))
    assert metrics["accuracy"] == 1.0 and metrics["loss"] < 1e-6
    assert task.evaluate(oracle, max_batches=2)["val_accuracy"] == 1.0


def test_associative_recall_uniform_guess_scores_the_baseline():
    task = AssociativeRecallTask(n_pairs=4, n_queries=2, vocab_size=20, seq_len=10, batch_size=8)
    model = UniformOver(task.vocab_size, range(task.n_keys, task.vocab_size))
    _, metrics, _ = task.loss(model, task.get_batch("val", 0))
    assert metrics["loss"] == pytest.approx(task.baseline_loss, rel=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_pairs": 0}, "n_pairs must be an integer >= 1, got 0"),
        ({"n_queries": 0}, "n_queries must be an integer >= 1, got 0"),
        ({"vocab_size": 1}, "vocab_size must be an integer >= 2, got 1"),
        ({"n_pairs": 4, "n_queries": 5}, "n_queries=5 must be <= n_pairs=4"),
        ({"n_pairs": 8, "seq_len": 15}, "seq_len=15 must hold the 8 key-value pairs"),
        ({"n_pairs": 8, "vocab_size": 15}, "vocab_size=15 gives 7 keys.*use vocab_size >= 16"),
        ({"seed": "0"}, "seed must be an integer >= 0, got '0'"),
    ],
)
def test_associative_recall_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AssociativeRecallTask(**kwargs)


# ---- induction heads -------------------------------------------------------------------------------------


def test_induction_lengths_per_split():
    task = InductionHeadsTask(seq_len=10, vocab_size=6, batch_size=4)
    assert task.test_seq_len == 40 and task.max_seq_len == 40
    assert task.get_batch("train", 0)["x"].shape == (4, 10)
    assert task.get_batch("val", 0)["x"].shape == (4, 40)
    assert task.get_batch("test", 0)["y"].shape == (4, 40)
    short = InductionHeadsTask(seq_len=10, test_seq_len=5)
    assert short.get_batch("val", 0)["x"].shape[1] == 5 and short.max_seq_len == 10
    assert task.model_overrides() == {"vocab_size": 6}


@settings(max_examples=25, deadline=None)
@given(
    seq_len=st.integers(3, 30),
    test_seq_len=st.integers(3, 60),
    vocab_size=st.integers(2, 12),
    index=st.integers(0, 10_000),
    split=st.sampled_from(["train", "val"]),
)
def test_induction_layout(seq_len, test_seq_len, vocab_size, index, split):
    task = InductionHeadsTask(seq_len=seq_len, vocab_size=vocab_size, batch_size=3, test_seq_len=test_seq_len)
    x, y = task.get_batch(split, index).values()
    t = seq_len if split == "train" else test_seq_len
    assert x.shape == (3, t) and ((x >= 0) & (x < vocab_size)).all()
    assert (x == task.trigger).sum(dim=1).eq(2).all() and (x[:, -1] == task.trigger).all()
    assert answer_positions(y) == [[t - 1]] * 3
    for row_x, row_y in zip(x, y, strict=True):
        first = row_x.tolist().index(task.trigger)
        assert first + 1 < t - 1  # the recalled token comes strictly before the answer position
        assert row_y[-1] == row_x[first + 1] != task.trigger


def test_induction_validation_reaches_beyond_the_training_length():
    task = InductionHeadsTask(seq_len=8, vocab_size=5, batch_size=4000, test_seq_len=32)
    train_first = (task.get_batch("train", 0)["x"] == 0).int().argmax(dim=1)
    val_first = (task.get_batch("val", 0)["x"] == 0).int().argmax(dim=1)
    assert set(train_first.tolist()) == set(range(6))
    assert set(val_first.tolist()) == set(range(30))  # including distances never seen in training
    recalled = task.get_batch("train", 0)["y"][:, -1]
    counts = torch.bincount(recalled, minlength=5)[1:].float()
    assert (counts / counts.sum() - 0.25).abs().max() < 0.03


def test_induction_is_deterministic_and_splits_differ():
    a, b = InductionHeadsTask(seq_len=12, test_seq_len=12), InductionHeadsTask(seq_len=12, test_seq_len=12)
    assert torch.equal(a.get_batch("val", 2)["x"], b.get_batch("val", 2)["x"])
    assert not torch.equal(a.get_batch("train", 2)["x"], a.get_batch("val", 2)["x"])
    assert not torch.equal(a.get_batch("train", 2)["x"], a.get_batch("train", 3)["x"])


def test_induction_causal_oracle_is_perfect_at_every_length():
    task = InductionHeadsTask(seq_len=8, vocab_size=7, batch_size=6, test_seq_len=24)
    oracle = PrefixOracle(recall_after_first_occurrence, task.vocab_size)
    _, metrics, _ = task.loss(oracle, task.get_batch("train", 0))
    assert metrics["accuracy"] == 1.0 and metrics["loss"] < 1e-6
    assert task.evaluate(oracle, max_batches=2) == pytest.approx(
        {"val_loss": 0.0, "val_accuracy": 1.0}, abs=1e-6
    )


def test_induction_uniform_guess_scores_the_baseline():
    task = InductionHeadsTask(seq_len=10, vocab_size=9, batch_size=8)
    _, metrics, _ = task.loss(UniformOver(9, range(1, 9)), task.get_batch("train", 0))
    assert metrics["loss"] == pytest.approx(task.baseline_loss, rel=1e-5)
    assert task.baseline_loss == pytest.approx(math.log(8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 2}, "seq_len must be an integer >= 3, got 2"),
        ({"vocab_size": 1}, "vocab_size must be an integer >= 2, got 1"),
        ({"test_seq_len": 2}, "test_seq_len must be an integer >= 3, got 2"),
        ({"test_seq_len": 10.5}, "test_seq_len must be an integer >= 3, got 10.5"),
        ({"batch_size": True}, "batch_size must be an integer"),
    ],
)
def test_induction_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        InductionHeadsTask(**kwargs)


# ---- shared behaviour ------------------------------------------------------------------------------------

SMALL = [
    SelectiveCopyTask(seq_len=10, n_tokens=3, n_symbols=4, batch_size=4, seed=2),
    AssociativeRecallTask(n_pairs=3, n_queries=2, vocab_size=12, seq_len=8, batch_size=4, seed=2),
    InductionHeadsTask(seq_len=9, vocab_size=6, batch_size=4, seed=2, test_seq_len=15),
]
IDS = ["selective_copy", "associative_recall", "induction"]


@pytest.mark.parametrize("task", SMALL, ids=IDS)
def test_loss_backpropagates_and_evaluate_averages(task):
    torch.manual_seed(0)
    model = EmbeddingLinear(task.vocab_size)
    loss, metrics, state = task.loss(model, task.get_batch("train", 0))
    assert loss.ndim == 0 and state is None and metrics["loss"] == pytest.approx(loss.item())
    assert 0.0 <= metrics["accuracy"] <= 1.0
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    result = task.evaluate(model, max_batches=3)
    per_batch = [task.loss(model, task.get_batch("val", i))[1] for i in range(3)]
    assert result["val_loss"] == pytest.approx(sum(m["loss"] for m in per_batch) / 3)
    assert result["val_accuracy"] == pytest.approx(sum(m["accuracy"] for m in per_batch) / 3)


@pytest.mark.parametrize("task", SMALL, ids=IDS)
def test_wrong_model_output_is_rejected(task):
    v = task.vocab_size
    with pytest.raises(ValueError, match=rf"vocab_size={v}.*model_overrides"):
        task.loss(lambda x: torch.zeros(*x.shape, v + 1), task.get_batch("train", 0))


@pytest.mark.parametrize("task", SMALL, ids=IDS)
def test_get_batch_and_evaluate_errors(task):
    with pytest.raises(ValueError, match="split must be"):
        task.get_batch("dev", 0)
    with pytest.raises(ValueError, match="non-negative integer, got -1"):
        task.get_batch("train", -1)
    with pytest.raises(ValueError, match="max_batches must be an integer >= 1"):
        task.evaluate(EmbeddingLinear(task.vocab_size), max_batches=0)


@pytest.mark.parametrize("task", SMALL, ids=IDS)
def test_describe_is_json_and_names_the_settings(task):
    info = json.loads(json.dumps(task.describe()))
    assert info["name"] == task.name and info["seed"] == 2 and info["batch_size"] == 4
    assert info["baseline_loss"] == pytest.approx(task.baseline_loss)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("selective_copy", SelectiveCopyTask),
        ("associative_recall", AssociativeRecallTask),
        ("induction", InductionHeadsTask),
    ],
)
def test_registry_builds_the_probes(name, cls):
    assert name in list_tasks()
    task = create_task(name, batch_size=2, seed=3)
    assert isinstance(task, cls) and task.name == name
    with pytest.raises(ValueError, match="unknown argument"):
        create_task(name, copy_len=3)
