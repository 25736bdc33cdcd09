"""The speech suite: matched parameter counts, a tiny end-to-end compare whose runs are reused, its errors."""

import json
import shutil

import pytest

from seqlab.lab.speech import REFERENCE, TASKS, _size, compare_speech, plan


def test_plan_matches_every_mixer_to_the_reference_count():
    from seqlab.layers import list_mixers

    runs = plan()
    assert len(runs) == len(list_mixers()) * len(TASKS)
    for spec in runs.values():
        target = _size(*REFERENCE, spec["task"])
        got = _size(spec["contender"], spec["model"]["d_model"], spec["task"])
        assert abs(got - target) / target < 0.08, spec


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown speech suite mixer"):
        plan(["lstm", "xlstm"])
    with pytest.raises(ValueError, match="unknown speech suite task"):
        plan(tasks=["phonemes"])


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng: apt-get install -y espeak-ng")
def test_a_tiny_suite_end_to_end_and_its_runs_reused(tmp_path):
    data = {"n_train": 16, "n_eval": 4, "batch_size": 4, "cache_dir": str(tmp_path / "corpus")}
    steps = {"keywords": 3, "digits": 3}
    paths = compare_speech(tmp_path, ["lstm"], None, jobs=2, steps=steps, data=data)
    records = json.loads(paths["results"].read_text(encoding="utf-8"))
    assert {r["label"] for r in records} == {"keywords lstm", "digits lstm"}
    assert all(r["steps"] == 3 and r["n_test"] == 4 for r in records)
    assert all(0 <= r["test"]["acc"] <= 1 for r in records if r["task"] == "keywords")
    assert all(r["test"]["beam_cer"] >= 0 for r in records if r["task"] == "digits")
    table = paths["table"].read_text(encoding="utf-8")
    assert "| lstm | RNN |" in table and "keyword acc" in table and "CER beam" in table
    assert paths["plot"].stat().st_size > 0
    first = (tmp_path / "runs" / "digits-lstm" / "metrics.jsonl").read_text(encoding="utf-8")
    compare_speech(tmp_path, ["lstm"], ["digits"], jobs=1, steps=steps, data=data)
    assert (tmp_path / "runs" / "digits-lstm" / "metrics.jsonl").read_text(encoding="utf-8") == first
