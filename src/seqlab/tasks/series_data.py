r"""Real series for the time-series tasks: the data, chronological splits, windows, normalization, the
forecast metrics and the baselines every model is measured against.

Notation: ``T`` points in the series, ``F`` input features (column 0 is the forecast target), ``c`` context
length, ``H`` horizon, ``m`` the seasonal period, ``n`` windows.

Built-in series ship inside installed packages and are read offline (``get_rdataset``, which downloads, is
never called): statsmodels' ``sunspots`` (yearly), ``nile`` (yearly), ``elnino`` (monthly, its 61 × 12 table
read row by row) and ``co2`` (weekly, 59 gaps), and vega_datasets' ``sf_temps`` (hourly) and
``seattle_weather`` (daily, four numeric columns and a five-class ``weather`` label). Any CSV file is a
series too: ``source=path.csv, column=NAME``.

Gaps: a built-in series' interior gaps (co2's 59 missing weeks) are filled by linear interpolation between
their neighbours, logged once with their count; a CSV's gaps are an error naming the row and column unless
``gaps="interpolate"`` is asked for. Missing values at either end are dropped, never invented.

Seasonal periods ``m`` follow the M4 competition's conventions (Makridakis et al. 2020), where they exist:
``m = 1`` for yearly data (the ~11-year solar cycle varies between 9 and 14 years, so it is not a fixed
season; ``season=11`` sets it), 12 monthly, 24 hourly; weekly co2 takes ``m = 52`` (its annual cycle, where
M4 used 1) and daily weather ``m = 1``.

Metrics (Hyndman & Koehler 2006, "Another look at measures of forecast accuracy", eq. for MASE):

    MAE  = mean |y - ŷ|          RMSE = sqrt(mean (y - ŷ)²)
    MASE = MAE / s,   s = 1/(T_train - m) Σ_{t=m}^{T_train-1} |y_t - y_{t-m}|

with ``s`` the in-sample MAE of the one-step seasonal-naive forecast on the training span, so the seasonal
naive forecast scores MASE = 1 on the training span's one-step windows by construction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqlab.tasks.base import SPLITS, MissingDependencyError, check_fraction
from seqlab.tasks.series_baselines import LinearAR, naive_forecast, seasonal_naive_forecast
from seqlab.tasks.series_labels import label_not_an_input, macro_f1, majority_class, read_labels
from seqlab.tasks.source_settings import refuse

log = logging.getLogger("seqlab.tasks")

INSTALL_HINT = "pip install statsmodels vega_datasets"

__all__ = [
    "BUILTIN",
    "WINDOW_STD_FLOOR",
    "LinearAR",
    "Series",
    "SeriesTooShort",
    "feature_names",
    "forecast_scores",
    "label_not_an_input",
    "load_series",
    "macro_f1",
    "majority_class",
    "min_points",
    "naive_forecast",
    "seasonal_naive_forecast",
    "seasonal_scale",
    "split_spans",
    "window_frame",
    "window_starts",
]


@dataclass
class Series:
    """A loaded series: ``values`` (T, F) float64, column 0 the target; ``labels`` (T,) class ids or None."""

    name: str
    values: np.ndarray
    columns: list[str]
    season: int
    unit: str
    labels: np.ndarray | None = None
    classes: list[str] | None = None


@dataclass(frozen=True)
class BuiltIn:
    """A series that ships in a package: how to read it (a pandas DataFrame) and its defaults."""

    load: Callable
    target: str
    season: int
    unit: str
    context: int
    horizon: int
    label: str | None = None


def _statsmodels(name: str):
    try:
        import importlib

        return importlib.import_module(f"statsmodels.datasets.{name}").load_pandas().data
    except ImportError as e:
        raise MissingDependencyError(f"the {name!r} series ships with statsmodels: {INSTALL_HINT}") from e


def _vega(name: str):
    try:
        from vega_datasets import local_data
    except ImportError as e:
        raise MissingDependencyError(f"the {name!r} series ships with vega_datasets: {INSTALL_HINT}") from e
    return getattr(local_data, name)()


def _elnino():
    """The 61 × 12 table (a year per row, a month per column) read row by row: one monthly series."""
    import pandas as pd

    table = _statsmodels("elnino").drop(columns="YEAR")
    return pd.DataFrame({"temperature": table.to_numpy().ravel()})


BUILTIN: dict[str, BuiltIn] = {
    "sunspots": BuiltIn(lambda: _statsmodels("sunspots"), "SUNACTIVITY", 1, "year", 24, 8),
    "nile": BuiltIn(lambda: _statsmodels("nile"), "volume", 1, "year", 8, 3),
    "elnino": BuiltIn(_elnino, "temperature", 12, "month", 36, 12),
    "co2": BuiltIn(lambda: _statsmodels("co2"), "co2", 52, "week", 104, 26),
    "sf_temps": BuiltIn(lambda: _vega("sf_temps"), "temp", 24, "hour", 72, 24),
    "seattle_weather": BuiltIn(lambda: _vega("seattle_weather"), "temp_max", 1, "day", 28, 7, "weather"),
}
"""Built-in series: name -> reader, target column, m, time unit, default context and horizon, label."""


# ---- reading --------------------------------------------------------------------------------------------


def _read_frame(source: str):
    """(DataFrame, is_builtin) of a built-in name or a CSV path."""
    if source in BUILTIN:
        return BUILTIN[source].load(), True
    path = Path(source)
    if path.suffix.lower() != ".csv" or not path.is_file():
        raise ValueError(
            f"source must be a built-in series ({', '.join(BUILTIN)}) or an existing .csv file, got {source!r}"
        )
    import pandas as pd

    try:  # every cell as text (numbers are checked per column); a blank line of a one-column file is a gap
        return pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False), False
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a readable CSV file: {e}") from e


def _numeric(frame, name: str, source: str) -> np.ndarray:
    """The column ``name`` as float64, NaN where empty; a non-number is an error naming its row and column."""
    import pandas as pd

    if name not in frame.columns:
        raise ValueError(f"{source} has no column {name!r}; its columns: {list(frame.columns)}")
    raw = frame[name]
    if raw.dtype.kind in "fiu":
        return _finite(raw.to_numpy(dtype=np.float64), name, source)
    text = raw.astype(str).str.strip()
    empty = text.isin(["", "NA", "NaN", "nan", "null"])
    values = pd.to_numeric(text.where(~empty), errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(np.isnan(values) & ~empty.to_numpy())
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"{source}: column {name!r} holds {text.iloc[i]!r} at data row {i + 1} (line {i + 2} of the file), "
            f"which is not a number ({len(bad)} such value(s)); fix the file or choose another column"
        )
    return _finite(values, name, source)


MAX_ABS = 1e150
"""The largest magnitude a series may hold: its statistics square it, and float64 overflows near 1.3e154."""


def _finite(values: np.ndarray, name: str, source: str) -> np.ndarray:
    """``values`` if none is infinite or above MAX_ABS (NaN marks a gap); else an error naming its row and column."""
    bad = np.flatnonzero(np.abs(values) > MAX_ABS)  # an infinity too; NaN compares False
    if len(bad):
        i = int(bad[0])
        why = "not a finite number" if np.isinf(values[i]) else f"beyond ±{MAX_ABS:g}, too large to square"
        raise ValueError(
            f"{source}: column {name!r} holds {values[i]} at data row {i + 1} (line {i + 2} of the file), "
            f"which is {why} ({len(bad)} such value(s)); fix or rescale the file, or choose another column"
        )
    return values


def fill_gaps(
    values: np.ndarray, columns: list[str], source: str, interpolate: bool
) -> tuple[np.ndarray, slice]:
    """(T, F) with NaN -> (values without gaps, the rows kept): rows with a missing value at either end are
    dropped, interior gaps linearly interpolated when ``interpolate``, otherwise an error naming the first."""
    ok = ~np.isnan(values).any(axis=1)  # (T,)
    if not ok.any():
        raise ValueError(f"{source}: every row has a missing value in {columns}")
    first, last = int(np.argmax(ok)), len(ok) - int(np.argmax(ok[::-1]))
    if first or last < len(ok):
        log.info("%s: dropped %d row(s) with missing values at the ends", source, first + len(ok) - last)
    values = values[first:last].copy()
    gaps = np.isnan(values)
    if gaps.any() and not interpolate:
        row, col = (int(i) for i in np.argwhere(gaps)[0])
        raise ValueError(
            f"{source}: column {columns[col]!r} is missing a value at data row {first + row + 1} "
            f"({int(gaps.sum())} missing in all); set gaps=interpolate (--task.gaps=interpolate) to fill "
            "interior gaps linearly, or fix the file"
        )
    if gaps.any():
        t = np.arange(len(values))
        for j in np.flatnonzero(gaps.any(axis=0)):
            miss = gaps[:, j]
            values[miss, j] = np.interp(t[miss], t[~miss], values[~miss, j])
        log.info("%s: %d missing value(s) filled by linear interpolation", source, int(gaps.sum()))
    return values, slice(first, last)


def feature_names(text: str | None) -> list[str]:
    """The column names of a comma-separated ``task.features``; one named twice is refused."""
    names = [x.strip() for x in (text or "").split(",") if x.strip()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        refuse(
            f"task.features ({','.join(names)}) names {', '.join(map(repr, twice))} more than once: "
            "give each column once",
            saved="each kept as often as named: the run was trained with them so",
        )
    return names


def load_series(
    source: str,
    column: str | None = None,
    features: list[str] | None = None,
    label: str | None = None,
    gaps: str = "error",
    season: int | None = None,
) -> Series:
    """A built-in series or a CSV file: ``column`` the target (built-ins: their default), ``features`` more
    input columns (the target among them is refused), ``label`` a column of class names (classification).
    Gaps: see :func:`fill_gaps`."""
    frame, builtin = _read_frame(source)
    spec, given = BUILTIN.get(source) if builtin else None, column
    column = column or (spec.target if spec else None)
    if column is None:
        raise ValueError(
            f"a CSV source needs column=NAME (--task.column=NAME); its columns: {list(frame.columns)}"
        )
    if column in (features := features or []):
        whose = "" if given else f", {source}'s default"
        refuse(
            f"task.features ({','.join(features)}) names the target column {column!r} (task.column{whose}), "
            "which is already the model's first input: leave it out of task.features, the extra inputs",
            saved="left out of the extra inputs, as in training",
        )
    columns = [column, *[f for f in features if f != column]]
    values = np.stack([_numeric(frame, c, source) for c in columns], axis=1)  # (T, F)
    values, kept = fill_gaps(values, columns, source, builtin or gaps == "interpolate")
    labels = classes = None
    if label is not None:
        labels, classes = read_labels(frame, label, source)
        labels = labels[kept]
    m = season if season is not None else (spec.season if spec else 1)
    return Series(source, values, columns, m, spec.unit if spec else "step", labels, classes)


# ---- splits and windows ---------------------------------------------------------------------------------


class SeriesTooShort(ValueError):
    """A series too short for its split or its windows; ``n_points`` is its length (a command that cannot
    change the fractions or the window says what it can instead: :func:`min_points`)."""

    def __init__(self, message: str, n_points: int):
        super().__init__(message)
        self.n_points = n_points


def _split_sizes(n_points: int, val_frac: float, test_frac: float) -> tuple[int, int, int]:
    n_test, n_val = round(n_points * test_frac), round(n_points * val_frac)
    return n_points - n_val - n_test, n_val, n_test


def split_spans(n_points: int, val_frac: float, test_frac: float) -> dict[str, tuple[int, int]]:
    """Chronological spans [start, end) of train, val and test: the last ``test_frac`` of the series is the
    test span, the ``val_frac`` before it the validation span, the rest the training span."""
    val_frac, test_frac = check_fraction("val_frac", val_frac), check_fraction("test_frac", test_frac)
    n_train, n_val, n_test = _split_sizes(n_points, val_frac, test_frac)
    if min(n_test, n_val, n_train) < 1:
        raise SeriesTooShort(
            f"{n_points} points cannot be split {1 - val_frac - test_frac:.2f}/{val_frac}/{test_frac}",
            n_points,
        )
    return {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, n_points)}


def min_points(length: int, val_frac: float, test_frac: float) -> int | None:
    """The least length from which on every series splits into spans of at least ``length`` points each
    (None where the fractions leave the training span nothing)."""
    least = min(val_frac, test_frac, 1 - val_frac - test_frac)
    if least <= 0:
        return None
    n = math.ceil((length + 2) / least)  # round() loses at most 1/2 a span, the training span at most 1
    while n > 1 and min(_split_sizes(n - 1, val_frac, test_frac)) >= length:
        n -= 1
    return n


def window_starts(spans: dict[str, tuple[int, int]], length: int, what: str) -> dict[str, np.ndarray]:
    """Start of every window of ``length`` points lying wholly inside each span: no window crosses a split."""
    out = {}
    for split in SPLITS:
        a, b = spans[split]
        if b - a < length:
            raise SeriesTooShort(
                f"the {split} span has {b - a} points, fewer than {what} = {length}; shorten them "
                f"or give the {split} span a larger fraction",
                spans["test"][1],
            )
        out[split] = np.arange(a, b - length + 1)
    return out


class Normalizer:
    r"""z = (x - μ) / σ per feature, μ and σ from the training span only (σ = 1 where a feature is constant)."""

    def __init__(self, train_values: np.ndarray):
        self.mean = train_values.mean(axis=0)  # (F,)
        std = train_values.std(axis=0)
        self.std = np.where(std > 0, std, 1.0)  # (F,)

    def __call__(self, values: np.ndarray) -> np.ndarray:
        return (values - self.mean) / self.std

    def invert(self, z: np.ndarray, feature: int = 0) -> np.ndarray:
        return z * self.std[feature] + self.mean[feature]


WINDOW_STD_FLOOR = 0.1
"""The least scale of a window frame, in the training span's σ: a flat context (a week without rain) must
not blow its forecast up by 1 / std → ∞. It binds on no target window of the built-in series at their
default contexts (the smallest context std is 0.15 σ, co2's)."""


def window_frame(context: np.ndarray, center: str, floor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""(loc, scale), each (n, 1, F), of contexts (n, c, F) in the series' own units, per window and feature:

        loc = x_{c-1} (``center="last"``)  or  1/c Σ_t x_t (``"mean"``);   scale = max(std_t x_t, floor)

    A window then enters the model as (x - loc) / scale and a forecast ẑ leaves it as ẑ scale + loc.
    """
    loc = context[:, -1:] if center == "last" else context.mean(axis=1, keepdims=True)  # (n, 1, F)
    return loc, np.maximum(context.std(axis=1, keepdims=True), floor)  # (n, 1, F) each


# ---- metrics --------------------------------------------------------------------------------------------


def seasonal_scale(train_target: np.ndarray, m: int) -> float:
    """MASE's denominator: the in-sample MAE of the one-step seasonal-naive forecast, mean |y_t - y_{t-m}|."""
    if len(train_target) <= m:
        raise ValueError(
            f"the training span ({len(train_target)} points) must be longer than the season m={m}"
        )
    scale = float(np.abs(train_target[m:] - train_target[:-m]).mean())
    if scale == 0 and np.ptp(train_target) == 0:
        raise ValueError(
            f"the target is constant ({train_target[0]:g}) over the training span's {len(train_target)} points: "
            "there is nothing to learn to forecast, and MASE (error / the naive forecast's) is undefined"
        )
    if scale == 0:
        raise ValueError(
            f"the training span repeats itself exactly every season m={m} points, so the seasonal-naive forecast "
            "has no error and MASE is undefined; choose another season (task.season)"
        )
    return scale


def forecast_scores(pred: np.ndarray, truth: np.ndarray, scale: float) -> dict[str, float]:
    """MAE, RMSE and MASE of forecasts (n, H) against the truth (n, H), in the series' own units."""
    err = pred - truth
    mae = float(np.abs(err).mean())
    return {"mae": mae, "rmse": float(np.sqrt((err**2).mean())), "mase": mae / scale}


def season_lag_ok(context: int, season: int) -> None:
    """The seasonal-naive forecast reads one season back from the origin: the context must reach it."""
    if season > context:
        raise ValueError(
            f"the seasonal-naive baseline needs context >= season (m={season}), got context={context}"
        )
