"""``seqlab compare --suite timeseries``: every registered token mixer forecasting real series at matched
parameter counts, measured against the naive, seasonal-naive and least-squares linear forecasts.

For each data set (``seqlab.tasks.timeseries.ForecastTask`` with the series' default context, horizon and
season m, direct mode) every mixer of ``seqlab.layers.list_mixers()`` is trained on the same backbone (2
layers, pre-norm, the mixer's own block layout) with d_model chosen by the lab's matcher
(``seqlab.lab.budget.match_width``) and, where that lands more than 10 % off the budget and the block has
a channel MLP, d_ff nudged until the count is within it. All runs take the same number of steps at the same
batch size and learning rate (no per-mixer tuning), one torch thread each, ``jobs`` at a time; a busy
machine changes only the wall time. Each is then scored on every window of the test span in MASE (scaled
by the training span's in-sample seasonal-naive MAE), beside the baselines' forecasts of the same windows.

Every run is an ordinary checkpoint directory (``DIR/runs/<dataset>-<mixer>``), so ``seqlab eval`` and
``seqlab forecast`` read it; a finished run is reused when the compare is run again with the same settings
(a run trained with other settings is an error, not silently reused).
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from pathlib import Path
from typing import Any

import torch

from seqlab.lab.records import write_output
from seqlab.lab.translation import slug, timed_train, train_all
from seqlab.tasks.base import torch_threads
from seqlab.tasks.timeseries import ForecastTask

DATASETS = ("sunspots", "co2", "sf_temps")
STEPS = 250
BUDGET, TOLERANCE, N_LAYERS = 20_000, 0.10, 2
"""Parameters per model, how far off the matcher may land before d_ff is nudged, and the depth."""
LR, BATCH_SIZE, MODE = 3e-3, 32, "direct"
BASE_PRESET = "test-lm-lstm"
"""The LM preset each run's model starts from; every one of its fields (mixer, d_model, n_layers) is set."""
SCALING = {k: inspect.signature(ForecastTask).parameters[k].default for k in ("scaling", "center")}
"""ForecastTask's default scaling, written into every run so that a run states the frame it trained in."""
BASELINES = {"naive": "naive", "snaive": "seasonal naive", "linear": "linear (least squares)"}
FAMILY_COLORS = {"RNN": "tab:blue", "Transformer": "tab:orange", "SSM": "tab:green"}


def matched_fields(mixer: str, base: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """(LM config fields, parameters) within TOLERANCE of BUDGET where the block allows it."""
    fields, n = _matched(mixer, tuple(sorted(base.items())))
    return dict(fields), n


@functools.cache
def _matched(mixer: str, base_items: tuple) -> tuple[tuple, int]:
    """:func:`matched_fields`, remembered: each count builds a model on the meta device, a few ms apiece."""
    from seqlab.lab.budget import count, lm_fields, match_width
    from seqlab.layers.mixer import mixer_spec

    base = dict(base_items)
    d_model, n = match_width(mixer, BUDGET, base)
    if abs(n - BUDGET) <= TOLERANCE * BUDGET or not mixer_spec(mixer).channel_mlp:
        return tuple(lm_fields(mixer, d_model, base).items()), n
    lo, hi = 0, 16 * d_model  # the parameter count grows with d_ff: binary search for the budget
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mixer, d_model, {**base, "d_ff": mid}) < BUDGET:
            lo = mid + 1
        else:
            hi = mid
    best = min((max(lo - 1, 0), lo), key=lambda f: abs(count(mixer, d_model, {**base, "d_ff": f}) - BUDGET))
    fields = lm_fields(mixer, d_model, {**base, "d_ff": best})
    return tuple(fields.items()), count(mixer, d_model, {**base, "d_ff": best})


