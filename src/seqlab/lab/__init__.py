"""The lab: ``seqlab compare`` measures the RNN vs Transformer vs SSM table on this machine."""

from __future__ import annotations

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
    from seqlab.lab.runner import Compare

    if isinstance(suite, str):
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; choose one of {sorted(SUITES)}")
        suite = SUITES[suite]
    t0 = time.perf_counter()
    lab = Compare(out, suite, mixers, tasks, seed, progress, jobs)
    records = lab.run_training() + lab.run_systems()
    paths = {
        "results": write_results(lab.out, records),
        "table": write_table(lab.out, suite, lab.mixers, records, jobs),
    }
    plots = write_plots(lab.out, suite, lab.mixers, records)
    cells = [m for m in lab.mixers if m in ("rnn", "lstm", "gru")]
    if gradients and cells:
        from seqlab.viz.gradients import gradient_flow, plot_gradient_flow

        groups = [gradient_flow(tuple(cells), suite.gradient_length, 64, 0, seed)]
        if suite.gradient_steps:
            groups.append(gradient_flow(tuple(cells), suite.gradient_length, 64, suite.gradient_steps, seed))
        plots.append(lab.out / "gradient_flow.png")
        plot_gradient_flow(
            groups, plots[-1], title=f"gradient flow, adding problem T={suite.gradient_length}"
        )
    paths["plots"] = plots
    paths["minutes"] = (time.perf_counter() - t0) / 60
    return paths


__all__ = ["SUITES", "compare"]
