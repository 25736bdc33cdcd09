"""Time-series tasks: splits, windows, normalization, metrics, baselines, rolling forecasts and CSV errors."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from seqlab.layers import list_mixers
from seqlab.models import create
from seqlab.models.lm import LM, LMConfig
from seqlab.tasks import create_task
from seqlab.tasks.series_data import BUILTIN, LinearAR, naive_forecast, window_frame
from seqlab.tasks.timeseries import (
    ForecastTask,
    SeriesClassificationTask,
    rolling_forecast,
    rolling_forecast_ref,
)
from seqlab.training import TrainConfig, Trainer


def _csv(path, columns: dict[str, list]) -> str:
    """A CSV file with the given columns (values written as given: strings stay strings)."""
    names = list(columns)
    rows = zip(*(columns[n] for n in names), strict=True)
    path.write_text(",".join(names) + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return str(path)


def _index_series(tmp_path, n: int = 200) -> str:
    """y_t = t: a denormalized value names its own position."""
    return _csv(tmp_path / "ramp.csv", {"y": list(range(n)), "z": [2 * t for t in range(n)]})


# ---- splits, windows, normalization ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rolling", "direct"])
def test_no_window_crosses_a_split_boundary(tmp_path, mode):
    # global z-scores, so that a value names its index; the windows are the same under window scaling
    src = _index_series(tmp_path)
    task = ForecastTask(src, column="y", context=10, horizon=5, mode=mode, batch_size=16, scaling="global")
    mean, std = task.mean[0], task.std[0]
    ends = [task.spans[s] for s in ("train", "val", "test")]
    assert ends[0][1] == ends[1][0] and ends[1][1] == ends[2][0] and ends[2][1] == 200  # a partition
    for split, (a, b) in task.spans.items():
        seen = set()
        for index in range(40):  # several epochs of every split
            batch = task.get_batch(split, index)
            for key in ("x", "y"):
                t = (batch[key][..., 0] if key == "x" or mode == "rolling" else batch[key]) * std + mean
                seen |= set(np.rint(t.numpy()).astype(int).ravel().tolist())
        assert seen and min(seen) >= a and max(seen) < b, (split, min(seen), max(seen), a, b)
        assert max(seen) == b - 1  # and the windows reach the span's last point


def test_classification_windows_stay_inside_their_split_and_labels_line_up(tmp_path):
    n = 120
    src = _csv(
        tmp_path / "c.csv",
        {"t": list(range(n)), "parity": ["even" if t % 2 == 0 else "odd" for t in range(n)]},
    )
    for day, shift in (("next", 1), ("last", 0)):
        task = SeriesClassificationTask(
            src, label="parity", features="t", context=6, target=day, batch_size=8
        )
        for split, (a, b) in task.spans.items():
            batch = task.get_batch(split, 3)
            t = np.rint((batch["x"][..., 0] * task.std[0] + task.mean[0]).numpy()).astype(int)  # (b, c)
            assert t.min() >= a and t.max() + shift < b
            labelled_day = t[:, -1] + shift
            assert (batch["y"].numpy() == labelled_day % 2).all()  # class 0 'even', 1 'odd'


def test_a_label_number_written_two_ways_is_one_class(tmp_path, caplog):
    """'1' and '1.0' (a column that went through floats) are one class, not two; names stay classes."""
    n = 120
    labels = [["0", "1", "1.0", "2"][t % 4] for t in range(n)]
    src = _csv(tmp_path / "c.csv", {"t": list(range(n)), "level": labels})
    with caplog.at_level("WARNING", logger="seqlab.tasks"):
        task = SeriesClassificationTask(src, label="level", features="t", context=6, batch_size=8)
    assert task.series.classes == ["0", "1", "2"]
    assert "writes a number more than one way" in caplog.text and "'1' = '1.0'" in caplog.text
    ids = task.series.labels[:8].tolist()
    assert ids == [0, 1, 1, 2, 0, 1, 1, 2]


@pytest.mark.parametrize("scaling", ["global", "window"])
@pytest.mark.parametrize("mode", ["rolling", "direct"])
def test_normalization_and_training_batches_ignore_the_validation_and_test_spans(tmp_path, scaling, mode):
    rng = np.random.default_rng(0)
    y = rng.standard_normal(300).cumsum()
    changed = y.copy()
    changed[210:] = 1000 + 50 * rng.standard_normal(90)  # only val (210..255) and test (255..300) differ
    tasks = [
        ForecastTask(
            _csv(tmp_path / f"{i}.csv", {"y": v.tolist()}),
            column="y",
            context=12,
            horizon=4,
            mode=mode,
            scaling=scaling,
        )
        for i, v in enumerate((y, changed))
    ]
    assert tasks[0].spans == tasks[1].spans and tasks[0].spans["train"] == (0, 210)
    assert tasks[0].mean == tasks[1].mean and tasks[0].std == tasks[1].std
    for index in (0, 7, 30):
        a, b = (t.get_batch("train", index) for t in tasks)
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])
    assert not torch.equal(tasks[0].get_batch("test", 0)["x"], tasks[1].get_batch("test", 0)["x"])
    assert tasks[0].mean[0] == pytest.approx(y[:210].mean()) and tasks[0].std[0] == pytest.approx(
        y[:210].std()
    )


def test_batches_are_a_pure_function_of_seed_split_and_index(tmp_path):
    src = _random_walk(tmp_path)  # not a ramp: every window of a ramp is the same in its own frame
    a, b = (ForecastTask(src, column="y", context=8, horizon=2) for _ in range(2))
    other = ForecastTask(src, column="y", context=8, horizon=2, seed=1)
    assert torch.equal(a.get_batch("train", 5)["x"], b.get_batch("train", 5)["x"])
    assert not torch.equal(a.get_batch("train", 5)["x"], other.get_batch("train", 5)["x"])
    assert torch.equal(a.get_batch("val", 2)["y"], other.get_batch("val", 2)["y"])  # val: in order


# ---- metrics and baselines --------------------------------------------------------------------------------


@pytest.mark.parametrize("season", [1, 4])
def test_seasonal_naive_scores_mase_one_on_the_training_span(tmp_path, season):
    y = np.random.default_rng(1).standard_normal(240).cumsum() * 3 + 50
    src = _csv(tmp_path / "rw.csv", {"y": y.tolist()})
    task = ForecastTask(src, column="y", context=season, horizon=1, season=season)
    scores = task.baseline_scores("train")
    assert scores["snaive_mase"] == pytest.approx(1.0, rel=1e-12)
    assert (scores["naive_mase"] == pytest.approx(1.0, rel=1e-12)) == (season == 1)
    assert task.baseline_scores("test")["snaive_mase"] != pytest.approx(1.0, rel=1e-6)


def test_naive_mase_is_one_on_co2_training_weeks_with_m_1():
    task = ForecastTask("co2", context=1, horizon=1, season=1)
    assert task.n_points == 2284 and np.isfinite(task.target).all()  # the 59 gaps interpolated
    assert task.baseline_scores("train")["naive_mase"] == pytest.approx(1.0, rel=1e-12)


def test_the_linear_baseline_recovers_an_ar2_process(tmp_path):
    rng = np.random.default_rng(2)
    phi1, phi2, y = 0.6, -0.3, np.zeros(6000)
    for t in range(2, len(y)):
        y[t] = 5 + phi1 * y[t - 1] + phi2 * y[t - 2] + rng.standard_normal()
    task = ForecastTask(_csv(tmp_path / "ar2.csv", {"y": y.tolist()}), column="y", context=2, horizon=1)
    np.testing.assert_allclose(task.linear.lag_coefficients[0], [phi1, phi2], atol=0.05)
    assert task.linear.coef[-1, 0] == pytest.approx(5, abs=0.5)  # the intercept
    assert task.baseline_scores("test")["linear_mase"] < task.baseline_scores("test")["naive_mase"]


def test_linear_ar_fits_an_exact_linear_recurrence_exactly():
    y = np.zeros(50)
    y[:2] = 1.0, 2.0
    for t in range(2, 50):
        y[t] = 1.5 * y[t - 1] - 0.5 * y[t - 2] + 0.1
    origins = np.arange(2, 45)
    ar = LinearAR(order=2, horizon=3).fit(y, origins)
    np.testing.assert_allclose(ar.predict(y, origins), y[origins[:, None] + np.arange(3)], atol=1e-8)


# ---- forecasting through the model ------------------------------------------------------------------------


class Persistence(torch.nn.Module):
    """A forecaster that repeats the value it was last fed, in whatever frame it is fed: rolling, every
    feature's next value is its current one; direct, all H steps of the target are its current value."""

    def __init__(self, horizon: int | None = None, dtype=torch.float64):
        super().__init__()
        self.horizon = horizon  # None: a rolling model
        self.anchor = torch.nn.Parameter(torch.zeros((), dtype=dtype))  # forecast_z reads dtype and device

    def forward(self, x, return_state=False):
        out = x if self.horizon is None else x[..., :1].expand(*x.shape[:2], self.horizon)
        return (out, None) if return_state else out

    def step(self, x, state):
        return x, state


