"""`seqlab train` on the time-series tasks and `seqlab forecast` end to end on tiny checkpoints, through a
parser that registers the command with :func:`seqlab.commands_series.add_forecast` as cli.py does."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from seqlab.cli import main
from seqlab.commands_series import add_forecast
from seqlab.tasks.timeseries import ForecastTask

N = 200  # points of the sine: splits 140 / 30 / 30


def _forecast(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="seqlab")
    add_forecast(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["forecast", *argv])
    return args.func(args)


def _train(out, *argv: str) -> None:
    common = ["--train.steps=6", "--train.eval_batches=1", "--train.progress=false", "--out", str(out)]
    assert main(["train", "--model.name=test-lm-lstm", *argv, *common]) == 0


@pytest.fixture(scope="module")
def sine(tmp_path_factory):
    path = tmp_path_factory.mktemp("series") / "sine.csv"
    y = 10 + np.sin(2 * np.pi * np.arange(N) / 12)
    path.write_text("date,y\n" + "\n".join(f"d{t},{v:.6f}" for t, v in enumerate(y)) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(sine, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    task = ["--task.name=forecast", f"--task.source={sine}", "--task.column=y", "--task.context=12"]
    _train(root / "rolling", *task, "--task.horizon=4")
    _train(root / "direct", *task, "--task.horizon=3", "--task.mode=direct")
    return root


def _rows(printed: str) -> list[list[float]]:
    """The numeric rows of the table the command prints."""
    rows = []
    for line in printed.splitlines():
        try:
            rows.append([float(x) for x in line.split()])
        except ValueError:
            continue
    return rows


def test_train_writes_a_forecasting_checkpoint_with_its_normalization(runs, sine):
    config = json.loads(next((runs / "rolling").glob("checkpoints/step-*/config.json")).read_text())
    assert config["task"]["name"] == "forecast" and config["model"]["d_input"] == 1
    assert config["task"]["mean"] == ForecastTask(str(sine), column="y", context=12, horizon=4).mean


def test_a_checkpoint_saved_before_window_scaling_is_read_with_global_scaling(runs):
    from seqlab.commands_series import _task

    saved = json.loads(next((runs / "rolling").glob("checkpoints/step-*/config.json")).read_text())["task"]
    args = argparse.Namespace(csv=None, dataset=None, column=None, interpolate=False)
    assert _task(saved, args).scaling == saved["scaling"] == "window"  # the checkpoint's own
    old = {k: v for k, v in saved.items() if k not in ("scaling", "center")}
    assert _task(old, args).scaling == "global"  # what every forecasting run trained in before it existed


def test_forecast_after_the_end_prints_one_row_per_step_and_draws_them(runs, capsys, tmp_path):
    png = tmp_path / "f.png"
    assert _forecast("--checkpoint", str(runs / "rolling"), "--horizon", "7", "--out", str(png)) == 0
    printed = capsys.readouterr().out
    rows = _rows(printed)
    assert [int(r[0]) for r in rows] == list(range(N, N + 7))  # t = T ... T + H - 1
    assert all(len(r) == 2 and np.isfinite(r[1]) for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in printed


def test_forecast_over_the_test_span_scores_against_the_truth(runs, sine, capsys):
    assert _forecast("--checkpoint", str(runs / "direct"), "--horizon", "3", "--test") == 0
    printed = capsys.readouterr().out
    rows = _rows(printed)
    start = N - 30
    truth = 10 + np.sin(2 * np.pi * np.arange(start, start + 3) / 12)
    assert [int(r[0]) for r in rows] == [start, start + 1, start + 2]
    np.testing.assert_allclose([r[2] for r in rows], truth, rtol=1e-3)
    assert "mase" in printed and "seasonal naive mase" in printed and "linear mase" in printed


def test_forecast_reads_the_series_from_another_csv(runs, tmp_path, capsys):
    other = tmp_path / "other.csv"
    other.write_text("v\n" + "\n".join(str(5 + (t % 7)) for t in range(150)) + "\n")
    argv = ["--checkpoint", str(runs / "rolling"), "--csv", str(other), "--column", "v", "--horizon", "2"]
    assert _forecast(*argv) == 0
    assert [int(r[0]) for r in _rows(capsys.readouterr().out)] == [150, 151]


def test_a_csv_with_a_gap_names_this_command_s_flag_and_then_forecasts_with_it(runs, tmp_path, capsys):
    gappy = tmp_path / "gappy.csv"
    gappy.write_text("v\n" + "\n".join("" if t == 40 else str(5 + (t % 7)) for t in range(150)) + "\n")
    argv = ["--checkpoint", str(runs / "rolling"), "--csv", str(gappy), "--column", "v", "--horizon", "2"]
    with pytest.raises(ValueError, match=r"missing a value at data row 41 .* \(--interpolate\) to fill") as e:
        _forecast(*argv)
    assert "--task." not in str(e.value)
    assert _forecast(*argv, "--interpolate") == 0
    assert [int(r[0]) for r in _rows(capsys.readouterr().out)] == [150, 151]


def test_series_classification_trains_from_the_command_line(tmp_path):
    out = tmp_path / "weather"
    _train(out, "--task.name=series_classification", "--task.context=7")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if r["split"] == "val"][-1]
    assert 0 <= val["val_macro_f1"] <= 1 and 0 < val["val_majority_accuracy"] < 1
    with pytest.raises(ValueError, match="'series_classification' run, not a forecasting run"):
        _forecast("--checkpoint", str(out), "--horizon", "2")


@pytest.mark.parametrize(
    ("run", "argv", "match"),
    [
        ("rolling", ["--horizon", "31", "--test"], r"longer than the test span \(30 points\)"),
        ("rolling", ["--horizon", "201"], r"longer than the series itself \(200 points\)"),
        ("direct", ["--horizon", "4"], "trained to forecast 3 steps at most"),
        ("rolling", ["--horizon", "2", "--csv", "x.csv"], "--csv and --column go together"),
        (
            "rolling",
            ["--horizon", "2", "--dataset", "nile"],
            r"nile has 100 points, too few .* \(12 \+ 4\) = 16 points, so it needs at least 104",
        ),
    ],
)
def test_forecast_mistakes(runs, run, argv, match):
    with pytest.raises(ValueError, match=match):
        _forecast("--checkpoint", str(runs / run), *argv)


def test_a_csv_with_a_non_number_is_refused(runs, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("v\n" + "\n".join(["1", "2", "three", "4"] * 40) + "\n")
    with pytest.raises(ValueError, match=r"column 'v' holds 'three' at data row 3"):
        _forecast("--checkpoint", str(runs / "rolling"), "--csv", str(bad), "--column", "v", "--horizon", "2")


def test_forecast_on_the_training_file_honours_another_column(runs, sine, tmp_path, capsys):
    two = tmp_path / "two.csv"
    lines = sine.read_text().splitlines()
    two.write_text(
        "\n".join([lines[0] + ",z", *(f"{ln},{100 + i}" for i, ln in enumerate(lines[1:]))]) + "\n"
    )
    _train(tmp_path / "run", "--task.name=forecast", f"--task.source={two}", "--task.column=y", "--task.context=12",
           "--task.horizon=4")  # fmt: skip
    capsys.readouterr()
    assert (
        _forecast("--checkpoint", str(tmp_path / "run"), "--horizon", "2", "--csv", str(two), "--column", "z")
        == 0
    )
    assert " z: " in capsys.readouterr().out  # the column asked for, not the training column y


def test_a_relative_data_path_is_saved_absolute(sine, tmp_path, monkeypatch):
    monkeypatch.chdir(sine.parent)
    _train(tmp_path / "rel", "--task.name=forecast", f"--task.source={sine.name}", "--task.column=y",
           "--task.context=12", "--task.horizon=4")  # fmt: skip
    saved = json.loads((tmp_path / "rel" / "checkpoints").glob("step-*/config.json").__next__().read_text())
    assert saved["run"]["task"]["source"] == str(sine.resolve())  # forecast and eval work from any folder


def test_an_out_file_of_no_figure_format_is_refused_before_the_work(runs, capsys, tmp_path):
    with pytest.raises(ValueError, match=r"\.xyz is not a figure format"):
        from seqlab.outfiles import fresh_file

        fresh_file(str(tmp_path / "fc.xyz"), None)


def test_forecast_refuses_its_own_series_changed_since_training(sine, tmp_path):
    copy = tmp_path / "own.csv"
    copy.write_text(sine.read_text())
    _train(tmp_path / "run", "--task.name=forecast", f"--task.source={copy}", "--task.column=y", "--task.context=12",
           "--task.horizon=4", "--task.scaling=global")  # fmt: skip
    assert _forecast("--checkpoint", str(tmp_path / "run"), "--horizon", "2") == 0
    lines = copy.read_text().splitlines()
    copy.write_text(
        "\n".join([lines[0], *(f"{d},{float(v) * 10}" for d, v in (ln.split(",") for ln in lines[1:]))])
    )
    with pytest.raises(
        ValueError, match=r"own.csv changed since the checkpoint was trained on it: mean is now"
    ):
        _forecast("--checkpoint", str(tmp_path / "run"), "--horizon", "2")
