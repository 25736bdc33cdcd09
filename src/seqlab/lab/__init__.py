"""The lab: ``seqlab compare`` measures the RNN vs Transformer vs SSM table on this machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

from seqlab.lab.suite import SUITES, Suite


def compare(
    out: str | Path,
    suite: str | Suite = "quick",
    mixers: list[str] | None = None,
    tasks: list[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    gradients: bool = True,
    jobs: int = 1,
) -> dict:
    """Run a suite and write results.json, table.md and the plots to ``out``. Returns the paths.

    ``jobs`` > 1 trains that many runs at once in worker processes of one torch thread each; the decode,
    throughput and memory measurements that follow always run alone.
    """
    from seqlab.lab.report import write_plots, write_results, write_table
    from seqlab.lab.report_html import write_report_html
    from seqlab.lab.runner import Compare

    if isinstance(suite, str):
        if suite not in SUITES:
            known = [*sorted(SUITES), "translation", "captioning", "video", "timeseries", "speech"]
            raise ValueError(f"unknown suite {suite!r}; choose one of {known}")
        suite = SUITES[suite]
    t0 = time.perf_counter()
    lab = Compare(out, suite, mixers, tasks, seed, progress, jobs)
    records = lab.run_training() + lab.run_systems()
    paths = {
        "results": write_results(lab.out, records),
        "table": write_table(lab.out, suite, lab.mixers, records, jobs),
    }
    plots = write_plots(lab.out, suite, lab.mixers, records)
    if gradients:
        plots += _gradient_plot(lab.out, suite, lab.mixers, seed)
    paths["plots"] = plots
    paths["report"] = write_report_html(lab.out, suite, lab.mixers, jobs)  # reads the files written above
    paths["minutes"] = (time.perf_counter() - t0) / 60
    return paths


def _gradient_plot(out: Path, suite: Suite, mixers: list[str], seed: int) -> list[Path]:
    """gradient_flow.png for the compared mixers whose hidden state the gradient plot can read."""
    from seqlab.viz import GRADIENT_CELLS
    from seqlab.viz.gradients import gradient_flow_groups, plot_gradient_flow

    cells = tuple(m for m in mixers if m in GRADIENT_CELLS)
    if not cells:
        return []
    groups = gradient_flow_groups(cells, suite.gradient_length, 64, suite.gradient_steps, seed)
    path = out / "gradient_flow.png"
    plot_gradient_flow(groups, path, title=f"gradient flow, adding problem T={suite.gradient_length}")
    return [path]


def default_jobs() -> int:
    """Training runs at once by default: the cores this process may use (Linux), else all of them; at most 4."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, usable))


__all__ = ["SUITES", "compare", "default_jobs"]
