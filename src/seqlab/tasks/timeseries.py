r"""Time-series tasks on real series: multi-step forecasting and window classification, for any token mixer.

Notation: ``b`` batch, ``t`` time, ``F`` input features (feature 0 is the forecast target), ``c`` context,
``H`` horizon, ``K`` classes, ``z`` a value in the model's frame (see Scaling).

The model is the causal LM stack with float inputs (``d_input = F``) and a linear head (``d_output``), so
every registered token mixer forecasts. Windows lie wholly inside one chronological split (train, val, test:
the series' first 70 %, next 15 %, last 15 % by default), never across a boundary; normalization is fitted
on the training span only. Two forecasting strategies (Ben Taieb et al. 2012, "A review and comparison of
strategies for multi-step ahead time series forecasting", recursive and MIMO):

    mode="rolling":  ẑ_{t+1} = f(z_{≤t})  (b, t, F) -> (b, t, F), trained teacher-forced on the next value at
                     every position; an H-step forecast reads the context once (keeping the model's state),
                     then rolls ``model.step`` H - 1 times, feeding each prediction back in: O(1) per step for
                     the recurrent and SSM mixers, one pass over the KV cache for attention.
    mode="direct":   [ẑ_{t+1}, ..., ẑ_{t+H}] = f(z_{≤t})  (b, t, F) -> (b, t, H), trained at every position
                     and read at the last one.

Scaling (``scaling="window"``, the default): each window enters the model in the frame of its context,
z = (x - loc) / scale per feature, loc the context's mean (``center="mean"``: RevIN's instance normalization,
Kim et al., ICLR 2022, openreview.net/forum?id=cGDAkQo1C0p, no arXiv version, without its learnable affine
map) or last value (``"last"``, as NLinear, Zeng et al. 2023, arXiv 2205.13504), scale its std floored at
0.1 σ_train; a forecast leaves it as ŷ = ẑ scale + loc before any score, all H steps of a rolling forecast
in the frame of its context. ``"global"`` feeds the training span's z-scores, whose level a model must
extrapolate wherever the test span leaves the training range (co2's lies 3.3 training σ above its mean).
The defaults are measured (benchmarks/results/timeseries-amd-epyc-torch2.13.0.md, scaling ablation: 8
mixers, 20k parameters, 250 steps, direct). Median test MASE over the mixers on sunspots, co2, sf_temps:
global 1.80, 16.0, 8.95; window centred on the last value 1.28, 0.76, 7.30, on the mean 1.26, 0.74, 6.34.
Only window scaling forecasts co2 at all (global: 11 × the seasonal naive's error); the mean beat the last
value for 8 of 8 mixers on sf_temps, 6 on co2, 5 on sunspots, and learns faster (a sine, 40 steps).

Scores, in the series' own units (``series_data``): MAE, RMSE and MASE, beside the naive, seasonal-naive and
least-squares linear forecasts of the same windows. Classification (the Seattle weather of the next day, or
of the window's last day, from the preceding days' numbers): accuracy and macro F1 beside the majority.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks import series_data as sd
from seqlab.tasks.base import (
    Batch,
    Task,
    check_choice,
    check_index,
    check_int,
    check_output,
    check_split,
    epoch_rows,
    model_device,
    spread,
)

__all__ = ["TASKS", "ForecastTask", "SeriesClassificationTask", "rolling_forecast", "rolling_forecast_ref"]

Mode = Literal["rolling", "direct"]
Gaps = Literal["error", "interpolate"]
LabelDay = Literal["next", "last"]
Scaling = Literal["global", "window"]
Center = Literal["last", "mean"]
CHUNK = 256
"""Windows forecast at once during evaluation."""
DEFAULT_FEATURES = {"seattle_weather": "precipitation,temp_max,temp_min,wind"}
"""The numeric columns a built-in classification series reads by default."""


# ---- forecasting with any model that speaks the LM protocol ---------------------------------------------


@torch.no_grad()
def rolling_forecast(model, context: Tensor, horizon: int) -> Tensor:
    """(b, c, F) -> (b, H, F): one forward over the context keeping the state, then H - 1 calls of ``step``,
    each fed the previous prediction."""
    out, state = model(context, return_state=True)  # (b, c, F)
    nxt = out[:, -1]  # (b, F) the forecast of the first step
    preds = [nxt]
    for _ in range(horizon - 1):
        nxt, state = model.step(nxt, state)  # (b, F) -> (b, F)
        preds.append(nxt)
    return torch.stack(preds, dim=1)  # (b, H, F)


@torch.no_grad()
def rolling_forecast_ref(model, context: Tensor, horizon: int) -> Tensor:
    """The reference of :func:`rolling_forecast`: the full forward re-run on the growing sequence, O(H c)."""
    seq = context
    for _ in range(horizon):
        nxt = model(seq)[:, -1:]  # (b, 1, F)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[:, context.size(1) :]  # (b, H, F)


@torch.no_grad()
def forecast_z(model, context: Tensor, horizon: int, mode: str) -> Tensor:
    """(n, c, F) contexts in the model's frame -> (n, H) float64 forecasts of the target in it, by CHUNK."""
    p = next(model.parameters())
    outs = []
    for ctx in context.split(CHUNK):
        ctx = ctx.to(device=p.device, dtype=p.dtype)
        if mode == "rolling":
            outs.append(rolling_forecast(model, ctx, horizon)[..., 0])  # (n, H)
        else:
            out = model(ctx)[:, -1]  # (n, H_trained)
            if horizon > out.size(-1):
                raise ValueError(f"this direct model forecasts {out.size(-1)} steps at most, not {horizon}")
            outs.append(out[:, :horizon])
    return torch.cat(outs).double().cpu()