def _random_walk(tmp_path, n: int = 300, level: float = 1000.0) -> str:
    y = level + np.random.default_rng(3).standard_normal(n).cumsum()  # far from 0: rounding would show
    return _csv(tmp_path / "rw.csv", {"y": [repr(v) for v in y.tolist()]})


@pytest.mark.parametrize("center", ["mean", "last"])
@pytest.mark.parametrize("mode", ["rolling", "direct"])
def test_window_scaling_maps_the_scaled_last_value_back_to_the_naive_forecast(tmp_path, mode, center):
    task = ForecastTask(_random_walk(tmp_path), column="y", context=8, horizon=4, mode=mode, center=center)
    assert task.scaling == "window"  # the default
    model = Persistence(None if mode == "rolling" else 4)  # float64: the frame reaches it unrounded
    for split in ("train", "val", "test"):
        origins = task.origins(split)
        pred, naive = task.forecast(model, origins), naive_forecast(task.target, origins, 4)
        if center == "last":  # the last value is 0 in its frame: 0 * scale + y_{o-1} is y_{o-1} bit for bit
            np.testing.assert_array_equal(pred, naive)
        else:  # (y - mean) / scale * scale + mean: one float64 rounding or two
            np.testing.assert_allclose(pred, naive, rtol=1e-14, atol=0)
    float32 = task.forecast(
        Persistence(None if mode == "rolling" else 4, torch.float32), task.origins("test")
    )
    np.testing.assert_allclose(float32, naive_forecast(task.target, task.origins("test"), 4), rtol=1e-6)


