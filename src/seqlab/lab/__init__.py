"""The lab: ``seqlab compare`` measures the RNN vs Transformer vs SSM table on this machine."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from seqlab.lab.records import check_out_folder
from seqlab.lab.suite import OTHER_SUITES, SUITES, Suite, suite_names


def compare(
    out: str | Path,
    suite: str | Suite = "quick",
    mixers: list[str] | None = None,
    tasks: list[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    gradients: bool = True,
    jobs: int = 1,
    remeasure: tuple[str, ...] = (),
) -> dict:
    """Run a suite and write results.json, table.md and the plots to ``out``. Returns the paths, and under
    "summary" the lines that end a run on a terminal (:func:`summary_lines`).

    ``jobs`` > 1 trains that many runs at once in worker processes of one torch thread each; the decode,
    throughput and memory measurements that follow always run alone. ``remeasure=("systems",)`` trains
    nothing and measures the speed and memory rows again, keeping the trained runs stored in ``out``.
    """
    from seqlab.lab.report import write_plots, write_results, write_table
    from seqlab.lab.report_html import write_report_html
    from seqlab.lab.runner import Compare

    if isinstance(suite, str):
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; choose one of {suite_names()}")
        suite = SUITES[suite]
    t0 = time.perf_counter()
    lab = Compare(out, suite, mixers, tasks, seed, progress, jobs, remeasure)
    records = lab.run_training() + lab.run_systems()
    # the tasks that ran (--tasks) are what is reported
    suite = dataclasses.replace(suite, entries=tuple(lab.entries))
    if progress:
        print(f"[compare] writing the table, the plots and report.html in {lab.out}", flush=True)
    paths = {
        "results": write_results(lab.out, records),
    }
    speed = lab.systems.summary(records)  # judges each decode-scaling verdict with its spread
    paths["table"] = write_table(lab.out, suite, lab.mixers, records, jobs, lab.systems.verdicts)
    what = "measuring the systems rows again" if remeasure else "training and measuring"
    wall = f"Wall time: {(time.perf_counter() - t0) / 60:.1f} min ({what}, {jobs} job(s) at a time)"
    _append_spread(paths["table"], speed, wall)
    plots = write_plots(lab.out, suite, lab.mixers, records)
    if gradients:
        plots += _gradient_plot(lab.out, suite, lab.mixers, seed)
    paths["plots"] = plots
    # the page reads the files written above, and shows this compare's plots and runs, not earlier ones' in out
    made = (plots, lab.cache.used)
    paths["report"] = write_report_html(lab.out, suite, lab.mixers, jobs, made)
    paths["minutes"] = (time.perf_counter() - t0) / 60
    # the remeasure hint names the same subset (without it, it timed every mixer of the suite)
    subset = (f" --mixers {','.join(lab.mixers)}" if mixers else "") + (
        f" --tasks {','.join(tasks)}" if tasks else ""
    )
    paths["summary"] = summary_lines(suite, lab.mixers, records, speed, paths, subset)
    return paths


def _append_spread(table: Path, speed: list[str], wall: str) -> None:
    """Add the speed rows with their spreads, verdicts and load averages under table.md's tables, and the
    compare's wall time."""
    text = table.read_text(encoding="utf-8").rstrip("\n")
    block = ["", "## Timing spread", "", "```", *speed, "```", "", wall, ""]
    table.write_text(text + "\n" + "\n".join(block), encoding="utf-8")


def _metric(value: float | None, metric: str) -> str:
    if value is None or value != value:
        return "–"
    if metric == "val_accuracy":
        return f"{100 * value:.1f}%"
    return f"{value:.3g}"


def summary_lines(
    suite: Suite, mixers: list[str], records: list, speed: list[str], paths: dict, subset: str = ""
) -> list[str]:
    """The end of a run on a terminal, every line under 100 columns: the speed and memory rows, the trained
    metrics (one lettered column per task setting, named below), every plot's path, and what to open next.
    ``subset``: the run's ``--mixers``/``--tasks`` flags, repeated in the command it suggests."""
    from seqlab.lab.records import first_value

    entries = list(suite.entries)
    keys = [chr(ord("A") + i) for i in range(len(entries))]
    lines = ["", "speed and memory (median, and its spread)", *speed]
    if any(r.noisy for r in records):
        command = f"  seqlab compare --suite {suite.name}{subset} --remeasure systems --out"
        out = str(paths["table"].parent)
        lines.append("* measure only these rows again, on a quieter machine (the trained runs are kept):")
        lines += [f"{command} {out}"] if len(command) + len(out) < 100 else [f"{command} \\", f"      {out}"]
    lines.append("")
    lines += [
        "trained: the headline metric at the end of each run",
        f"{'mixer':<17}" + "".join(f"{k:>9}" for k in keys),
    ]
    for m in mixers:  # 9 columns a value: the widest (0.000223, 3.56e-05) has 8 characters, and a space
        values = [first_value(records, None, mixer=m, task=e.task, setting=e.setting) for e in entries]
        lines.append(
            f"{m:<17}" + "".join(f"{_metric(v, e.metric):>9}" for v, e in zip(values, entries, strict=True))
        )
    for k, e in zip(keys, entries, strict=True):
        better = "higher" if e.higher_is_better else "lower"
        lines.append(f"  {k}: {e.task} {e.setting}, {e.metric} ({better} is better)"[:100])
    lines += ["", f"plots ({len(paths['plots'])}):", *(f"  {p}" for p in paths["plots"]), ""]
    report = paths.get("report")
    if report is not None and Path(report).is_file():
        lines += [
            "open next: report.html (the table and every plot on one page), then table.md:",
            f"  {report}",
        ]
    else:
        lines.append("open next: table.md (the textbook table):")
    lines += [f"  {paths['table']}", f"every number: {paths['results']}"]
    lines.append(f"done in {paths['minutes']:.1f} min")
    return lines


def _gradient_plot(out: Path, suite: Suite, mixers: list[str], seed: int) -> list[Path]:
    """gradient_flow.png for the compared mixers whose hidden state the gradient plot can read."""
    from seqlab.lab.records import write_kept
    from seqlab.viz import GRADIENT_CELLS
    from seqlab.viz.gradients import gradient_flow_groups, plot_gradient_flow

    cells = tuple(m for m in mixers if m in GRADIENT_CELLS)
    if not cells:
        return []
    groups = gradient_flow_groups(cells, suite.gradient_length, 64, suite.gradient_steps, seed)
    title = f"gradient flow, adding problem T={suite.gradient_length}"
    return [
        write_kept(out / "gradient_flow.png", lambda where: plot_gradient_flow(groups, where, title=title))
    ]


def default_jobs() -> int:
    """Training runs at once by default: the cores this process may use (Linux), else all of them; at most 4."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, usable))


__all__ = [
    "OTHER_SUITES",
    "SUITES",
    "check_out_folder",
    "compare",
    "default_jobs",
    "suite_names",
    "summary_lines",
]