def _eval_mode(model):
    """Put ``model`` in eval mode; returns the function that restores its previous mode."""
    was = getattr(model, "training", False)
    model.eval()
    return lambda: model.train(was)


class _SeriesTask(Task):
    """What both tasks share: the series, its spans, the normalized values and the windows of each split."""

    model_families = ("lm",)
    batch_size: int
    seed: int

    def _prepare(self, series: sd.Series, length: int, what: str, val_frac: float, test_frac: float) -> None:
        self.series, self.length = series, length
        self.spans = sd.split_spans(len(series.values), val_frac, test_frac)
        a, b = self.spans["train"]
        self.norm = sd.Normalizer(series.values[a:b])  # μ, σ of the training span only
        self.z = torch.from_numpy(self.norm(series.values)).float()  # (T, F)
        self.starts = sd.window_starts(self.spans, length, what)  # split -> (n,) window starts
        self.columns, self.unit, self.n_points = list(series.columns), series.unit, len(series.values)
        self.mean, self.std = self.norm.mean.tolist(), self.norm.std.tolist()  # reported by describe()

    def _rows(self, split: str, index: int) -> np.ndarray:
        """(b,) window starts of batch ``index``: shuffled epochs for train, the windows in order otherwise."""
        starts, b = self.starts[check_split(split)], self.batch_size
        if split == "train":
            return starts[epoch_rows(self.seed, len(starts), check_index(index), b).numpy()]
        return starts[(check_index(index) * b + np.arange(b)) % len(starts)]

    def eval_starts(self, split: str, max_batches: int) -> np.ndarray:
        """(n,) the windows ``evaluate`` scores: all of ``split``, or max_batches batches' worth spread evenly."""
        n = check_int("max_batches", max_batches, 1) * self.batch_size
        return spread(self.starts[check_split(split)], n)

    def get_batch(self, split: str, index: int) -> Batch:
        return self._batch(self._rows(split, index))

    def _windows(self, starts: np.ndarray, length: int) -> Tensor:
        idx = torch.as_tensor(starts)[:, None] + torch.arange(length)[None, :]  # (n, L)
        return self.z[idx]  # (n, L, F)


