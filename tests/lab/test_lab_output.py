"""A lab run people can follow: the plan (runs, reuse, time expected here) before any training step, an end
that fits a terminal and names every plot and what to open next, `--remeasure systems` that keeps the trained
runs, and `compare --help` that lists the suites, mixers and tasks from the registries."""

import json
import re
from pathlib import Path

import pytest

import seqlab.lab.records as records
import seqlab.lab.runner as runner
from seqlab.cli import main
from seqlab.lab import compare
from seqlab.lab.suite import OTHER_SUITES, SUITES, Entry, Suite, _adding
from seqlab.layers import list_mixers

TINY = Suite(
    "tiny",
    8_000,
    1,
    (_adding(12, 6), Entry("copy", "T=5", {"seq_len": 5, "batch_size": 4}, 4, "val_accuracy")),
    decode_contexts=(8, 64),
    throughput_lengths=(32,),
    gradient_length=8,
    timing_cap_s=0.5,
)


def test_the_plan_comes_first_and_the_end_fits_a_terminal(tmp_path, capsys, monkeypatch):
    seen = []
    real = runner.train_run

    def spy(*args, **kwargs):
        seen.append(capsys.readouterr().out)  # what was printed before this run's first training step
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_run", spy)
    paths = compare(tmp_path, TINY, mixers=["gru", "attention"], jobs=1)
    first = seen[0].splitlines()
    assert first[0].startswith("[compare] tiny: 4 runs (2 mixers x 2 tasks), 0 reused, 4 to train; about ")
    assert first[0].endswith(" here") and "calibrated" not in first[0]
    assert "[compare] mixers: gru, attention" in first and "[compare] tasks: adding T=12, copy T=5" in first
    assert any(line.startswith("[compare] training about ") for line in first)
    end = paths["summary"]
    assert all(len(line) <= 100 for line in end), max(end, key=len)
    assert all("<br>" not in line and not line.startswith("|") for line in end)  # no Markdown
    for path in [*paths["plots"], paths["report"], paths["table"]]:
        assert f"  {path}" in "\n".join(end)
    assert len(paths["plots"]) >= 4
    opened = next(i for i, line in enumerate(end) if line.startswith("open next: report.html"))
    assert end[opened + 1 : opened + 3] == [f"  {paths['report']}", f"  {paths['table']}"]
    table = paths["table"].read_text()
    assert "## Timing spread" in table and "load average (1 min)" in table  # under the Markdown tables
    assert re.search(
        r"^Wall time: \d+\.\d min \(training and measuring, 1 job\(s\) at a time\)$", table, re.M
    )
    row = [ln for ln in table.splitlines() if ln.startswith("| decode latency 64 / 8 |")]
    verdict = r"\d+\.\d\d× \((flat|grows|unclear \(noisy\)|unclear \(near the line\))\)"
    assert len(row) == 1 and re.fullmatch(rf"\| decode latency 64 / 8 \| {verdict} \| {verdict} \|", row[0])


