"""The adding problem and the copy memory task: data layout, determinism, baselines, loss and evaluate."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from seqlab.tasks.synthetic import AddingTask, CopyTask

# ---- stand-in models following the call protocol: out = model(x) ------------------------------------------


class PerPositionLinear(nn.Module):
    """Features (b, t, 2) -> (b, t, 1), one linear map per position (no memory at all)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 1)

    def forward(self, x):
        return self.proj(x)


class AddingOracle(nn.Module):
    """The running sum of marked values: exact at the last position."""

    def forward(self, x):
        return (x[..., 0] * x[..., 1]).cumsum(dim=1).unsqueeze(-1)  # (b, t, 1)


class ConstantOne(nn.Module):
    def forward(self, x):
        return torch.ones(x.shape[0], x.shape[1], 1)


class EmbeddingLinear(nn.Module):
    """Token ids (b, t) -> logits (b, t, vocab_size)."""

    def __init__(self, vocab_size: int, d_model: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, x):
        return self.head(self.embed(x))


class CopyOracle(nn.Module):
    """Reads the symbols at the start and writes them after the delimiter: perfect copy."""

    def __init__(self, task: CopyTask):
        super().__init__()
        self.k, self.v = task.copy_len, task.vocab_size

    def forward(self, x):
        t = x.shape[1]
        target = torch.zeros_like(x)
        target[:, t - self.k :] = x[:, : self.k]
        return 50.0 * nn.functional.one_hot(target, self.v).float()  # (b, t, v)


class CopyMemoryless(nn.Module):
    """Certain blanks, then a uniform guess over the symbols for the last copy_len positions."""

    def __init__(self, task: CopyTask):
        super().__init__()
        self.task = task

    def forward(self, x):
        b, t = x.shape
        k, v = self.task.copy_len, self.task.vocab_size
        logits = torch.full((b, t, v), -1e4)
        logits[:, : t - k, self.task.blank] = 0.0
        logits[:, t - k :, 1 : self.task.n_symbols + 1] = 0.0
        return logits


class TrainingFlagRecorder(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(self.training)
        return torch.zeros(x.shape[0], x.shape[1], 1)


# ---- the adding problem ----------------------------------------------------------------------------------


def test_adding_shapes_and_dtypes():
    task = AddingTask(seq_len=50, batch_size=7)
    batch = task.get_batch("train", 0)
    assert batch["x"].shape == (7, 50, 2) and batch["x"].dtype == torch.float32
    assert batch["y"].shape == (7,) and batch["y"].dtype == torch.float32
    assert batch["x"].device.type == "cpu"
    assert task.model_overrides() == {"d_input": 2, "d_output": 1}


@settings(max_examples=25, deadline=None)
@given(seq_len=st.integers(2, 61), batch_size=st.integers(1, 9), index=st.integers(0, 10_000))
def test_adding_marker_structure_and_target(seq_len, batch_size, index):
    x, y = AddingTask(seq_len=seq_len, batch_size=batch_size).get_batch("train", index).values()
    values, marker = x[..., 0], x[..., 1]
    assert ((values >= 0) & (values < 1)).all()
    assert set(marker.unique().tolist()) <= {0.0, 1.0}
    half = seq_len // 2
    assert (marker[:, :half].sum(dim=1) == 1).all()  # exactly one marker in the first half
    assert (marker[:, half:].sum(dim=1) == 1).all()  # and one in the second
    torch.testing.assert_close(y, (values * marker).sum(dim=1))


def test_adding_markers_cover_both_halves_uniformly():
    x = AddingTask(seq_len=10, batch_size=5000).get_batch("train", 0)["x"]
    first, second = x[:, :5, 1].argmax(dim=1), x[:, 5:, 1].argmax(dim=1) + 5
    assert set(first.tolist()) == {0, 1, 2, 3, 4}
    assert set(second.tolist()) == {5, 6, 7, 8, 9}
    counts = torch.bincount(first, minlength=5).float()
    assert (counts / counts.sum() - 0.2).abs().max() < 0.03


def test_adding_is_deterministic_and_splits_differ():
    a, b = AddingTask(seq_len=20, seed=3), AddingTask(seq_len=20, seed=3)
    for split in ("train", "val"):
        torch.testing.assert_close(a.get_batch(split, 5), b.get_batch(split, 5), rtol=0, atol=0)
    assert not torch.equal(a.get_batch("train", 5)["x"], a.get_batch("val", 5)["x"])
    assert not torch.equal(a.get_batch("train", 5)["x"], a.get_batch("train", 6)["x"])
    other_seed = AddingTask(seq_len=20, seed=4)
    assert not torch.equal(a.get_batch("train", 5)["x"], other_seed.get_batch("train", 5)["x"])


def test_adding_constant_one_baseline_is_one_sixth():
    task = AddingTask(seq_len=20, batch_size=20_000)
    _, metrics, state = task.loss(ConstantOne(), task.get_batch("val", 0))
    assert state is None
    assert abs(metrics["mse"] - 1 / 6) < 0.01
    assert metrics["mse"] == pytest.approx(metrics["baseline_mse"], rel=1e-5)
    assert task.describe()["baseline_mse"] == pytest.approx(1 / 6)


def test_adding_loss_reads_last_position_and_backpropagates():
    task = AddingTask(seq_len=12, batch_size=16)
    batch = task.get_batch("train", 0)
    loss, metrics, _ = task.loss(AddingOracle(), batch)
    assert metrics["mse"] < 1e-10

    model = PerPositionLinear()
    loss, metrics, state = task.loss(model, batch)
    assert loss.ndim == 0 and loss.requires_grad and state is None
    assert metrics["mse"] == pytest.approx(loss.item())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_adding_evaluate():
    task = AddingTask(seq_len=16, batch_size=8)
    assert task.evaluate(AddingOracle(), max_batches=3)["val_mse"] < 1e-10
    result = task.evaluate(ConstantOne(), max_batches=4)
    assert set(result) == {"val_mse", "val_baseline_mse"}
    expected = sum(task.loss(ConstantOne(), task.get_batch("val", i))[1]["mse"] for i in range(4)) / 4
    assert result["val_mse"] == pytest.approx(expected)


def test_evaluate_uses_eval_mode_and_restores_it():
    model = TrainingFlagRecorder().train()
    AddingTask(seq_len=4, batch_size=2).evaluate(model, max_batches=2)
    assert model.seen == [False, False] and model.training


def test_adding_rejects_wrong_model_output():
    task = AddingTask(seq_len=8, batch_size=2)
    with pytest.raises(ValueError, match=r"\(2, 8, 1\).*model_overrides"):
        task.loss(lambda x: torch.zeros(2, 8, 3), task.get_batch("train", 0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 1}, "seq_len must be an integer >= 2, got 1"),
        ({"seq_len": 10.0}, "seq_len must be an integer"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"seed": True}, "seed must be an integer"),
    ],
)
def test_adding_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AddingTask(**kwargs)


