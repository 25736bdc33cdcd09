"""Training throughput of the lab's LMs as the parameter budget grows: where the recurrences' sequential
products start to cost more than the selective scan's parallel elementwise work.

The lab's quick suite compares every mixer at 60,000 parameters, where the LSTM's step is its cheapest: a
(b, d) x (d, 4d) product per position is a few microseconds, and Mamba's projections (expand 2, no MLP, so a
wider d at the same budget) cost more multiply-adds per token than they save. The textbook claim that SSMs
"train in parallel" is about how the cost grows. This benchmark times the lab's own training step
(``seqlab.lab.systems.throughput``: ``seqlab train``'s step, batch 8, round-robin until the spread is small)
of the lab's models (``seqlab.lab.budget.build_lab_model``: the shared backbone, 2 layers, d_model matched to
the budget) at several budgets, every mixer of a budget timed together: the LSTM, the GRU, Mamba and Mamba-2
(whose state, 64 per channel by default, is four times Mamba's).

    python benchmarks/bench_mixer_widths.py            # writes benchmarks/results/mixer-widths-<cpu>-torch<v>.md
    python benchmarks/bench_mixer_widths.py --quick    # a smoke run (two small budgets, short length)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os

import torch

from common import report
from seqlab.lab.budget import build_lab_model
from seqlab.lab.report import cpu_name
from seqlab.lab.suite import QUICK
from seqlab.lab.systems import BATCH_SIZE, VOCAB_SIZE, load_1min, throughput
from seqlab.training.allocator import keep_freed_memory

BUDGETS = (60_000, 250_000, 1_000_000, 4_000_000)
MIXERS = ("lstm", "gru", "mamba", "mamba2")


def budget_rows(budget: int, length: int, cap_s: float) -> list[str]:
    """One table row per mixer at ``budget``: d_model, parameters, tokens/s with its spread, and the ratio to
    the LSTM's tokens/s."""
    suite = dataclasses.replace(QUICK, budget=budget)
    built = {m: build_lab_model(m, suite, {"vocab_size": VOCAB_SIZE}, 0) for m in MIXERS}
    models = {m: b[0].train() for m, b in built.items()}
    spreads = throughput(models, VOCAB_SIZE, length, BATCH_SIZE, time_cap_s=cap_s)
    tokens = {m: BATCH_SIZE * length / s.median for m, s in spreads.items()}
    rows = []
    for m, (_, d_model, params) in built.items():
        s = spreads[m]
        noisy = " *" if s.noisy() else ""
        rows.append(
            f"| {budget:,} | {m} | {d_model} | {params:,} | {tokens[m]:,.0f} | ±{s.relative:.0%}{noisy} "
            f"| {tokens[m] / tokens['lstm']:.2f} |"
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run that writes no file")
    p.add_argument(
        "--length", type=int, default=1024, help="tokens per sequence (the lab's systems row: 1024)"
    )
    p.add_argument("--cap", type=float, default=60.0, help="seconds of round-robin timing per budget at most")
    args = p.parse_args()
    keep = keep_freed_memory()  # as seqlab compare runs
    budgets, length = (BUDGETS[:2], 128) if args.quick else (BUDGETS, args.length)
    cap = 5.0 if args.quick else args.cap
    before = load_1min()
    lines = [
        "# The lab's LMs as the budget grows: training tokens/s of the LSTM, GRU, Mamba and Mamba-2",
        "",
        f"{cpu_name()}, torch {torch.__version__}, {dt.date.today()}, {torch.get_num_threads()} threads; batch "
        f"{BATCH_SIZE} x {length} tokens, 2 layers, vocabulary {VOCAB_SIZE}; one training step = `seqlab train`'s "
        "(cross-entropy, backward, clipping, fused AdamW; `seqlab.lab.systems.throughput`, the mixers of a budget round-robin until the "
        f"interquartile range is under 10% of the median or {cap:g} s pass; * marks a spread left above "
        f"10%). malloc keeps freed memory: {'yes' if keep else 'no'}. Command: "
        "`python benchmarks/bench_mixer_widths.py`.",
        "",
        "| budget | mixer | d_model | parameters | tokens/s | ± (IQR / median) | × the LSTM |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for budget in budgets:
        lines += budget_rows(budget, length, cap)
        print(lines[-len(MIXERS) :], flush=True)
    after = load_1min()
    lines += ["", f"Load average (1 min) before / after: {before or 0:.2f} / {after or 0:.2f} (2 cores)."]
    report("mixer-widths", "\n".join(lines) + "\n", args.quick)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