def test_window_scaling_scores_mase_one_for_the_naive_forecast_on_the_training_span(tmp_path):
    task = ForecastTask(_random_walk(tmp_path), column="y", context=1, horizon=1, season=1, mode="direct")
    scores = task.evaluate(Persistence(1), split="train")
    assert scores["train_mase"] == scores["train_naive_mase"] == pytest.approx(1.0, rel=1e-12)


def test_window_scaling_carries_a_level_the_training_span_never_saw(tmp_path):
    y = 10 + np.sin(2 * np.pi * np.arange(300) / 12) + 0.1 * np.random.default_rng(4).standard_normal(300)
    shifted = y.copy()
    shifted[210:] += 50.0  # val and test 50 units up: far outside the training range
    tasks = {
        (scaling, name): ForecastTask(
            _csv(tmp_path / f"{name}.csv", {"y": v.tolist()}),
            column="y",
            context=12,
            horizon=3,
            mode="direct",
            scaling=scaling,
        )
        for scaling in ("global", "window")
        for name, v in (("y", y), ("shifted", shifted))
    }
    torch.manual_seed(0)
    model = create("test-lm-lstm", **tasks["window", "y"].model_overrides()).eval()
    origins = tasks["window", "y"].origins("test")
    a, b = (tasks["window", name].forecast(model, origins) for name in ("y", "shifted"))
    np.testing.assert_allclose(b - a, 50.0, atol=1e-5)  # the same forecast, 50 units up
    a, b = (tasks["global", name].forecast(model, origins) for name in ("y", "shifted"))
    assert np.abs(b - a - 50.0).max() > 1  # global z-scores: the model meets a level it never saw


