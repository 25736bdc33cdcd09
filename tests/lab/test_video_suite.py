"""The video suite: matched parameter counts, a tiny end-to-end compare whose runs are reused, its errors."""

import json

import pytest

from seqlab.lab.video import REFERENCE, TASKS, _size, compare_video, plan


def test_plan_matches_every_mixer_to_the_reference_count():
    runs = plan()
    from seqlab.layers import list_mixers

    assert len(runs) == len(list_mixers()) * len(TASKS)
    for spec in runs.values():
        target = _size(*REFERENCE, spec["task"])
        got = _size(spec["contender"], spec["model"]["d_model"], spec["task"])
        assert abs(got - target) / target < 0.08, spec
    assert "action vivit" in plan(["vivit"], ["action"])


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown video suite mixer"):
        plan(["lstm", "xlstm"])
    with pytest.raises(ValueError, match="unknown video suite task"):
        plan(tasks=["pose"])


def test_a_tiny_suite_end_to_end_and_its_runs_reused(tmp_path, capsys):
    data = {"n_train": 64, "n_eval": 16, "batch_size": 8}
    paths = compare_video(
        tmp_path,
        ["lstm", "attention"],
        ["frames", "caption"],
        jobs=2,
        steps={"frames": 6, "caption": 6},
        data=data,
    )
    records = json.loads(paths["results"].read_text(encoding="utf-8"))
    assert {r["label"] for r in records} == {
        "frames lstm",
        "frames attention",
        "caption lstm",
        "caption attention",
    }
    assert all(r["steps"] == 6 for r in records)
    assert all(0 <= r["test"]["macro_f1"] <= 1 for r in records if r["task"] == "frames")
    table = paths["table"].read_text(encoding="utf-8")
    assert "| lstm | RNN |" in table and "| attention | Transformer |" in table and "frames macro F1" in table
    assert paths["plot"].stat().st_size > 0
    first = (tmp_path / "runs" / "frames-lstm" / "metrics.jsonl").read_text(encoding="utf-8")
    compare_video(tmp_path, ["lstm"], ["frames"], jobs=1, steps={"frames": 6}, data=data)
    assert (tmp_path / "runs" / "frames-lstm" / "metrics.jsonl").read_text(encoding="utf-8") == first
