"""The time-series suite: matched parameter counts, a tiny end-to-end compare whose runs are reused."""

import json

import pytest

from seqlab.lab.timeseries import BUDGET, TOLERANCE, compare_timeseries, plan


def test_plan_matches_every_mixer_to_the_budget_and_lets_the_task_set_the_sizes():
    runs = plan(datasets=["sunspots"], steps=10)
    from seqlab.layers import list_mixers

    assert set(runs) == {f"sunspots {m}" for m in list_mixers()}
    for spec in runs.values():
        assert abs(spec["params"] - BUDGET) <= TOLERANCE * BUDGET or spec["mixer"] == "s4d", spec
        model, task = spec["run"]["model"], spec["run"]["task"]
        assert "d_input" not in model and "d_output" not in model  # the task fixes them
        assert (task["scaling"], task["center"]) == ("window", "mean")  # stated, not left to a default
        assert spec["run"]["train"]["steps"] == 10
    assert (
        plan(["lstm"], ["co2"], task={"scaling": "global"})["co2 lstm"]["run"]["task"]["scaling"] == "global"
    )


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown timeseries suite mixer"):
        plan(["lstm", "xlstm"])
    with pytest.raises(ValueError, match="unknown timeseries suite dataset"):
        plan(datasets=["ftse"])


def test_a_refused_suite_leaves_no_folder_behind(tmp_path):
    with pytest.raises(ValueError, match="unknown timeseries suite dataset"):
        compare_timeseries(tmp_path / "out", ["lstm"], ["bogus"])
    assert not (tmp_path / "out").exists()


def test_a_tiny_suite_end_to_end_and_its_runs_reused(tmp_path):
    paths = compare_timeseries(tmp_path, ["lstm", "attention"], ["sunspots"], jobs=2, steps=4)
    results = json.loads(paths["results"].read_text(encoding="utf-8"))
    runs = [r for r in results["records"] if r["family"] != "baseline"]
    assert {r["forecaster"] for r in runs} == {"lstm", "attention"} and all(r["steps"] == 4 for r in runs)
    base = {r["forecaster"]: r["test"]["mase"] for r in results["records"] if r["family"] == "baseline"}
    assert set(base) == {"naive", "snaive", "linear"} and base["naive"] == base["snaive"]  # m = 1
    table = paths["table"].read_text(encoding="utf-8")
    assert "## Verdict" in table and "**sunspots** (seasonal naive" in table and "beat both:" in table
    assert "| lstm | RNN |" in table and "| seasonal naive | baseline |" in table
    assert paths["plot"].stat().st_size > 0 and paths["minutes"] > 0
    metrics = tmp_path / "runs" / "sunspots-lstm" / "metrics.jsonl"
    first = metrics.read_text(encoding="utf-8")
    again = compare_timeseries(tmp_path, ["lstm"], ["sunspots"], jobs=1, steps=4)
    assert metrics.read_text(encoding="utf-8") == first  # read back, not trained again
    rerun = json.loads(again["results"].read_text(encoding="utf-8"))["records"]
    assert [r["test"] for r in rerun if r["forecaster"] == "lstm"] == [
        r["test"] for r in runs if r["forecaster"] == "lstm"
    ]
    with pytest.raises(ValueError, match="trained with other settings"):
        compare_timeseries(tmp_path, ["lstm"], ["sunspots"], jobs=1, steps=5)
