"""Every registered token mixer forecasting real series, at matched parameter counts, against the baselines.

    python benchmarks/bench_timeseries.py                     # sunspots, co2, sf_temps; 250 steps each
    python benchmarks/bench_timeseries.py --steps 20 --datasets sunspots --mixers lstm,attention   # a smoke run

For each data set (``seqlab.tasks.timeseries.ForecastTask`` with the series' default context, horizon and
season m), every mixer of ``seqlab.layers.list_mixers()`` is trained on the same backbone (2 layers,
pre-norm, the mixer's own block layout) with d_model chosen by the lab's matcher
(``seqlab.lab.budget.match_width``) and, where that lands more than ``--tolerance`` off the budget and the
block has a channel MLP, d_ff nudged until the count is within it. All runs take the same number of steps
at the same batch size and learning rate (no per-mixer tuning), one torch thread, seed 0; a busy machine
changes only the wall time. Each is then scored on every window of the test span, in MASE (scaled by the
training span's in-sample seasonal-naive MAE), beside the naive, seasonal-naive and least-squares linear
forecasts of the same windows.

Writes benchmarks/results/timeseries-<cpu>-torch<version>.md and .png.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from seqlab.lab.budget import count, lm_fields, match_width
from seqlab.lab.report import cpu_name, hardware_slug
from seqlab.layers import list_mixers
from seqlab.layers.mixer import mixer_spec
from seqlab.models import build, make_config
from seqlab.tasks.timeseries import ForecastTask
from seqlab.training import TrainConfig, Trainer

RESULTS = Path(__file__).parent / "results"
FAMILY_COLORS = {"RNN": "tab:blue", "Transformer": "tab:orange", "SSM": "tab:green"}
BASELINES = {"naive": "naive", "snaive": "seasonal naive", "linear": "linear (least squares)"}


@dataclass
class Result:
    dataset: str
    mixer: str
    family: str
    d_model: int
    d_ff: int
    params: int
    seconds: float
    test: dict[str, float]
    val_mase: float


def matched_fields(mixer: str, budget: int, base: dict, tolerance: float) -> tuple[dict, int]:
    """(LM config fields, parameters) within ``tolerance`` of ``budget`` where the block allows it."""
    d_model, n = match_width(mixer, budget, base)
    fields = lm_fields(mixer, d_model, base)
    if abs(n - budget) <= tolerance * budget or not mixer_spec(mixer).channel_mlp:
        return fields, n
    lo, hi = 0, 16 * d_model  # the parameter count grows with d_ff: binary search for the budget
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mixer, d_model, {**base, "d_ff": mid}) < budget:
            lo = mid + 1
        else:
            hi = mid
    best = min((max(lo - 1, 0), lo), key=lambda f: abs(count(mixer, d_model, {**base, "d_ff": f}) - budget))
    fields = lm_fields(mixer, d_model, {**base, "d_ff": best})
    return fields, count(mixer, d_model, {**base, "d_ff": best})


def run_one(task: ForecastTask, mixer: str, args: argparse.Namespace) -> Result:
    base = {"n_layers": args.n_layers, **task.model_overrides()}
    fields, params = matched_fields(mixer, args.budget, base, args.tolerance)
    torch.manual_seed(args.seed)
    model = build("lm", make_config("lm", fields))
    config = TrainConfig(
        steps=args.steps,
        lr=args.lr,
        warmup_steps=max(1, args.steps // 10),
        eval_every=0,
        save_every=0,
        progress=False,
        threads=1,
        seed=args.seed,
        device="cpu",
    )
    t0 = time.perf_counter()
    summary = Trainer(model, task, config).fit()
    seconds = time.perf_counter() - t0
    test = {k.removeprefix("test_"): v for k, v in task.evaluate(model, split="test").items()}
    d_ff = make_config("lm", fields).ff_width
    family = mixer_spec(mixer).family
    return Result(
        task.source, mixer, family, fields["d_model"], d_ff, params, seconds, test, summary["val_mase"]
    )


def baselines(task: ForecastTask) -> dict[str, float]:
    scores = task.baseline_scores("test")
    return {k: scores[f"{k}_mase"] for k in BASELINES}


def _verdict(mase: float, base: dict[str, float]) -> str:
    beats = [BASELINES[k].split(" (")[0] for k in ("snaive", "linear") if mase < base[k]]
    return ", ".join(beats) if beats else "neither"


def describe_data(task: ForecastTask) -> str:
    """What makes a data set easy or hard for the baselines: the two in-sample scales and the test span's
    level in training standard deviations (a level the models never saw must be extrapolated)."""
    a, b = task.spans["train"]
    y = task.target
    naive_scale = float(abs(y[a + 1 : b] - y[a : b - 1]).mean())
    lo, hi = task.spans["test"]
    shift = (y[lo:hi].mean() - task.mean[0]) / task.std[0]
    return (
        f"training span: in-sample MAE of the one-step naive forecast {naive_scale:.4g}, of the seasonal naive "
        f"(the MASE scale) {task.scale:.4g}; the test span's mean lies {shift:+.1f} training σ from the "
        f"training mean"
    )


def dataset_table(task: ForecastTask, results: list[Result], base: dict[str, float]) -> list[str]:
    n_windows = len(task.origins("test"))
    lines = [
        f"### {task.source}: {task.n_points} {task.unit}ly points, context {task.context}, horizon "
        f"{task.horizon}, m = {task.season}, {n_windows} test windows",
        "",
        describe_data(task),
        "",
        "| forecaster | family | d_model | d_ff | parameters | test MASE | test MAE | test RMSE | val MASE "
        "| beats | train s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    scores, val = task.baseline_scores("test"), task.baseline_scores("val")
    for key, label in BASELINES.items():
        lines.append(
            f"| {label} | baseline | | | | {base[key]:.3f} | {scores[f'{key}_mae']:.4g} "
            f"| {scores[f'{key}_rmse']:.4g} | {val[f'{key}_mase']:.3f} | | |"
        )
    for r in sorted(results, key=lambda r: r.test["mase"]):
        lines.append(
            f"| {r.mixer} | {r.family} | {r.d_model} | {r.d_ff} | {r.params:,} | {r.test['mase']:.3f} "
            f"| {r.test['mae']:.4g} | {r.test['rmse']:.4g} | {r.val_mase:.3f} | {_verdict(r.test['mase'], base)} "
            f"| {r.seconds:.0f} |"
        )
    return [*lines, ""]


def verdicts(tasks: dict[str, ForecastTask], results: list[Result], bases: dict) -> list[str]:
    """The plain statement: per data set, which mixers beat the seasonal-naive and the linear baseline."""
    lines = ["## Verdict", ""]
    for name in tasks:
        rs, base = [r for r in results if r.dataset == name], bases[name]
        both = [r.mixer for r in rs if r.test["mase"] < min(base["snaive"], base["linear"])]
        only_s = [r.mixer for r in rs if base["snaive"] > r.test["mase"] >= base["linear"]]
        only_l = [r.mixer for r in rs if base["linear"] > r.test["mase"] >= base["snaive"]]
        neither = [r.mixer for r in rs if r.test["mase"] >= max(base["snaive"], base["linear"])]
        lines.append(
            f"- **{name}** (seasonal naive {base['snaive']:.3f}, linear {base['linear']:.3f}): "
            f"beat both: {', '.join(both) or 'none'}; beat only the seasonal naive: {', '.join(only_s) or 'none'}; "
            f"beat only the linear: {', '.join(only_l) or 'none'}; beat neither: {', '.join(neither) or 'none'}."
        )
    return [*lines, ""]


def write_report(tasks, results, bases, args, wall: float, stem: str) -> Path:
    lines = [
        "# Forecasting real series with every token mixer, at matched parameter counts",
        "",
        f"- machine: {cpu_name()}, 1 torch thread; torch {torch.__version__}, Python "
        f"{platform.python_version()}, {platform.system()}; {datetime.date.today().isoformat()}",
        f"- command: `{' '.join(['python benchmarks/bench_timeseries.py', *sys.argv[1:]])}`",
        f"- wall time: {wall / 60:.1f} min for {len(results)} training runs (evaluation included)",
        f"- every mixer: {args.n_layers} layers, {args.budget:,} parameters ± {args.tolerance:.0%} "
        f"(d_model by `seqlab.lab.budget.match_width`, then d_ff where needed), mode `{args.mode}`, "
        f"{args.steps} steps of batch {args.batch_size}, AdamW lr {args.lr} with a 10 % warmup and a cosine, "
        f"seed {args.seed}; no per-mixer tuning",
        "- windows lie wholly inside one chronological split (70 / 15 / 15 %); normalization from the training "
        "span only; MASE scaled by the training span's in-sample seasonal-naive MAE (m per data set), "
        "averaged over every test window and every step of the horizon",
        "- single seed: differences of a few hundredths of MASE are within run-to-run noise",
        "",
    ]
    lines += verdicts(tasks, results, bases)
    for name, task in tasks.items():
        lines += dataset_table(task, [r for r in results if r.dataset == name], bases[name])
    md = RESULTS / f"{stem}.md"
    RESULTS.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines), encoding="utf-8")
    return md


def plot(tasks, results, bases, path: Path) -> None:
    from seqlab.viz.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False)
    for ax, name in zip(axes[0], tasks, strict=True):
        rs = [r for r in results if r.dataset == name]
        colors = [FAMILY_COLORS[r.family] for r in rs]
        ax.bar(range(len(rs)), [r.test["mase"] for r in rs], color=colors)
        for key, style in (("snaive", "--"), ("linear", ":"), ("naive", "-.")):
            ax.axhline(bases[name][key], color="black", ls=style, lw=1, label=BASELINES[key])
        ax.set_xticks(range(len(rs)), [r.mixer for r in rs], rotation=60, ha="right", fontsize=8)
        ax.set_title(f"{name} (m = {tasks[name].season})", fontsize=10)
        ax.set_ylabel("test MASE (lower is better; bars by family)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="sunspots,co2,sf_temps")
    ap.add_argument("--mixers", default=",".join(list_mixers()))
    ap.add_argument("--budget", type=int, default=20_000, help="parameters per model")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mode", choices=("direct", "rolling"), default="direct")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="timeseries", help="stem of the result files")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    start = time.perf_counter()
    tasks = {
        name: ForecastTask(name, mode=args.mode, batch_size=args.batch_size, seed=args.seed)
        for name in args.datasets.split(",")
    }
    bases = {name: baselines(task) for name, task in tasks.items()}
    results = []
    for name, task in tasks.items():
        for mixer in args.mixers.split(","):
            r = run_one(task, mixer, args)
            results.append(r)
            print(
                f"{name:10} {mixer:17} {r.params:>7,} params  test MASE {r.test['mase']:.3f}  "
                f"(snaive {bases[name]['snaive']:.3f}, linear {bases[name]['linear']:.3f})  {r.seconds:.0f}s",
                flush=True,
            )
    stem = f"{args.name}-{hardware_slug(cpu_name(), 2)}-torch{torch.__version__.split('+')[0]}"
    md = write_report(tasks, results, bases, args, time.perf_counter() - start, stem)
    plot(tasks, results, bases, md.with_suffix(".png"))
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md} and {md.with_suffix('.png')}")


if __name__ == "__main__":
    main()