def test_get_batch_errors():
    task = AddingTask(seq_len=4)
    with pytest.raises(ValueError, match="split must be"):
        task.get_batch("dev", 0)
    with pytest.raises(ValueError, match="non-negative integer, got -1"):
        task.get_batch("train", -1)
    with pytest.raises(ValueError, match="max_batches must be an integer >= 1"):
        task.evaluate(ConstantOne(), max_batches=0)


# ---- the copy memory task --------------------------------------------------------------------------------


def test_copy_shapes_and_overrides():
    task = CopyTask(seq_len=30, n_symbols=5, copy_len=4, batch_size=6)
    batch = task.get_batch("train", 0)
    assert batch["x"].shape == batch["y"].shape == (6, 30 + 2 * 4)
    assert batch["x"].dtype == batch["y"].dtype == torch.long
    assert task.model_overrides() == {"vocab_size": 7}
    assert (task.blank, task.delimiter, task.vocab_size, task.total_len) == (0, 6, 7, 38)


@settings(max_examples=25, deadline=None)
@given(
    seq_len=st.integers(1, 40),
    n_symbols=st.integers(1, 12),
    copy_len=st.integers(1, 12),
    index=st.integers(0, 10_000),
)
def test_copy_layout(seq_len, n_symbols, copy_len, index):
    task = CopyTask(seq_len=seq_len, n_symbols=n_symbols, copy_len=copy_len, batch_size=3)
    x, y = task.get_batch("val", index).values()
    k, t, delim = copy_len, seq_len + 2 * copy_len, n_symbols + 1
    symbols = x[:, :k]
    assert ((symbols >= 1) & (symbols <= n_symbols)).all()
    assert (x[:, k : k + seq_len - 1] == 0).all()  # T - 1 blanks
    assert (x[:, k + seq_len - 1] == delim).all()  # the delimiter
    assert (x[:, k + seq_len :] == 0).all()  # k blanks while the copy is written
    assert (x == delim).sum(dim=1).eq(1).all()
    assert (y[:, : t - k] == 0).all()
    assert torch.equal(y[:, t - k :], symbols)


