"""Series runs trained before a setting was refused (a feature named twice, the target among the features, the
label as an input, a label column that looks continuous) still evaluate, resume and forecast: each refusal is a
warning naming what the rebuilt task does, as training did; a new run giving the setting is still refused."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from seqlab.cli import main
from seqlab.commands_series import add_forecast
from seqlab.tasks import source_settings
from seqlab.tasks.source_settings import rebuilding_saved
from seqlab.tasks.timeseries import ForecastTask, SeriesClassificationTask

N = 200


def _csv(path) -> str:
    t = np.arange(N)
    y, a = 10 + np.sin(2 * np.pi * t / 12), np.cos(t / 7)
    rows = [f"{y[i]:.6f},{a[i]:.6f},{i % 3},{2.5 + np.sin(i):.4f}" for i in range(N)]
    path.write_text("y,a,kind,level\n" + "\n".join(rows) + "\n")
    return str(path)


def _train(out, *argv: str, older: bool = False, steps: int = 4) -> int:
    """``seqlab train``; ``older``: as a seqlab from before the refusals trained (every task built as a saved
    run's, so that each refusal is a warning and the setting trains as it did then)."""
    common = [f"--train.steps={steps}", "--train.eval_batches=1", "--train.progress=false", "--out", str(out)]
    argv = ["train", "--model.name=test-lm-lstm", *argv, *common]
    if not older:
        return main(argv)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            source_settings, "rebuilding_saved", lambda saved=True, described=None: rebuilding_saved(True)
        )
        return main(argv)


def _forecast(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="seqlab")
    add_forecast(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["forecast", *argv])
    return args.func(args)


@pytest.mark.parametrize(
    ("task", "said", "d_input"),
    [
        (["--task.features=a,a"], "names 'a' more than once", 3),  # trained on y, a, a
        (["--task.features=y,a"], "names the target column 'y'", 2),  # the target left out: y, a
    ],
)
def test_a_forecast_run_with_a_refused_feature_setting_evaluates_resumes_and_forecasts(
    tmp_path, caplog, capsys, task, said, d_input
):
    src = _csv(tmp_path / "s.csv")
    args = ["--task.name=forecast", f"--task.source={src}", "--task.column=y", "--task.context=12", *task]
    run = tmp_path / "run"
    assert _train(run, *args) == 2  # refused for a new run
    assert said in capsys.readouterr().err
    assert _train(run, *args, older=True) == 0
    config = json.loads(next(run.glob("checkpoints/step-*/config.json")).read_text())
    assert config["model"]["d_input"] == d_input
    caplog.clear()
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        assert main(["eval", "--checkpoint", str(run)]) == 0
        assert "val_mase" in json.loads(capsys.readouterr().out)
        assert f"the run's saved settings: task.features ({task[0].split('=')[1]}) {said}" in caplog.text
        assert _train(run, *args, "--resume", steps=5) == 0
        assert (run / "latest").read_text().strip().endswith("step-00000005")
        assert _forecast("--checkpoint", str(run), "--horizon", "3", "--test") == 0


def test_a_classification_run_that_read_its_label_evaluates_with_a_warning(tmp_path, caplog, capsys):
    src = _csv(tmp_path / "s.csv")
    args = ["--task.name=series_classification", f"--task.source={src}", "--task.label=kind"]
    args += ["--task.features=y,kind", "--task.context=6"]
    run = tmp_path / "run"
    assert _train(run, *args) == 2
    assert "task.label='kind' is also in task.features (y,kind)" in capsys.readouterr().err
    assert _train(run, *args, older=True) == 0
    caplog.clear()
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        assert main(["eval", "--checkpoint", str(run)]) == 0
    assert "val_accuracy" in json.loads(capsys.readouterr().out)
    assert "kept as an input, as in training" in caplog.text


def test_a_saved_continuous_label_makes_one_class_per_value_as_in_training(tmp_path, caplog):
    src = _csv(tmp_path / "s.csv")
    with pytest.raises(ValueError, match="looks continuous"):
        SeriesClassificationTask(src, label="level", features="y", context=6)
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"), rebuilding_saved():
        task = SeriesClassificationTask(src, label="level", features="y", context=6)
    distinct = len({line.split(",")[3] for line in Path(src).read_text().splitlines()[1:]})
    assert f"task.label='level' holds {distinct} distinct values in {N} rows" in caplog.text  # both rules
    assert "looks continuous" in caplog.text and "one class per distinct value, as in training" in caplog.text
    assert len(task.classes) == distinct


def test_saved_features_rebuild_the_columns_the_run_trained_on():
    with rebuilding_saved():
        twice = ForecastTask("seattle_weather", features="wind,wind")
        target = ForecastTask("seattle_weather", features="temp_max,wind")
    assert twice.series.columns == ["temp_max", "wind", "wind"]
    assert target.series.columns == ["temp_max", "wind"] and target.features == "wind"
