"""train.loggers: [tensorboard] writes the records as TensorBoard scalars (read back with tensorboard's own
reader), a resumed run's events equal an uninterrupted run's, and a missing package fails before training."""

import importlib.util

import pytest

from seqlab.training import TrainConfig


def _scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_records_become_scalars(train, records, tmp_path):
    pytest.importorskip("tensorboard")
    train(tmp_path / "a", 10, loggers=["tensorboard"], log_every=2, grad_clip=1.0)
    scalars = _scalars(tmp_path / "a")
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss"} <= set(scalars)
    jsonl = [r for r in records(tmp_path / "a") if r["split"] == "train"]
    assert [s for s, _ in scalars["train/loss"]] == [r["step"] for r in jsonl] == [2, 4, 6, 8, 10]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([r["loss"] for r in jsonl], rel=1e-6)
    assert all(v > 0 for _, v in scalars["train/grad_norm"])


def test_a_resumed_run_has_the_events_of_an_uninterrupted_one(train, tmp_path):
    pytest.importorskip("tensorboard")
    train(tmp_path / "a", 12, loggers=["tensorboard"])
    train(tmp_path / "b", 12, until=7, loggers=["tensorboard"])
    train(tmp_path / "b", 12, resume=True, loggers=["tensorboard"])
    a, b = _scalars(tmp_path / "a"), _scalars(tmp_path / "b")
    assert set(a) == set(b)
    for tag in ("train/loss", "val/loss"):
        steps_b = [s for s, _ in b[tag]]
        assert len(steps_b) == len(set(steps_b)), tag  # nothing logged twice
        assert dict(b[tag]).items() >= {k: v for k, v in a[tag] if k != 7}.items(), tag


def test_loggers_are_checked_before_any_work(monkeypatch):
    with pytest.raises(ValueError, match=r"train\.loggers must be a list of"):
        TrainConfig(loggers=["wandb"])
    assert TrainConfig(loggers=[]).loggers == ["jsonl"]  # metrics.jsonl is always written
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a)
    )
    with pytest.raises(ValueError, match="pip install tensorboard"):
        TrainConfig(loggers=["tensorboard"])