def test_remeasure_systems_keeps_the_trained_runs_and_the_old_numbers(tmp_path, monkeypatch, capsys):
    compare(tmp_path, TINY, mixers=["gru"], progress=False, gradients=False)
    runs = tmp_path / "runs"
    trained = {f.name: f.read_text() for f in runs.glob("gru__*.json") if "systems" not in f.name}
    before = {f.name: f.read_text() for f in runs.glob("*.json") if f.name not in trained}
    (tmp_path / "my-notes.txt").write_text("mine")

    def never(*args, **kwargs):
        raise AssertionError("--remeasure systems trained a run")

    monkeypatch.setattr(runner, "train_run", never)
    monkeypatch.setattr(runner, "calibrate", never)
    paths = compare(tmp_path, TINY, mixers=["gru"], gradients=False, remeasure=("systems",))
    assert "2 trained kept, none trained" in capsys.readouterr().out
    assert {f.name: f.read_text() for f in runs.glob("gru__*.json") if "systems" not in f.name} == trained
    for name, text in before.items():  # each systems record measured again, the old one kept beside it
        assert (runs / f"{name}.prev").read_text() == text
        assert json.loads((runs / name).read_text())["settings"] == json.loads(text)["settings"]
    rows = json.loads(paths["results"].read_text())
    assert {r["task"] for r in rows} == {"adding", "copy", "decode", "throughput", "memory"}
    assert (tmp_path / "my-notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="remeasure takes 'systems'"):
        compare(tmp_path, TINY, mixers=["gru"], remeasure=("training",))


def test_compare_help_lists_suites_mixers_and_tasks_from_the_registries(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    for name in [*SUITES, *OTHER_SUITES, *list_mixers()]:
        assert name in out
    assert all(e.task in out for suite in SUITES.values() for e in suite.entries)
    assert "--remeasure" in out


def test_every_compare_option_has_help():
    import argparse

    from seqlab.cli import make_parser

    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = sub.choices["compare"]._actions
    assert [a.dest for a in actions if not a.help] == []


def test_remeasure_belongs_to_the_suites_with_systems_rows(tmp_path, capsys):
    assert main(["compare", "--suite", "video", "--remeasure", "systems", "--out", str(tmp_path)]) == 2
    assert "--remeasure is for the quick and full suites" in capsys.readouterr().err


def test_worker_log_lines_come_back_to_be_written_above_the_bar():
    import logging

    with records.collect_logs(True) as logs:
        logging.getLogger("seqlab.tasks").warning("the data set is small")
        logging.getLogger("seqlab.tasks").info("not kept")
    assert logs.lines == ["WARNING the data set is small"]


def test_the_plan_packs_runs_longest_first_onto_the_workers():
    from seqlab.lab.budget import makespan

    assert makespan([3, 3, 2, 2, 2], 2) == 7 and makespan([3, 3, 2, 2, 2], 1) == 12
    assert makespan([], 2) == 0


def test_the_command_ends_with_the_summary_and_remeasures_systems(tmp_path, capsys, monkeypatch):
    from seqlab.lab.suite import SUITES as registry

    monkeypatch.setitem(registry, "tiny", TINY)
    argv = ["compare", "--suite", "tiny", "--mixers", "gru", "--jobs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("[compare] tiny: 2 runs (1 mixer x 2 tasks), 0 reused, 2 to train; about ")
    assert "<br>" not in out and "| --- |" not in out and "open next: report.html" in out
    assert main([*argv, "--remeasure", "systems"]) == 0
    out = capsys.readouterr().out
    assert "2 trained kept, none trained" in out and "(done" not in out and "open next" in out
    if "unclear (noisy)" in out:  # the way to measure again is said where it is needed
        assert (
            "seqlab compare --suite tiny --mixers gru --remeasure systems --out" in out
            and str(tmp_path) in out
        )
    assert (tmp_path / "runs" / "gru__systems.json.prev").is_file()


def test_the_remeasure_hint_repeats_the_mixers_and_tasks_that_ran(tmp_path):
    from seqlab.lab import summary_lines

    noisy = records.Record("gru", "throughput", "t=64", "tokens_per_s", 1.0, 10, 1.0, noisy=True)
    paths = {
        "table": tmp_path / "table.md",
        "results": tmp_path / "results.json",
        "plots": [],
        "minutes": 0.1,
    }
    lines = summary_lines(TINY, ["gru"], [noisy], [], paths, " --mixers gru --tasks adding")
    hint = " ".join(lines[lines.index(next(x for x in lines if x.startswith("* measure"))) + 1 :][:2])
    # without them the suggested command timed every mixer of the suite
    assert "seqlab compare --suite tiny --mixers gru --tasks adding --remeasure systems --out" in hint


def test_the_trained_metrics_stay_apart_at_their_widest():
    """Values of 8 characters (0.000223, 3.56e-05) in the nine columns of the full suite: each keeps a space
    before it and the row its 100 columns (they once ran together: 0.000223.56e-050.000139)."""
    from seqlab.lab import summary_lines
    from seqlab.lab.suite import FULL

    values = [0.000223, 3.56e-05, 0.000139, 1.0, 1.0, 0.073, 1.0, 1.83, 0.922]
    recs = [
        records.Record("mamba2", e.task, e.setting, e.metric, v, 10, 1.0)
        for e, v in zip(FULL.entries, values, strict=True)
    ]
    paths = {"table": Path("t.md"), "results": Path("r.json"), "plots": [], "minutes": 1.0}
    lines = summary_lines(FULL, ["mamba2"], recs, [], paths)
    row = next(x for x in lines if x.startswith("mamba2"))
    assert row.split() == [
        "mamba2", "0.000223", "3.56e-05", "0.000139", "100.0%", "100.0%", "7.3%", "100.0%", "1.83", "92.2%"
    ]  # fmt: skip
    assert max(len(x) for x in lines) < 100
