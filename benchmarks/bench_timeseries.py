"""Every registered token mixer forecasting real series, at matched parameter counts, against the baselines:
a thin caller of ``seqlab compare --suite timeseries`` (:mod:`seqlab.lab.timeseries` says what is measured).

    python benchmarks/bench_timeseries.py                     # sunspots, co2, sf_temps; 250 steps each
    python benchmarks/bench_timeseries.py --ablation          # and again with the other two scalings
    python benchmarks/bench_timeseries.py --steps 20 --datasets sunspots --mixers lstm,attention  # smoke

Each run trains in its own process on one torch thread, ``--jobs`` at a time, as an ordinary checkpoint
directory under ``--out`` (reused when the benchmark is run again). ``--ablation`` repeats the suite with
each way of scaling the windows (``ForecastTask(scaling=..., center=...)``): the training span's z-scores,
each window's own frame centred on its mean (RevIN), and centred on its last value (NLinear), and appends
their test MASE side by side: the measurement behind ForecastTask's default.

Writes benchmarks/results/timeseries-<cpu>-torch<version>.md and .png, the CPU named by its model name.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from seqlab.lab.report import cpu_name, hardware_slug
from seqlab.lab.timeseries import BASELINES, compare_timeseries
from seqlab.tasks.timeseries import ForecastTask

RESULTS = Path(__file__).parent / "results"
SCALINGS = {
    "global": {"scaling": "global", "center": "last"},  # center is read only under window scaling
    "window (mean)": {"scaling": "window", "center": "mean"},
    "window (last)": {"scaling": "window", "center": "last"},
}
"""The ablation's variants: ForecastTask fields each sets."""


def ablation_table(results: dict[str, dict]) -> list[str]:
    """Test MASE of every forecaster under each scaling, a column per (data set, scaling); the baselines
    do not depend on the scaling, and the last rows count the mixers that beat both baselines."""
    recs = {
        v: json.loads(Path(p["results"]).read_text(encoding="utf-8"))["records"] for v, p in results.items()
    }
    first = next(iter(recs.values()))
    datasets = list(dict.fromkeys(r["dataset"] for r in first))
    cols = [(d, v) for d in datasets for v in recs]
    mase = {(v, r["dataset"], r["forecaster"]): r["test"]["mase"] for v in recs for r in recs[v]}
    lines = [
        "## Scaling ablation: test MASE by how the windows are scaled",
        "",
        "| forecaster | " + " | ".join(f"{d} {v}" for d, v in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for f in dict.fromkeys(r["forecaster"] for r in first):
        cells = " | ".join(f"{mase[(v, d, f)]:.3f}" for d, v in cols)
        lines.append(f"| {BASELINES.get(f, f)} | {cells} |")
    mixers = [f for f in dict.fromkeys(r["forecaster"] for r in first) if f not in BASELINES]
    median = " | ".join(f"{statistics.median(mase[(v, d, m)] for m in mixers):.3f}" for d, v in cols)
    beats = " | ".join(
        f"{sum(mase[(v, d, m)] < min(mase[(v, d, 'snaive')], mase[(v, d, 'linear')]) for m in mixers)} of "
        f"{len(mixers)}"
        for d, v in cols
    )
    return [
        *lines,
        f"| *median over the mixers* | {median} |",
        f"| *mixers beating both baselines* | {beats} |",
        "",
    ]


def default_variant() -> str:
    """The name in SCALINGS of ForecastTask's default scaling."""
    params = inspect.signature(ForecastTask).parameters
    scaling, center = params["scaling"].default, params["center"].default
    return "global" if scaling == "global" else f"window ({center})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=None, help="comma-separated (default: sunspots,co2,sf_temps)")
    ap.add_argument("--mixers", default=None, help="comma-separated (default: every registered mixer)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: the suite's 250)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench-timeseries", help="where the runs are trained (and reused)")
    ap.add_argument("--ablation", action="store_true", help="also the other two scalings, side by side")
    ap.add_argument("--name", default="timeseries", help="stem of the result files")
    args = ap.parse_args()
    split = lambda text: text.split(",") if text else None  # noqa: E731
    command = " ".join(["python benchmarks/bench_timeseries.py", *sys.argv[1:]])
    start = time.perf_counter()
    default = default_variant()
    variants = SCALINGS if args.ablation else {default: SCALINGS[default]}
    results = {
        name: compare_timeseries(
            Path(args.out) / name.replace(" (", "-").rstrip(")"),
            split(args.mixers),
            split(args.datasets),
            jobs=args.jobs,
            seed=args.seed,
            steps=args.steps,
            task=task,
            command=command,
        )
        for name, task in variants.items()
    }
    lines = Path(results[default]["table"]).read_text(encoding="utf-8").splitlines()
    if args.ablation:
        lines += ["", *ablation_table(results)]
    wall = (time.perf_counter() - start) / 60
    lines.insert(1, f"\n- benchmark wall time: {wall:.1f} min in all ({len(variants)} suite(s), runs reused)")
    stem = f"{args.name}-{hardware_slug(cpu_name(), 2)}-torch{torch.__version__.split('+')[0]}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    md = RESULTS / f"{stem}.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.copyfile(results[default]["plot"], md.with_suffix(".png"))
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md} and {md.with_suffix('.png')}")


if __name__ == "__main__":
    main()