@pytest.mark.parametrize("mixer", list_mixers())
def test_rolling_forecasts_under_window_scaling_equal_the_reference_in_the_context_frame(
    tmp_path, mixer, monkeypatch
):
    task = ForecastTask(_random_walk(tmp_path), column="y", context=10, horizon=5)
    torch.manual_seed(0)
    model = LM(LMConfig(mixer=mixer, d_model=16, n_layers=2, d_input=1, d_output=1), dtype=torch.float64)
    origins = task.origins("test")[::7]
    fast = task.forecast(model.eval(), origins)
    ctx = task.target[(origins - 10)[:, None] + np.arange(10)][..., None]  # (n, c, 1) in the series' units
    loc, scale = window_frame(ctx, task.center, task.floor)  # the frame of the context, for all 5 steps
    frame = torch.from_numpy((ctx - loc) / scale)
    ref = rolling_forecast_ref(model, frame, 5)[..., 0].numpy() * scale[:, :, 0] + loc[:, :, 0]
    np.testing.assert_allclose(fast, ref, rtol=1e-10, atol=1e-9)
    monkeypatch.setattr("seqlab.tasks.timeseries.rolling_forecast", rolling_forecast_ref)
    np.testing.assert_allclose(task.forecast(model, origins), fast, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("mixer", list_mixers())
def test_rolling_forecast_through_step_equals_the_full_forward_on_the_growing_sequence(mixer):
    torch.manual_seed(0)
    model = LM(
        LMConfig(mixer=mixer, d_model=16, n_layers=2, d_input=2, d_output=2), dtype=torch.float64
    ).eval()
    context = torch.randn(3, 7, 2, dtype=torch.float64)
    fast, ref = rolling_forecast(model, context, 5), rolling_forecast_ref(model, context, 5)
    assert fast.shape == (3, 5, 2)
    torch.testing.assert_close(fast, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("mode", ["rolling", "direct"])
def test_a_tiny_lstm_beats_the_naive_forecast_of_a_sine(tmp_path, mode):
    t = np.arange(400)
    y = np.sin(2 * np.pi * t / 16) + 0.05 * np.random.default_rng(0).standard_normal(len(t))
    task = ForecastTask(
        _csv(tmp_path / "sine.csv", {"y": y.tolist()}), column="y", context=16, horizon=4, mode=mode
    )
    torch.manual_seed(0)
    model = create("test-lm-lstm", **task.model_overrides())
    before = task.evaluate(model, split="test")["test_mase"]
    config = TrainConfig(steps=40, lr=1e-2, warmup_steps=5, eval_every=0, save_every=0, progress=False)
    Trainer(model, task, config).fit()
    scores = task.evaluate(model, split="test")
    assert scores["test_mase"] < 0.5 * scores["test_naive_mase"] and scores["test_mase"] < before
    assert scores["test_mae"] <= scores["test_rmse"]


def test_direct_forecasts_refuse_horizons_past_the_trained_one(tmp_path):
    task = ForecastTask(_index_series(tmp_path), column="y", context=8, horizon=3, mode="direct")
    model = create("test-lm-lstm", **task.model_overrides())
    assert task.forecast(model, task.origins("val")[:2], 2).shape == (2, 2)
    with pytest.raises(ValueError, match="3 steps at most"):
        task.forecast(model, task.origins("val")[:2], 4)


def test_describe_is_json_and_rebuilds_the_same_task(tmp_path):
    task = ForecastTask(_index_series(tmp_path), column="y", features="z", context=8, horizon=3)
    info = json.loads(json.dumps(task.describe()))
    assert info["columns"] == ["y", "z"] and task.model_overrides() == {"d_input": 2, "d_output": 2}
    keys = ("source", "column", "features", "context", "horizon", "mode", "season", "scaling", "center")
    settings = {k: info[k] for k in keys}
    again = create_task("forecast", **settings)
    assert torch.equal(again.get_batch("train", 3)["x"], task.get_batch("train", 3)["x"])


def test_built_in_series_load_offline_with_their_defaults():
    for name in ("sunspots", "nile", "elnino", "sf_temps", "seattle_weather"):
        task = ForecastTask(name)
        assert task.context == BUILTIN[name].context and np.isfinite(task.target).all()
    assert ForecastTask("elnino").n_points == 61 * 12 and ForecastTask("sf_temps").season == 24


def test_seattle_weather_classification_has_five_classes_and_a_majority_baseline():
    task = SeriesClassificationTask()
    assert task.classes == ["drizzle", "fog", "rain", "snow", "sun"] and task.majority == "sun"
    model = create("test-lm-lstm", **task.model_overrides())
    scores = task.evaluate(model, split="test")
    assert 0 <= scores["test_macro_f1"] <= 1 and 0 < scores["test_majority_accuracy"] < 1
    assert scores["test_majority_f1"] < scores["test_majority_accuracy"]  # one class predicted of five


# ---- mistakes ---------------------------------------------------------------------------------------------


def test_a_non_numeric_value_is_an_error_naming_its_row_and_column(tmp_path):
    src = _csv(tmp_path / "bad.csv", {"date": ["a", "b", "c"], "y": ["1.0", "2.5", "n/a?"]})
    with pytest.raises(ValueError, match=r"column 'y' holds 'n/a\?' at data row 3 \(line 4"):
        ForecastTask(src, column="y")


def test_gaps_are_an_error_unless_interpolation_is_asked_for(tmp_path, caplog):
    y = [str(float(t)) for t in range(200)]
    y[50] = y[51] = ""
    src = _csv(tmp_path / "gaps.csv", {"y": y})
    with pytest.raises(ValueError, match=r"missing a value at data row 51 \(2 missing.*gaps=interpolate"):
        ForecastTask(src, column="y", context=8, horizon=2)
    with caplog.at_level(logging.INFO, logger="seqlab.tasks"):
        task = ForecastTask(src, column="y", context=8, horizon=2, gaps="interpolate")
    np.testing.assert_allclose(task.target[48:54], [48, 49, 50, 51, 52, 53])
    assert "2 missing value(s) filled by linear interpolation" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"column": "nope"}, r"has no column 'nope'; its columns: \['y', 'z'\]"),
        ({}, "a CSV source needs column=NAME"),
        ({"column": "y", "horizon": 40}, r"the val span has 30 points, fewer than context \+ horizon"),
        ({"column": "y", "context": 4, "season": 7}, "context >= season"),
        ({"column": "y", "mode": "recursive"}, "mode must be one of"),
        ({"column": "y", "scaling": "revin"}, "scaling must be one of"),
    ],
)
def test_mistakes_get_a_clear_error(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ForecastTask(_index_series(tmp_path), **kwargs)


def test_an_unknown_source_says_what_a_source_is():
    with pytest.raises(ValueError, match=r"built-in series .*sunspots.* or an existing \.csv file"):
        ForecastTask("no-such-series")


class _Counting(Persistence):
    """Persistence that counts the windows it is shown."""

    seen = 0

    def forward(self, x, return_state=False):
        self.seen += x.size(0)
        return super().forward(x, return_state)


def test_evaluate_scores_max_batches_of_windows_spread_over_the_split_and_the_baselines_on_the_same(tmp_path):
    task = ForecastTask(
        _random_walk(tmp_path, n=3000), column="y", context=8, horizon=1, season=1, mode="direct"
    )
    every = task.starts["val"]
    assert len(every) > 4 * task.batch_size
    picked = task.eval_starts("val", 4)
    assert len(picked) == 4 * task.batch_size and picked[0] == every[0] and picked[-1] == every[-1]
    assert np.all(np.diff(picked) > 0) and np.ptp(np.diff(picked)) <= 1  # evenly spread, none twice
    np.testing.assert_array_equal(task.eval_starts("val", 1000), every)  # all when they fit
    model = _Counting(1)
    scores = task.evaluate(model, max_batches=4)
    assert model.seen == 2 * len(picked)  # the forecasts and the teacher-forced loss, nothing more
    assert scores["val_mase"] == pytest.approx(scores["val_naive_mase"], rel=1e-12)  # the same windows
    assert scores["val_naive_mase"] != pytest.approx(task.baseline_scores("val")["naive_mase"], rel=1e-6)
    with pytest.raises(ValueError, match="max_batches"):
        task.evaluate(model, max_batches=0)


def test_a_constant_target_and_a_target_periodic_at_its_season_are_named_apart():
    from seqlab.tasks.series_data import seasonal_scale

    with pytest.raises(ValueError, match=r"the target is constant \(5\) over the training span's 40 points"):
        seasonal_scale(np.full(40, 5.0), 1)
    with pytest.raises(ValueError, match=r"repeats itself exactly every season m=2 points.*task\.season"):
        seasonal_scale(np.tile([1.0, 3.0], 20), 2)
    assert seasonal_scale(np.tile([1.0, 3.0], 20), 1) == 2.0