def plan(
    mixers: list[str] | None = None,
    datasets: list[str] | None = None,
    steps: int | None = None,
    seed: int = 0,
    task: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each run's label ('co2 lstm') -> {dataset, mixer, params, run}: ``run`` the run dict it trains."""
    from seqlab.layers import list_mixers
    from seqlab.run import build_task
    from seqlab.tasks.series_data import BUILTIN

    mixers, datasets = list(mixers or list_mixers()), list(datasets or DATASETS)
    for names, pool, what in ((mixers, list_mixers(), "mixer"), (datasets, list(BUILTIN), "dataset")):
        unknown = sorted(set(names) - set(pool))
        if unknown:
            raise ValueError(f"unknown timeseries suite {what}(s) {unknown}; known: {', '.join(pool)}")
    runs, n_steps = {}, steps or STEPS
    for dataset in datasets:
        task_fields = {"name": "forecast", "source": dataset, "mode": MODE, "batch_size": BATCH_SIZE}
        task_fields.update({**SCALING, **(task or {}), "seed": seed})
        sizes = build_task({"task": task_fields}).model_overrides()  # d_input, d_output: set by the task
        for mixer in mixers:
            fields, params = matched_fields(mixer, {"n_layers": N_LAYERS, **sizes})
            model = {k: v for k, v in fields.items() if k not in sizes}
            train = timed_train(n_steps, seed, lr=LR, warmup_steps=max(1, n_steps // 10))
            run = {"model": {"name": BASE_PRESET, **model}, "task": task_fields, "train": train}
            runs[f"{dataset} {mixer}"] = {"dataset": dataset, "mixer": mixer, "params": params, "run": run}
    return runs


def _planned(label: str, spec: dict[str, Any], minutes: float, seed: int) -> dict[str, Any]:
    """The run dict :func:`plan` made (``minutes`` is unused: this suite matches steps, not time)."""
    return spec["run"]


def _finished(out: Path, runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The runs already trained to the end in ``out``, as :func:`_run` reports them (read back, no process
    started); a run directory holding another run than the one asked for is an error, never a stale score."""
    from seqlab.training.checkpoint import load_config, load_trainer_state, resumable_checkpoint

    done = {}
    for label, spec in runs.items():
        where = out / "runs" / slug(label)
        if not (where / "latest").is_file():
            continue
        ckpt = resumable_checkpoint(where)
        if load_config(ckpt)["run"] != json.loads(json.dumps(spec["run"])):
            raise ValueError(
                f"{where} holds a run trained with other settings than this compare asks for; "
                "delete it, or give another --out"
            )
        state = load_trainer_state(ckpt, verified=True) or {}
        if state.get("step") == spec["run"]["train"]["steps"]:
            summary = {"elapsed_s": state["elapsed"]}
            done[label] = {"label": label, "steps": state["step"], "seconds": 0.0, "summary": summary}
    return done


def compare_timeseries(
    out: str | Path,
    mixers: list[str] | None = None,
    datasets: list[str] | None = None,
    jobs: int = 2,
    seed: int = 0,
    steps: int | None = None,
    task: dict[str, Any] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Train every (dataset, mixer) run (``jobs`` at a time, one thread each), score it and the baselines
    on the test span, write results.json, table.md and timeseries.png to ``out``. ``steps`` per run
    (default STEPS); ``task`` more ForecastTask fields for every data set (e.g. ``{"scaling": "global"}``);
    ``command`` the line the table names as its source (default: the ``seqlab compare`` call)."""

    out, t0 = Path(out), time.perf_counter()
    runs = plan(mixers, datasets, steps, seed, task)  # a bad data set or mixer is refused before any folder
    (out / "runs").mkdir(parents=True, exist_ok=True)
    trained = _finished(out, runs)
    todo = {label: spec for label, spec in runs.items() if label not in trained}
    print(
        f"timeseries suite: {len(todo)} of {len(runs)} runs to train, {jobs} at a time -> {out}", flush=True
    )
    if todo:
        trained.update(train_all(todo, out, 0.0, seed, jobs, _planned))
    with torch_threads(1):  # scoring is small: one thread, as each run trained, spares a shared machine
        records, datasets_info = _score_all(runs, trained, out)
    minutes = (time.perf_counter() - t0) / 60
    results = {"datasets": datasets_info, "records": records, "minutes": minutes, "trained": len(todo)}
    write_output(out / "results.json", json.dumps(results, indent=1))
    n_steps = steps or STEPS
    command = command or _cli_call(mixers, datasets, steps, seed, jobs)
    return {
        "results": out / "results.json",
        "table": write_table(out, datasets_info, records, (minutes, len(todo), jobs), n_steps, command),
        "plot": write_plot(out, datasets_info, records),
        "minutes": minutes,
        "trained": len(todo),
    }


def _cli_call(mixers, datasets, steps, seed: int, jobs: int) -> str:
    parts = ["seqlab compare --suite timeseries", f"--jobs {jobs}"]
    parts += [f"--mixers {','.join(mixers)}"] if mixers else []
    parts += [f"--tasks {','.join(datasets)}"] if datasets else []
    parts += [f"--steps {steps}"] if steps else []
    return " ".join(parts + ([f"--seed {seed}"] if seed else []))


def _score_all(runs, trained, out: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """(a record per run and per baseline, each data set's description); every task built once."""
    from seqlab.layers.mixer import mixer_spec
    from seqlab.run import build_task
    from seqlab.training.checkpoint import load_model, resolve_checkpoint

    records, tasks, info = [], {}, {}
    for label, spec in runs.items():
        name = spec["dataset"]
        if name not in tasks:
            tasks[name] = task = build_task(spec["run"])
            info[name] = describe_data(task)
            records += _baseline_records(task)
        model = load_model(resolve_checkpoint(out / "runs" / slug(label))).eval()
        task = tasks[name]  # as many batches as windows: every window of the split is scored
        test, val = (_scores(task.evaluate(model, len(task.starts[s]), split=s), s) for s in ("test", "val"))
        records.append(
            {
                "dataset": name,
                "forecaster": spec["mixer"],
                "family": mixer_spec(spec["mixer"]).family,
                "d_model": model.config.d_model,
                "d_ff": model.config.ff_width,
                "params": sum(p.numel() for p in model.parameters()),
                "steps": trained[label]["steps"],
                "train_seconds": trained[label]["summary"]["elapsed_s"],
                "test": test,
                "val": val,
            }
        )
        print(f"{label}: test MASE {test['mase']:.3f}", flush=True)
    return records, info


def _scores(metrics: dict[str, float], split: str) -> dict[str, float]:
    return {k.removeprefix(f"{split}_"): v for k, v in metrics.items()}


def _baseline_records(task) -> list[dict[str, Any]]:
    test, val = task.baseline_scores("test"), task.baseline_scores("val")
    return [
        {
            "dataset": task.source,
            "forecaster": key,
            "family": "baseline",
            "test": {k: test[f"{key}_{k}"] for k in ("mae", "rmse", "mase")},
            "val": {k: val[f"{key}_{k}"] for k in ("mae", "rmse", "mase")},
        }
        for key in BASELINES
    ]


def describe_data(task) -> dict[str, Any]:
    """What makes a data set easy or hard: its sizes, the in-sample scales of the naive and seasonal-naive
    forecasts, and the test span's level in training standard deviations (a level never seen in training)."""
    a, b = task.spans["train"]
    lo, hi = task.spans["test"]
    y = task.target
    return {
        "points": task.n_points,
        "unit": task.unit,
        "context": task.context,
        "horizon": task.horizon,
        "season": task.season,
        "scaling": f"{task.scaling}" + (f" ({task.center})" if task.scaling == "window" else ""),
        "test_windows": len(task.origins("test")),
        "naive_scale": float(abs(y[a + 1 : b] - y[a : b - 1]).mean()),
        "snaive_scale": task.scale,
        "test_shift_sigma": float((y[lo:hi].mean() - task.mean[0]) / task.std[0]),
    }


def _mase(records, dataset: str, forecaster: str) -> float:
    return next(
        r["test"]["mase"] for r in records if r["dataset"] == dataset and r["forecaster"] == forecaster
    )


def verdicts(info: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """The plain statement: per data set, which mixers beat the seasonal-naive and the linear baseline."""
    lines = ["## Verdict", ""]
    for name in info:
        s, lin = _mase(records, name, "snaive"), _mase(records, name, "linear")
        rs = [r for r in records if r["dataset"] == name and r["family"] != "baseline"]
        groups = {
            "beat both": [r for r in rs if r["test"]["mase"] < min(s, lin)],
            "beat only the seasonal naive": [r for r in rs if s > r["test"]["mase"] >= lin],
            "beat only the linear": [r for r in rs if lin > r["test"]["mase"] >= s],
            "beat neither": [r for r in rs if r["test"]["mase"] >= max(s, lin)],
        }
        said = "; ".join(f"{k}: {', '.join(r['forecaster'] for r in v) or 'none'}" for k, v in groups.items())
        lines.append(f"- **{name}** (seasonal naive {s:.3f}, linear {lin:.3f}): {said}.")
    return [*lines, ""]


def _summary(info: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """Test MASE, a row per forecaster and a column per data set; ✓ where a mixer beats both baselines."""
    names = list(dict.fromkeys(r["forecaster"] for r in records))
    lines = ["| test MASE | " + " | ".join(info) + " |", "|---|" + "---:|" * len(info)]
    for f in names:
        cells = []
        for d in info:
            mase = _mase(records, d, f)
            best = min(_mase(records, d, "snaive"), _mase(records, d, "linear"))
            mark = " ✓" if f not in BASELINES and mase < best else ""
            cells.append(f"{mase:.3f}{mark}")
        lines.append(f"| {BASELINES.get(f, f)} | " + " | ".join(cells) + " |")
    return [*lines, "", "✓: beats both the seasonal-naive and the linear baseline.", ""]


def dataset_table(name: str, d: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"### {name}: {d['points']} {d['unit']}ly points, context {d['context']}, horizon {d['horizon']}, "
        f"m = {d['season']}, {d['test_windows']} test windows, scaling {d['scaling']}",
        "",
        f"training span: in-sample MAE of the one-step naive forecast {d['naive_scale']:.4g}, of the "
        f"seasonal naive (the MASE scale) {d['snaive_scale']:.4g}; the test span's mean lies "
        f"{d['test_shift_sigma']:+.1f} training σ from the training mean",
        "",
        "| forecaster | family | d_model | d_ff | parameters | test MASE | test MAE | test RMSE | val MASE "
        "| train s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rs = [r for r in records if r["dataset"] == name]
    for r in sorted(rs, key=lambda r: (r["family"] != "baseline", r["test"]["mase"])):
        t, base = r["test"], r["family"] == "baseline"
        sizes = "| | | |" if base else f"| {r['d_model']} | {r['d_ff']} | {r['params']:,} |"
        lines.append(
            f"| {BASELINES.get(r['forecaster'], r['forecaster'])} | {r['family']} {sizes} {t['mase']:.3f} "
            f"| {t['mae']:.4g} | {t['rmse']:.4g} | {r['val']['mase']:.3f} "
            f"| {'' if base else format(r['train_seconds'], '.0f')} |"
        )
    return [*lines, ""]


def write_table(out: Path, info, records, wall: tuple[float, int, int], steps: int, command: str) -> Path:
    """table.md: the setup, the verdict, test MASE per forecaster and data set, then a table per data set.
    ``wall``: (minutes of the call, runs trained in it (the others were reused), runs at once)."""
    import platform

    from seqlab.lab.report import cpu_name

    runs = [r for r in records if r["family"] != "baseline"]
    lines = [
        "# Forecasting real series with every token mixer, at matched parameter counts",
        "",
        f"- machine: {cpu_name()}, 1 torch thread per run; torch {torch.__version__}, Python "
        f"{platform.python_version()}, {platform.system()}",
        f"- command: `{command}`",
        f"- wall time: {wall[0]:.1f} min (evaluation included), {wall[1]} of the {len(runs)} runs trained in "
        f"it{'' if wall[1] == len(runs) else ', the others reused'}, {wall[2]} at a time; training alone "
        f"{sum(r['train_seconds'] for r in runs) / 60:.1f} min summed over the runs",
        f"- every mixer: {N_LAYERS} layers, {BUDGET:,} parameters ± {TOLERANCE:.0%} (d_model by "
        f"`seqlab.lab.budget.match_width`, then d_ff where needed), mode `{MODE}`, {steps} steps of batch "
        f"{BATCH_SIZE}, AdamW lr {LR} with a 10 % warmup and a cosine; no per-mixer tuning",
        "- windows lie wholly inside one chronological split (70 / 15 / 15 %); MASE scaled by the training "
        "span's in-sample seasonal-naive MAE (m per data set), averaged over every test window and every "
        "step of the horizon",
        "- single seed: differences of a few hundredths of MASE are within run-to-run noise",
        "",
        *verdicts(info, records),
        *_summary(info, records),
    ]
    for name, d in info.items():
        lines += dataset_table(name, d, records)
    return write_output(out / "table.md", "\n".join(lines))


def write_plot(out: Path, info: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    from seqlab.lab.records import write_figure
    from seqlab.viz.figures import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(info), figsize=(4.2 * len(info), 3.8), squeeze=False)
    for ax, name in zip(axes[0], info, strict=True):
        rs = [r for r in records if r["dataset"] == name and r["family"] != "baseline"]
        ax.bar(
            range(len(rs)), [r["test"]["mase"] for r in rs], color=[FAMILY_COLORS[r["family"]] for r in rs]
        )
        for key, style in (("snaive", "--"), ("linear", ":"), ("naive", "-.")):
            ax.axhline(_mase(records, name, key), color="black", ls=style, lw=1, label=BASELINES[key])
        ax.set_xticks(range(len(rs)), [r["forecaster"] for r in rs], rotation=60, ha="right", fontsize=8)
        ax.set_title(f"{name} (m = {info[name]['season']}, scaling {info[name]['scaling']})", fontsize=10)
        ax.set_ylabel("test MASE (lower is better; bars by family)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return write_figure(fig, out / "timeseries.png")
