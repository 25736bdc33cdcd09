"""The lab's edges: a replaced run keeps every earlier record, a Ctrl-C'd run is never stored as done, a failing
run in a parallel compare keeps the runs that finished, and the command line refuses empty or repeated names and
an infinite time budget."""

from __future__ import annotations

import json

import pytest

import seqlab.lab.runner as runner
from seqlab.cli import main
from seqlab.lab import compare
from seqlab.lab.records import RunCache
from seqlab.lab.suite import Entry, Suite, _adding

TINY = Suite("tiny", 8_000, 1, (_adding(12, 6),), decode_contexts=(8, 16), throughput_lengths=(16,),
             gradient_length=8, timing_cap_s=0.3)  # fmt: skip


def test_a_replaced_run_keeps_every_earlier_record(tmp_path):
    cache = RunCache(tmp_path)
    for seed in range(4):
        cache.put("lstm__adding", {"settings": {"seed": seed}})
    kept = sorted(p.name for p in cache.dir.iterdir())
    assert kept == [
        "lstm__adding.json",
        "lstm__adding.json.prev",
        "lstm__adding.json.prev-2",
        "lstm__adding.json.prev-3",
    ]
    seeds = sorted(json.loads(p.read_text())["settings"]["seed"] for p in cache.dir.iterdir())
    assert seeds == [0, 1, 2, 3]


def test_a_run_stopped_by_ctrl_c_stops_the_compare_and_is_not_stored(tmp_path, monkeypatch):
    real_fit = runner.Trainer.fit

    def interrupted(self, *args, **kwargs):
        summary = real_fit(self, *args, **kwargs)
        return {**summary, "interrupted": True}  # what fit returns after the first Ctrl-C

    monkeypatch.setattr(runner.Trainer, "fit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compare(tmp_path, TINY, mixers=["lstm", "gru"], progress=False, gradients=False)
    assert not list((tmp_path / "runs").glob("*adding*.json"))  # nothing stored as finished


def test_a_failing_run_in_a_parallel_compare_keeps_the_runs_that_finished(tmp_path, capsys):
    bad = Entry("adding", "bad", {"seq_len": 12, "batch_size": 8, "bogus_field": 1}, 6, "val_mse")
    suite = Suite("tiny", 8_000, 1, (_adding(12, 6), bad), decode_contexts=(8, 16), throughput_lengths=(16,),
                  gradient_length=8, timing_cap_s=0.3)  # fmt: skip
    with pytest.raises(ValueError, match="bogus_field"):
        compare(tmp_path, suite, mixers=["lstm"], progress=False, gradients=False, jobs=2)
    assert list((tmp_path / "runs").glob("lstm__adding__T-12*.json"))  # the good run, finished, is stored


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mixers", ","], "must name one or more"),
        (["--mixers", "lstm,lstm"], "names lstm more than once"),
        (["--minutes", "inf"], "must be a positive number, got 'inf'"),
    ],
)
def test_compare_refuses_empty_or_repeated_names_and_an_infinite_budget(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as stop:  # argparse's refusal: usage and the error, exit status 2
        main(["compare", "--suite", "quick", "--out", str(tmp_path / "c"), *args])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_the_report_page_shows_this_compares_plots_and_runs_only(tmp_path):
    compare(tmp_path, TINY, mixers=["lstm"], progress=False, gradients=True)
    assert (tmp_path / "gradient_flow.png").is_file()
    paths = compare(tmp_path, TINY, mixers=["gru"], progress=False, gradients=False)
    page = paths["report"].read_text(encoding="utf-8")
    assert "gradient_flow.png" not in page  # the first compare's plot stays in the folder, not on this page
    assert "lstm__systems" not in page and "gru__systems" in page


def test_decode_profiles_are_timed_again_with_a_new_set_of_mixers(tmp_path):
    compare(tmp_path, TINY, mixers=["lstm"], progress=False, gradients=False)
    compare(tmp_path, TINY, mixers=["lstm", "gru"], progress=False, gradients=False)
    runs = tmp_path / "runs"
    lstm = json.loads((runs / "lstm__systems.json").read_text())
    assert lstm["settings"]["decoded_with"] == ["gru", "lstm"]  # timed round-robin with gru, not reused alone
    assert json.loads((runs / "lstm__systems.json.prev").read_text())["settings"]["decoded_with"] == ["lstm"]


def test_a_task_subset_reports_only_the_tasks_it_ran(tmp_path):
    suite = Suite("tiny", 8_000, 1, (_adding(12, 6), Entry("copy", "T=5", {"seq_len": 5, "batch_size": 4}, 4,
                  "val_accuracy")), decode_contexts=(8, 16), throughput_lengths=(16,), gradient_length=8,
                  timing_cap_s=0.3)  # fmt: skip
    paths = compare(tmp_path, suite, mixers=["lstm"], tasks=["copy"], progress=False, gradients=False)
    table = paths["table"].read_text(encoding="utf-8")
    assert "copy" in table and "adding" not in table
    assert not any("adding" in line for line in paths["summary"])


@pytest.mark.parametrize("suite", ["quick", "timeseries", "translation"])
def test_compare_never_writes_over_a_folder_of_the_users_files(tmp_path, capsys, suite):
    """A folder holding files but no earlier compare (no runs/) is refused before any work, for every suite;
    so is a file where the folder should be. A compare's own folder (runs/) is reused as before."""
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "table.md").write_text("USER DATA", encoding="utf-8")
    extra = ["--minutes", "1"] if suite == "translation" else []
    assert main(["compare", "--suite", suite, *extra, "--out", str(mine)]) == 2
    assert "holds files but no earlier compare" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["table.md"]
    assert (mine / "table.md").read_text(encoding="utf-8") == "USER DATA"
    afile = tmp_path / "afile"
    afile.write_text("mine", encoding="utf-8")
    assert main(["compare", "--suite", suite, *extra, "--out", str(afile)]) == 2
    assert "is a file" in capsys.readouterr().err and afile.read_text(encoding="utf-8") == "mine"


def test_check_out_folder_accepts_new_empty_and_earlier_compare_folders(tmp_path):
    from seqlab.lab.records import check_out_folder

    (tmp_path / "empty").mkdir()
    (tmp_path / "earlier" / "runs").mkdir(parents=True)
    (tmp_path / "earlier" / "table.md").write_text("an earlier compare's table", encoding="utf-8")
    for name in ("new", "empty", "earlier"):
        assert check_out_folder(tmp_path / name) == tmp_path / name
    with pytest.raises(ValueError, match="--out is empty"):
        check_out_folder(" ")