def test_copy_default_layout_matches_arjovsky():
    task = CopyTask()
    x = task.get_batch("train", 0)["x"]
    assert x.shape == (32, 120)
    assert (x[:, 109] == 9).all() and (x[:, 10:109] == 0).all()
    assert task.baseline_loss == pytest.approx(10 * math.log(8) / 120)


def test_copy_symbols_are_uniform():
    x = CopyTask(seq_len=1, n_symbols=4, copy_len=10, batch_size=2000).get_batch("train", 0)["x"]
    counts = torch.bincount(x[:, :10].flatten(), minlength=5)[1:].float()
    assert (counts / counts.sum() - 0.25).abs().max() < 0.02


def test_copy_is_deterministic_and_splits_differ():
    a, b = CopyTask(seed=7), CopyTask(seed=7)
    assert torch.equal(a.get_batch("train", 2)["x"], b.get_batch("train", 2)["x"])
    assert not torch.equal(a.get_batch("train", 2)["x"], a.get_batch("val", 2)["x"])
    assert not torch.equal(a.get_batch("val", 2)["x"], a.get_batch("val", 3)["x"])


def test_copy_memoryless_model_scores_the_baseline():
    task = CopyTask(seq_len=20, n_symbols=6, copy_len=5, batch_size=16)
    _, metrics, _ = task.loss(CopyMemoryless(task), task.get_batch("train", 0))
    assert metrics["loss"] == pytest.approx(task.baseline_loss, rel=1e-5)
    assert metrics["loss"] == pytest.approx(5 * math.log(6) / 30, rel=1e-5)


def test_copy_oracle_scores_perfectly():
    task = CopyTask(seq_len=20, n_symbols=6, copy_len=5, batch_size=16)
    _, metrics, state = task.loss(CopyOracle(task), task.get_batch("train", 0))
    assert state is None
    assert metrics["accuracy"] == 1.0 and metrics["loss"] < 1e-6
    result = task.evaluate(CopyOracle(task), max_batches=3)
    assert set(result) == {"val_loss", "val_accuracy"}
    assert result["val_accuracy"] == 1.0


def test_copy_accuracy_counts_only_the_copied_positions():
    # Always predicting blank is right at T + k of the T + 2k positions, but copies nothing.
    task = CopyTask(seq_len=20, n_symbols=6, copy_len=5, batch_size=4)
    blank_model = lambda x: nn.functional.one_hot(torch.zeros_like(x), task.vocab_size).float()  # noqa: E731
    _, metrics, _ = task.loss(blank_model, task.get_batch("train", 0))
    assert metrics["accuracy"] == 0.0


def test_copy_loss_backpropagates_and_evaluate_averages():
    task = CopyTask(seq_len=10, n_symbols=4, copy_len=3, batch_size=8)
    model = EmbeddingLinear(task.vocab_size)
    loss, metrics, _ = task.loss(model, task.get_batch("train", 0))
    assert metrics["loss"] == pytest.approx(loss.item())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    result = task.evaluate(model, max_batches=2)
    per_batch = [task.loss(model, task.get_batch("val", i))[1] for i in range(2)]
    assert result["val_loss"] == pytest.approx(sum(m["loss"] for m in per_batch) / 2)
    assert result["val_accuracy"] == pytest.approx(sum(m["accuracy"] for m in per_batch) / 2)


def test_copy_rejects_wrong_vocab():
    task = CopyTask(seq_len=5, n_symbols=4, copy_len=2, batch_size=2)
    with pytest.raises(ValueError, match=r"vocab_size=6.*model_overrides"):
        task.loss(lambda x: torch.zeros(*x.shape, 5), task.get_batch("train", 0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 0}, "seq_len must be an integer >= 1, got 0"),
        ({"n_symbols": 0}, "n_symbols must be an integer >= 1, got 0"),
        ({"copy_len": 0}, "copy_len must be an integer >= 1, got 0"),
        ({"copy_len": "10"}, "copy_len must be an integer >= 1, got '10'"),
        ({"batch_size": -3}, "batch_size must be an integer >= 1, got -3"),
        ({"seed": 0.5}, "seed must be an integer >= 0, got 0.5"),
    ],
)
def test_copy_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CopyTask(**kwargs)


@pytest.mark.parametrize(
    "task",
    [AddingTask(seq_len=9, batch_size=3, seed=1), CopyTask(seq_len=9, n_symbols=3, copy_len=2, seed=2)],
    ids=["adding", "copy"],
)
def test_describe_is_json_and_names_the_settings(task):
    info = json.loads(json.dumps(task.describe()))
    assert info["name"] == task.name and info["seq_len"] == 9 and info["seed"] == task.seed
    assert not task.stateful
