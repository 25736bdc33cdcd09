"""``seqlab forecast``, which :mod:`seqlab.cli` registers with :func:`add_forecast`: a trained forecasting
checkpoint (task ``forecast``) continues a series, printing the numbers and drawing them; and
``seqlab compare --suite timeseries`` (:func:`compare_timeseries_command`, :mod:`seqlab.lab.timeseries`).

    seqlab forecast --checkpoint runs/sunspots --horizon 8                         # after the series' end
    seqlab forecast --checkpoint runs/sunspots --horizon 8 --test --out f.png      # the test span, with truth
    seqlab forecast --checkpoint runs/mine --csv data.csv --column sales --horizon 12

The series is the checkpoint's own unless ``--dataset NAME`` or ``--csv FILE --column NAME`` names another;
it is read, split and normalized exactly as the task does in training (statistics of its own training span,
which for the checkpoint's own series are the ones it trained with), with the checkpoint's context, mode,
scaling and split fractions (a checkpoint saved before ``scaling`` existed was trained on global z-scores).
``--test`` forecasts from the first point of the test span, from the ``context`` values before it, and
scores the forecast against the truth beside the naive, seasonal-naive and linear baselines of that same
origin.
"""

from __future__ import annotations

import argparse
import inspect

import numpy as np

from seqlab.outfiles import add_out_file
from seqlab.run import positive_int

__all__ = ["add_forecast", "compare_timeseries_command", "forecast_command"]


def _forecaster(path: str):
    """(model, the task description saved with it) of a forecasting checkpoint; any other is an error."""
    from seqlab.commands import announce
    from seqlab.training.checkpoint import load_config, load_model, resolve_checkpoint

    where = resolve_checkpoint(path)
    task = load_config(where).get("task") or {}
    if task.get("name") != "forecast":
        raise ValueError(
            f"{where} is a {task.get('name', 'unknown')!r} run, not a forecasting run: train one with "
            "`seqlab train --task.name=forecast --task.source=sunspots --model.name=...`"
        )
    model = load_model(where).eval()
    if getattr(model, "family", None) != "lm":
        raise ValueError(
            f"{where} holds a {getattr(model, 'family', '?')!r} model; forecasting needs an 'lm'"
        )
    announce(where)
    return model, task


def _task(saved: dict, args: argparse.Namespace):
    """The forecasting task of the checkpoint's settings on the series the command names."""
    from seqlab.tasks import create_task
    from seqlab.tasks.series_data import SeriesTooShort, feature_names
    from seqlab.tasks.source_settings import rebuilding_saved
    from seqlab.tasks.timeseries import ForecastTask

    if args.csv is not None and args.dataset is not None:
        raise ValueError("give --csv FILE --column NAME or --dataset NAME, not both")
    if (args.csv is None) != (args.column is None):
        raise ValueError("--csv and --column go together: --csv FILE --column NAME")
    settings = {k: saved[k] for k in inspect.signature(ForecastTask).parameters if k in saved}
    settings.setdefault("scaling", "global")  # checkpoints saved before window scaling existed
    source = args.csv or args.dataset
    same_series = (
        source is not None and source == saved["source"] and args.column in (None, saved.get("column"))
    )
    if source is not None and not same_series:  # another series (or column): its own column and season
        settings.update(source=source, column=args.column, season=None)
    if args.interpolate:
        settings["gaps"] = "interpolate"
    with rebuilding_saved():  # the checkpoint's settings: what they trained with is rebuilt as it trained
        inputs = feature_names(saved.get("features"))
    if args.column is not None and args.column in inputs:
        raise ValueError(
            f"--column {args.column}: this checkpoint reads that column as an input beside its target "
            f"(its features: {','.join(inputs)}); --column names the column to forecast, its first input"
        )
    try:
        with rebuilding_saved():
            return create_task("forecast", **settings)
    except SeriesTooShort as e:
        raise ValueError(_too_short(settings, e.n_points)) from e
    except ValueError as e:
        said = str(e)
        # the data loader's hints, in this command's flags
        for training_flag, flag in _FORECAST_FLAGS.items():
            said = said.replace(training_flag, flag)
        if settings["source"] == saved["source"]:
            raise ValueError(said) from e
        raise ValueError(
            f"{settings['source']} cannot be read with this checkpoint's settings: {said}"
        ) from e


def _too_short(settings: dict, n_points: int) -> str:
    """Why a series is too short for this checkpoint, in what ``seqlab forecast`` can change: the series."""
    from seqlab.tasks.series_data import min_points

    c, h = settings["context"], settings["horizon"]
    val, test = settings.get("val_frac", 0.15), settings.get("test_frac", 0.15)
    need = min_points(c + h, val, test)
    return (
        f"{settings['source']} has {n_points} points, too few for this checkpoint: it reads a series as in "
        f"training, split {1 - val - test:.0%}/{val:.0%}/{test:.0%} into train, val and test spans, each "
        f"holding a whole window of its context + trained horizon ({c} + {h}) = {c + h} points, so it "
        f"needs at least {need} points; give a longer series, or train a checkpoint with a shorter "
        "--task.context (or --task.horizon)"
    )


_FORECAST_FLAGS = {"--task.gaps=interpolate": "--interpolate", "--task.column=NAME": "--column NAME"}