class ForecastTask(_SeriesTask):
    r"""Forecast the next ``horizon`` values of a real series from the ``context`` values before them.

    ``source``: a built-in series (``sunspots``, ``nile``, ``elnino``, ``co2``, ``sf_temps``,
    ``seattle_weather``) or a CSV path with ``column``; ``features``: more input columns, comma-separated
    (in rolling mode the model forecasts them too). ``context``/``horizon``/``season``: None takes the
    series' defaults (``series_data.BUILTIN``; a CSV: 24, 8 and 1). ``ar_order``: lags of the linear
    baseline (None: the context). ``gaps``: a CSV's missing values are an error, or interpolated.
    ``scaling``/``center``: the frame the model sees; the defaults, by measurement: the module docstring.

    Batches: rolling, ``x`` (b, c + H - 1, F) and ``y`` its next values (b, c + H - 1, F); direct, ``x``
    (b, c, F) and ``y`` (b, c, H), the target's next H values after each position; under window scaling
    the whole window in the frame of its first c values (its context), so the teacher-forced positions
    before the last see an affine image of the data. The loss is their MSE in the model's frame.
    ``evaluate`` scores the windows of ``eval_starts`` (all of a split up to ``max_batches`` batches): the
    multi-step forecasts' ``mae``, ``rmse`` and ``mase`` and, on the same windows, the baselines'
    ``naive_mase``, ``snaive_mase`` and ``linear_mase``, with ``loss`` the teacher-forced MSE (model's frame).

    Examples::

        >>> task = ForecastTask("sunspots", mode="direct")
        >>> task.model_overrides()
        {'d_input': 1, 'd_output': 8}
    """

    name = "forecast"
    derived = ("columns", "unit", "n_points", "spans", "mean", "std", "scale")

    def __init__(
        self,
        source: str = "sunspots",
        column: str | None = None,
        features: str | None = None,
        context: int | None = None,
        horizon: int | None = None,
        mode: Mode = "rolling",
        season: int | None = None,
        ar_order: int | None = None,
        gaps: Gaps = "error",
        scaling: Scaling = "window",
        center: Center = "mean",
        val_frac: float = 0.15,
        test_frac: float = 0.15,
        batch_size: int = 32,
        seed: int = 0,
    ):
        self.mode, self.gaps = check_choice("mode", mode, Mode), check_choice("gaps", gaps, Gaps)
        self.scaling = check_choice("scaling", scaling, Scaling)
        self.center = check_choice("center", center, Center)
        self.batch_size, self.seed = check_int("batch_size", batch_size, 1), check_int("seed", seed, 0)
        self.val_frac, self.test_frac = val_frac, test_frac
        if season is not None:
            check_int("season", season, 1)
        series = sd.load_series(source, column, sd.feature_names(features), gaps=gaps, season=season)
        spec = sd.BUILTIN.get(source)
        self.source, self.column, self.season = source, series.columns[0], series.season
        self.features = ",".join(series.columns[1:]) or None
        default = (spec.context, spec.horizon) if spec else (24, 8)
        self.context = check_int("context", default[0] if context is None else context, 1)
        self.horizon = check_int("horizon", default[1] if horizon is None else horizon, 1)
        self.ar_order = check_int("ar_order", self.context if ar_order is None else ar_order, 1)
        if self.ar_order > self.context:
            raise ValueError(f"ar_order={self.ar_order} must not exceed context={self.context}")
        sd.season_lag_ok(self.context, self.season)
        what = f"context + horizon ({self.context} + {self.horizon})"
        self._prepare(series, self.context + self.horizon, what, val_frac, test_frac)
        self.target = series.values[:, 0]  # (T,) the target in its own units
        self.floor = sd.WINDOW_STD_FLOOR * self.norm.std  # (F,) the least window scale, in the series' units
        a, b = self.spans["train"]
        self.scale = sd.seasonal_scale(self.target[a:b], self.season)
        self.linear = sd.LinearAR(self.ar_order, self.horizon).fit(self.target, self.origins("train"))

    def model_overrides(self) -> dict[str, Any]:
        n = len(self.series.columns)
        return {"d_input": n, "d_output": n if self.mode == "rolling" else self.horizon}

    def origins(self, split: str) -> np.ndarray:
        """(n,) the index of the first forecast step of every window of ``split``."""
        return self.starts[check_split(split)] + self.context

    def _framed(self, starts: np.ndarray, length: int) -> tuple[Tensor, np.ndarray, np.ndarray]:
        """(windows (n, L, F) in the model's frame, (x - loc) / scale, and loc, scale (n, 1, F) each): the
        frame of each window's first ``context`` values (global scaling: the training span's μ and σ)."""
        if self.scaling == "global":
            return self._windows(starts, length), self.norm.mean[None, None], self.norm.std[None, None]
        w = self.series.values[starts[:, None] + np.arange(length)[None, :]]  # (n, L, F) float64
        loc, scale = sd.window_frame(w[:, : self.context], self.center, self.floor)  # (n, 1, F) each
        return torch.from_numpy((w - loc) / scale), loc, scale  # float64: cast to the model's dtype later

    def _batch(self, starts: np.ndarray) -> Batch:
        w = self._framed(starts, self.length)[0].float()  # (b, c + H, F)
        if self.mode == "rolling":
            return {"x": w[:, :-1], "y": w[:, 1:]}  # each (b, c + H - 1, F): the next value at every position
        y = w[:, 1:, 0].unfold(1, self.horizon, 1)  # (b, c + H - 1) -> (b, c, H): z_{t+1..t+H} at position t
        return {"x": w[:, : self.context], "y": y.contiguous()}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        device = model_device(model)
        x, y = batch["x"].to(device), batch["y"].to(device)
        (b, t, _), d = x.shape, y.size(-1)
        out = check_output("ForecastTask", model(x), (b, t, d), f"(b, t, d_output={d})")
        mse = F.mse_loss(out.float(), y.float())
        return mse, {"mse": mse.item()}, None

    def forecast(self, model, origins: np.ndarray, horizon: int | None = None) -> np.ndarray:
        """(n, H) forecasts in the series' units, ẑ scale + loc, from the context before each origin."""
        ctx, loc, scale = self._framed(origins - self.context, self.context)  # (n, c, F), (n, 1, F) x 2
        z = forecast_z(model, ctx, horizon or self.horizon, self.mode)  # (n, H)
        return z.numpy() * scale[:, :, 0] + loc[:, :, 0]  # (n, H) x (n, 1) + (n, 1)

    def truth(self, origins: np.ndarray, horizon: int | None = None) -> np.ndarray:
        return self.target[origins[:, None] + np.arange(horizon or self.horizon)[None, :]]  # (n, H)

    def baseline_forecasts(self, origins: np.ndarray) -> dict[str, np.ndarray]:
        """The naive, seasonal-naive and linear forecasts (n, H) of the windows at ``origins``."""
        h, t = self.horizon, self.target
        return {
            "naive": sd.naive_forecast(t, origins, h),
            "snaive": sd.seasonal_naive_forecast(t, origins, h, self.season),
            "linear": self.linear.predict(t, origins),
        }

    def baseline_scores(self, split: str, origins: np.ndarray | None = None) -> dict[str, float]:
        """MAE, RMSE, MASE of each baseline on every window of ``split`` (or at ``origins``): ``naive_mase``..."""
        truth = self.truth(origins := self.origins(split) if origins is None else origins)  # (n, H)
        return {
            f"{name}_{k}": v
            for name, pred in self.baseline_forecasts(origins).items()
            for k, v in sd.forecast_scores(pred, truth, self.scale).items()
        }

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        starts = self.eval_starts(split, max_batches)
        origins, restore = starts + self.context, _eval_mode(model)
        try:
            pred = self.forecast(model, origins)
            chunks = np.array_split(starts, max(1, len(origins) // CHUNK))
            sq = sum(self.loss(model, self._batch(s))[0].item() * len(s) for s in chunks)
        finally:
            restore()
        scores = {"loss": sq / len(origins), **sd.forecast_scores(pred, self.truth(origins), self.scale)}
        base = self.baseline_scores(split, origins)
        scores.update({k: base[k] for k in ("naive_mase", "snaive_mase", "linear_mase")})
        return {f"{split}_{k}": v for k, v in scores.items()}


class SeriesClassificationTask(_SeriesTask):
    r"""Classify windows of a multivariate series: the label of the day after the window (``target="next"``)
    or of its last day (``"last"``) from the ``context`` preceding days' numeric columns.

    Built in: ``seattle_weather``, 1,461 days, features precipitation, temp_max, temp_min and wind, label
    ``weather`` (drizzle, fog, rain, snow, sun). A CSV needs ``label=COLUMN`` and ``features=A,B,...``; a
    label that looks continuous, or is also an input, is refused (``series_labels``).
    The model maps ``x`` (b, c, F) to logits (b, c, K), read at the last position; cross-entropy.
    ``evaluate`` scores the windows of ``eval_starts``: ``accuracy``, ``macro_f1`` and ``loss``, beside the
    training span's majority class (``majority_accuracy``, ``majority_f1``).
    """

    name = "series_classification"
    derived = ("columns", "classes", "unit", "n_points", "spans", "mean", "std", "majority")

    def __init__(
        self,
        source: str = "seattle_weather",
        label: str | None = None,
        features: str | None = None,
        context: int = 14,
        target: LabelDay = "next",
        gaps: Gaps = "error",
        val_frac: float = 0.15,
        test_frac: float = 0.15,
        batch_size: int = 32,
        seed: int = 0,
    ):
        self.target, self.gaps = check_choice("target", target, LabelDay), check_choice("gaps", gaps, Gaps)
        self.context = check_int("context", context, 1)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed, self.val_frac, self.test_frac = check_int("seed", seed, 0), val_frac, test_frac
        spec = sd.BUILTIN.get(source)
        self.source, self.label = source, label or (spec.label if spec else None)
        names = sd.feature_names(features or DEFAULT_FEATURES.get(source))
        if self.label is not None:  # never an input: refused in task.features, left out of the defaults
            names = sd.label_not_an_input(self.label, names, source, defaults=not features)
        if self.label is None or not names:
            raise ValueError(
                f"classifying {source!r} needs label=COLUMN and features=A,B,... (its numeric columns)"
            )
        series = sd.load_series(source, names[0], names[1:], label=self.label, gaps=gaps)
        self.features, self.classes = ",".join(series.columns), list(series.classes)
        self.offset = self.context if target == "next" else self.context - 1  # the labelled day in the window
        self._prepare(series, self.offset + 1, f"the window ({self.offset + 1} days)", val_frac, test_frac)
        where = f"{source}, label column {self.label!r}"
        self.majority_id = sd.majority_class(series.labels, self.classes, self.spans["train"], where)
        self.majority = self.classes[self.majority_id]  # the training span's most frequent class
        self.labels = torch.from_numpy(series.labels)  # (T,)

    def model_overrides(self) -> dict[str, Any]:
        return {"d_input": len(self.series.columns), "d_output": len(self.classes)}

    def _batch(self, starts: np.ndarray) -> Batch:
        x = self._windows(starts, self.context)  # (b, c, F)
        return {"x": x, "y": self.labels[torch.as_tensor(starts) + self.offset]}  # y (b,)

    def _logits(self, model, x: Tensor) -> Tensor:
        (b, t, _), k = x.shape, len(self.classes)
        return check_output("SeriesClassificationTask", model(x), (b, t, k), f"logits (b, t, K={k})")[:, -1]

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        device = model_device(model)
        x, y = batch["x"].to(device), batch["y"].to(device)
        logits = self._logits(model, x).float()  # (b, K)
        loss = F.cross_entropy(logits, y)
        accuracy = (logits.argmax(-1) == y).float().mean().item()
        return loss, {"loss": loss.item(), "accuracy": accuracy}, None

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        batch = self._batch(self.eval_starts(split, max_batches))
        restore, device = _eval_mode(model), model_device(model)
        try:
            logits = torch.cat([self._logits(model, x.to(device)) for x in batch["x"].split(CHUNK)])
        finally:
            restore()
        y, k = batch["y"].numpy(), len(self.classes)
        pred = logits.float().argmax(-1).cpu().numpy()
        majority = np.full_like(y, self.majority_id)
        scores = {
            "loss": F.cross_entropy(logits.float().cpu(), batch["y"]).item(),
            "accuracy": float((pred == y).mean()),
            "macro_f1": sd.macro_f1(pred, y, k),
            "majority_accuracy": float((majority == y).mean()),
            "majority_f1": sd.macro_f1(majority, y, k),
        }
        return {f"{split}_{key}": v for key, v in scores.items()}


TASKS = {"forecast": ForecastTask, "series_classification": SeriesClassificationTask}
"""The registry entries of ``seqlab.tasks``."""
