"""Settings of the time-series tasks that used to pass silently: a continuous label column (one class per
distinct value), a label that is also an input, a feature named twice or naming the target, and the words
``seqlab forecast`` uses for a series too short for its checkpoint."""

from __future__ import annotations

import argparse
import logging

import numpy as np
import pytest

from seqlab.tasks import series_data as sd
from seqlab.tasks import timeseries
from seqlab.tasks.series_labels import MAX_CLASSES
from seqlab.tasks.timeseries import ForecastTask, SeriesClassificationTask


def _csv(path, columns: dict[str, list]) -> str:
    names = list(columns)
    rows = zip(*(columns[n] for n in names), strict=True)
    path.write_text(",".join(names) + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return str(path)


def _wave(n: int, phase: float = 0.0) -> list[float]:
    return np.round(10 + np.sin(np.arange(n) / 5 + phase), 4).tolist()


# ---- a label column that looks continuous ------------------------------------------------------------------


def test_a_built_in_continuous_label_is_refused_naming_the_setting_and_its_count():
    with pytest.raises(ValueError, match=r"task.label='temp_max' looks continuous: its 67 distinct values"):
        SeriesClassificationTask("seattle_weather", label="temp_max")


def test_a_csv_label_of_measurements_is_refused(tmp_path):
    src = _csv(tmp_path / "m.csv", {"a": _wave(300), "temp": _wave(300, 1.0)})
    with pytest.raises(ValueError, match=r"task.label='temp'.*not all whole \(e\.g\..*--task.column=temp"):
        SeriesClassificationTask(src, label="temp", features="a", context=6)


def test_whole_numbers_written_as_floats_are_class_codes(tmp_path):
    codes = [["0.0", "1.0", "2.0"][t % 3] for t in range(120)]
    src = _csv(tmp_path / "c.csv", {"a": _wave(120), "level": codes})
    task = SeriesClassificationTask(src, label="level", features="a", context=6)
    assert task.classes == ["0.0", "1.0", "2.0"]


def test_more_classes_than_one_per_two_rows_is_refused(tmp_path):
    n = 200  # a row number as the label: every class once
    src = _csv(tmp_path / "i.csv", {"a": _wave(n), "row": list(range(n))})
    with pytest.raises(
        ValueError, match=r"task.label='row' holds 200 distinct values in 200 rows .*\(100 here\)"
    ):
        SeriesClassificationTask(src, label="row", features="a", context=6)
    half = [t // 2 for t in range(n)]  # each class twice: at the bound, accepted
    ok = SeriesClassificationTask(
        _csv(tmp_path / "h.csv", {"a": _wave(n), "c": half}), label="c", features="a"
    )
    assert len(ok.classes) == n // 2


def test_more_than_max_classes_is_refused_however_long_the_series(tmp_path):
    n = 4 * (MAX_CLASSES + 1)  # each of MAX_CLASSES + 1 names four times
    names = [f"k{t % (MAX_CLASSES + 1)}" for t in range(n)]
    src = _csv(tmp_path / "k.csv", {"a": _wave(n), "name": names})
    with pytest.raises(ValueError, match=r"holds 1,001 distinct values .* at most 1,000 classes"):
        SeriesClassificationTask(src, label="name", features="a", context=6)


# ---- a label is never an input -----------------------------------------------------------------------------


def _coded(tmp_path, n: int = 150) -> str:
    return _csv(tmp_path / "w.csv", {"a": _wave(n), "b": _wave(n, 2.0), "kind": [t % 3 for t in range(n)]})


def test_a_label_named_in_the_features_is_refused_naming_both_settings(tmp_path):
    with pytest.raises(ValueError, match=r"task.label='kind' is also in task.features \(a,kind\)"):
        SeriesClassificationTask(_coded(tmp_path), label="kind", features="a,kind", context=6)


def test_a_label_among_the_default_features_is_left_out_of_them_with_a_warning(tmp_path, monkeypatch, caplog):
    src = _coded(tmp_path)
    monkeypatch.setitem(timeseries.DEFAULT_FEATURES, src, "a,kind,b")
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        task = SeriesClassificationTask(src, label="kind", context=6)
    assert task.series.columns == ["a", "b"] and task.features == "a,b"
    assert task.model_overrides()["d_input"] == 2
    assert (
        "task.label='kind' is one of the default features; left out of the inputs, which are a,b"
        in caplog.text
    )


# ---- task.features: each column once, never the target -----------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"features": "wind,wind"}, r"task.features \(wind,wind\) names 'wind' more than once"),
        ({"features": "wind, temp_min ,wind"}, "names 'wind' more than once"),
        (
            {"features": "temp_max,wind"},
            r"names the target column 'temp_max' \(task.column, seattle_weather's default\)",
        ),
        ({"column": "wind", "features": "temp_min,wind"}, r"target column 'wind' \(task.column\), which is"),
    ],
)
def test_forecast_features_are_each_named_once_and_never_the_target(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ForecastTask("seattle_weather", **kwargs)


def test_classification_features_are_each_named_once():
    with pytest.raises(ValueError, match=r"names 'temp_max' more than once"):
        SeriesClassificationTask(features="temp_max,wind,temp_max")


# ---- a series too short for its windows -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "val", "test"), [(16, 0.15, 0.15), (1, 0.15, 0.15), (7, 0.1, 0.3), (40, 0.2, 0.2)]
)
def test_min_points_is_the_length_from_which_every_series_splits(length, val, test):
    need = sd.min_points(length, val, test)

    def fits(n):
        try:
            return min(b - a for a, b in sd.split_spans(n, val, test).values()) >= length
        except sd.SeriesTooShort:
            return False

    assert all(fits(n) for n in range(need, need + 300))
    assert not fits(need - 1)


def test_forecast_builds_from_min_points_and_refuses_one_fewer(tmp_path):
    need = sd.min_points(12 + 4, 0.15, 0.15)
    ForecastTask(_csv(tmp_path / "ok.csv", {"y": _wave(need)}), column="y", context=12, horizon=4)
    with pytest.raises(sd.SeriesTooShort) as caught:
        ForecastTask(_csv(tmp_path / "short.csv", {"y": _wave(need - 1)}), column="y", context=12, horizon=4)
    assert caught.value.n_points == need - 1


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"csv": None, "dataset": None, "column": None, "interpolate": False, **kw})


def test_seqlab_forecast_says_how_many_points_came_and_how_many_it_needs(tmp_path):
    from seqlab.commands_series import _task

    saved = ForecastTask(_csv(tmp_path / "long.csv", {"y": _wave(200)}), column="y", context=12, horizon=4)
    short = _csv(tmp_path / "short.csv", {"y": _wave(30)})
    for n, path in ((30, short), (2, _csv(tmp_path / "tiny.csv", {"y": _wave(2)}))):
        with pytest.raises(ValueError) as caught:
            _task(saved.describe(), _args(csv=path, column="y"))
        said = str(caught.value)
        assert f"has {n} points, too few for this checkpoint" in said
        assert "(12 + 4) = 16 points, so it needs at least 104 points; give a longer series" in said
        assert "frac" not in said and "larger fraction" not in said


def test_seqlab_forecast_refuses_a_column_the_checkpoint_reads_as_a_feature(tmp_path):
    from seqlab.commands_series import _task

    src = _csv(tmp_path / "two.csv", {"y": _wave(200), "z": _wave(200, 1.0)})
    saved = ForecastTask(src, column="y", features="z", context=12, horizon=4).describe()
    with pytest.raises(ValueError, match=r"--column z: this checkpoint reads that column as an input"):
        _task(saved, _args(csv=src, column="z"))
