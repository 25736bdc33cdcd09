"""The lab's cached runs become one TensorBoard run per mixer × task × setting, read back with tensorboard's
own reader."""

import json

import pytest

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from seqlab.lab.tensorboard import write_lab_events


def _cache(out, mixer: str, task: str, setting: str, curve, summary) -> None:
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    data = {
        "settings": {"suite": "quick", "entry": {"task": task, "setting": setting}},
        "summary": summary,
        "train_tokens_per_s": 1234.5,
        "curve": curve,
    }
    (runs / f"{mixer}__{task}__{setting}.json").write_text(json.dumps(data))


def test_each_run_is_a_tensorboard_run(tmp_path):
    _cache(tmp_path, "lstm", "adding", "T-50", [[10, 1.5], [20, 0.5]], {"step": 20, "val_mse": 0.25})
    _cache(
        tmp_path, "linear-attention", "adding", "T-50", [[10, 2.0], [20, 1.0]], {"step": 20, "val_mse": 0.5}
    )
    (tmp_path / "runs" / "decode__lstm.json").write_text(json.dumps({"settings": {}, "ms": [1.0]}))  # systems
    tb = write_lab_events(tmp_path)
    assert sorted(p.name for p in (tb / "adding" / "T-50").iterdir()) == ["linear-attention", "lstm"]
    acc = EventAccumulator(str(tb / "adding" / "T-50" / "lstm"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(10, 1.5), (20, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("val/mse")] == [(20, 0.25)]
    assert acc.Scalars("train/tokens_per_s")[0].value == pytest.approx(1234.5)
    # a rebuild replaces seqlab's tb/ folder only, and leaves no temporary folder behind
    write_lab_events(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tb"]


def test_a_tb_folder_seqlab_did_not_write_is_kept(tmp_path):
    _cache(tmp_path, "lstm", "adding", "T-50", [[10, 1.5]], {"step": 10})
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "mine.txt").write_text("notes")
    with pytest.raises(ValueError, match="seqlab did not write it"):
        write_lab_events(tmp_path)
    assert (tmp_path / "tb" / "mine.txt").read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tb"]


def test_nothing_to_write_is_said(tmp_path):
    with pytest.raises(ValueError, match="holds no finished training runs"):
        write_lab_events(tmp_path)