def _origin(task, args: argparse.Namespace) -> int:
    """The index of the first forecast step, after checking that the horizon fits."""
    h, n = args.horizon, task.n_points
    if task.mode == "direct" and h > task.horizon:
        raise ValueError(
            f"--horizon {h}: this direct model was trained to forecast {task.horizon} steps at most"
        )
    if args.test:
        start, end = task.spans["test"]
        if h > end - start:
            raise ValueError(f"--horizon {h} is longer than the test span ({end - start} points); lower it")
        return start
    if h > n:
        raise ValueError(f"--horizon {h} is longer than the series itself ({n} points); lower it")
    return n


def _scores(task, origin: int, pred: np.ndarray, h: int) -> tuple[np.ndarray, dict[str, float]]:
    """(truth (H,), MASE and MAE of the model and MASE of each baseline) at one test origin."""
    from seqlab.tasks.series_data import forecast_scores, naive_forecast, seasonal_naive_forecast

    o = np.array([origin])
    truth = task.truth(o, h)  # (1, H)
    out = forecast_scores(pred[None], truth, task.scale)
    base = {
        "naive": naive_forecast(task.target, o, h),
        "seasonal naive": seasonal_naive_forecast(task.target, o, h, task.season),
    }
    if h <= task.horizon:
        base["linear"] = task.linear.predict(task.target, o)[:, :h]
    out.update({f"{k} mase": forecast_scores(v, truth, task.scale)["mase"] for k, v in base.items()})
    return truth[0], out


def _plot(task, origin: int, pred: np.ndarray, truth: np.ndarray | None, path: str) -> str:
    from seqlab.viz.figures import pyplot, save_figure

    plt = pyplot()
    h = len(pred)
    first = max(0, origin - max(3 * task.context, 2 * h))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(np.arange(first, origin), task.target[first:origin], color="0.3", label="history")
    steps = np.arange(origin, origin + h)
    if truth is not None:
        ax.plot(steps, truth, color="black", ls="--", label="truth")
    ax.plot(steps, pred, color="tab:red", marker=".", label=f"forecast ({task.mode})")
    ax.axvline(origin - 0.5, color="0.7", lw=0.8)
    ax.set_xlabel(f"t ({task.unit}s since the start of the series)")
    ax.set_ylabel(task.column)
    ax.set_title(f"{task.source}: {h}-step forecast from t = {origin}")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return str(save_figure(fig, path))


def forecast_command(args: argparse.Namespace) -> int:
    model, saved = _forecaster(args.checkpoint)
    task = _task(saved, args)
    if (task.source, task.column) == (saved.get("source"), saved.get("column")):  # its own series, unchanged?
        from seqlab.training.run_dir import check_same_description

        check_same_description(task, saved, ("n_points", "mean", "std"), task.source)
    if task.model_overrides()["d_input"] != model.config.d_input:
        raise ValueError(
            f"the checkpoint reads {model.config.d_input} input column(s), the series gives "
            f"{task.columns}; use the columns it was trained on ({saved.get('columns')})"
        )
    origin = _origin(task, args)
    pred = task.forecast(model, np.array([origin]), args.horizon)[0]  # (H,)
    truth, scores = _scores(task, origin, pred, args.horizon) if args.test else (None, {})
    where = "the test span" if args.test else "the end of the series"
    print(
        f"{task.source} {task.column}: {args.horizon}-step {task.mode} forecast from {where} (t = {origin})"
    )
    print(f"{'t':>8} {'forecast':>12}" + (f" {'truth':>12}" if truth is not None else ""))
    for i, value in enumerate(pred):
        print(f"{origin + i:>8} {value:>12.4g}" + (f" {truth[i]:>12.4g}" if truth is not None else ""))
    if scores:
        print("  ".join(f"{k} {v:.4g}" for k, v in scores.items()))
    if args.out:
        print(f"wrote {_plot(task, origin, pred, truth, args.out)}")
    return 0


def compare_timeseries_command(args: argparse.Namespace) -> int:
    """``seqlab compare --suite timeseries``: every mixer (or ``--mixers``) on every data set (``--tasks``:
    sunspots, co2, sf_temps by default, or any built-in series), 250 steps each unless ``--steps``."""
    from pathlib import Path

    from seqlab.lab.timeseries import compare_timeseries

    if getattr(args, "minutes", None) is not None:
        raise ValueError(
            "--minutes sets the translation and captioning suites' time; the timeseries suite counts steps"
        )
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    out = args.out if args.out != "runs/compare" else "runs/compare-timeseries"
    steps = getattr(args, "steps", None)
    paths = compare_timeseries(out, args.mixers, args.tasks, jobs=args.jobs or 2, seed=args.seed, steps=steps)
    print(Path(paths["table"]).read_text(encoding="utf-8"))
    print(f"wrote {paths['results']}, {paths['table']} and {paths['plot']} in {paths['minutes']:.1f} min")
    return 0


def add_forecast(sub) -> None:
    f = sub.add_parser("forecast", help="forecast a series with a trained forecasting checkpoint")
    f.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    f.add_argument("--horizon", type=positive_int, required=True, help="steps to forecast")
    f.add_argument("--csv", help="a CSV file holding the series (with --column); default: the checkpoint's")
    f.add_argument("--column", help="the CSV column to forecast")
    f.add_argument(
        "--dataset", help="a built-in series (sunspots, nile, elnino, co2, sf_temps, seattle_weather)"
    )
    f.add_argument(
        "--test", action="store_true", help="forecast the test span and score it against the truth"
    )
    f.add_argument("--interpolate", action="store_true", help="fill a CSV's interior gaps linearly")
    add_out_file(f, None, "PNG file: the forecast drawn after the history (and against the truth)")
    f.set_defaults(func=forecast_command)
