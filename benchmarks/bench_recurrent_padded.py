"""Padded batches through seqlab's recurrent kernel against torch.nn's packed sequences: forward + backward.

A batch of sequences of different lengths (right padding) is what an encoder of translation or speech sees.
Two contenders per row, holding the same weights, input and lengths:

* ``torch.nn packed``: ``pack_padded_sequence`` -> ``nn.GRU`` / ``nn.LSTM`` / ``nn.RNN`` -> ``pad_packed_sequence``,
  what the torch.nn documentation prescribes (on CPU torch runs a packed sequence through its per-step cell
  loop; oneDNN's fused LSTM takes no packed input);
* ``seqlab kernel``: seqlab's layer called with ``lengths=``, which runs ``seqlab.kernels.recurrent``: the rows
  sorted longest first, each step's products and gate loops on its real rows only (a packed sequence's work),
  the state held at a row's padded steps (so the reverse direction starts at each row's own end) and the output
  zero there; only the whole-sequence products (the input projection, dx, dW_ih) cover the padded positions.

Both give the same numbers (tests/layers/test_recurrent_kernel.py holds them to 1e-10 in float64). Within each
repeat the contenders run back to back, the one going first alternating; medians and interquartile ranges over
the repeats, and the speed-up as the ratio of the medians.

    python benchmarks/bench_recurrent_padded.py            # the committed table
    python benchmarks/bench_recurrent_padded.py --quick    # smoke run, writes no file

The table goes to ``benchmarks/results/recurrent-padded-<cpu>-torch<version>.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from bench_recurrent_kernel import time_pair  # alternating contenders (same folder)
from seqlab.lab.report import cpu_name, hardware_slug
from seqlab.layers import GRU, LSTM, RNN

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS = {"GRU": (nn.GRU, GRU), "LSTM": (nn.LSTM, LSTM), "RNN": (nn.RNN, RNN)}
# (layer, batch, time, inputs, hidden, bidirectional): a translation encoder's shape, a longer one-way GRU, and
# a speech encoder's (80 mel bands, 200 frames)
ROWS = [
    ("GRU", 32, 40, 256, 256, True),
    ("LSTM", 32, 40, 256, 256, True),
    ("RNN", 32, 40, 256, 256, True),
    ("GRU", 32, 100, 128, 256, False),
    ("LSTM", 16, 200, 80, 320, True),
]


def steps(kind: str, b: int, t: int, n_in: int, hidden: int, bi: bool, seed: int = 0):
    """The two contenders' forward + backward calls on shared weights, input and lengths in [0.6 t, t]."""
    torch.manual_seed(seed)
    theirs_cls, ours_cls = LAYERS[kind]
    theirs = theirs_cls(n_in, hidden, batch_first=True, bidirectional=bi)
    ours = ours_cls(n_in, hidden, bidirectional=bi)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(b, t, n_in, requires_grad=True)
    lengths = torch.randint(int(0.6 * t), t + 1, (b,))
    lengths[0] = t
    grad = torch.randn(b, t, hidden * (1 + bi))
    if (reason := ours.why_not_kernel(x, lengths)) is not None:
        raise SystemExit(f"seqlab's kernel would not run: {reason}")

    def packed() -> None:
        seq = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(theirs(seq)[0], batch_first=True, total_length=t)
        out.backward(grad)

    def kernel() -> None:
        ours(x, lengths=lengths)[0].backward(grad)

    return {"torch.nn packed": packed, "seqlab kernel": kernel}, float(lengths.sum()) / (b * t)


def cell(ts: list[float]) -> str:
    q1, median, q3 = statistics.quantiles(ts, n=4, method="inclusive")
    return f"{median * 1e3:.1f} [{q1 * 1e3:.1f}, {q3 * 1e3:.1f}]"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats, no file written")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    rows = [(k, 4, 12, 8, 16, bi) for k, _, _, _, _, bi in ROWS[:3]] if args.quick else ROWS
    repeats = 3 if args.quick else args.repeats
    lines = [
        "| layer | b | t | in -> H | directions | real positions | threads | torch.nn packed (ms) "
        "| seqlab kernel (ms) | speed-up |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    before = torch.get_num_threads()
    for threads in args.threads:
        torch.set_num_threads(threads)
        for kind, b, t, n_in, hidden, bi in rows:
            contenders, real = steps(kind, b, t, n_in, hidden, bi)
            times = time_pair(contenders, repeats, warmup=2)
            ratio = statistics.median(times["torch.nn packed"]) / statistics.median(times["seqlab kernel"])
            lines.append(
                f"| {kind} | {b} | {t} | {n_in} -> {hidden} | {1 + bi} | {real:.0%} | {threads} "
                f"| {cell(times['torch.nn packed'])} | {cell(times['seqlab kernel'])} | {ratio:.2f}x |"
            )
            print(lines[-1], flush=True)
    torch.set_num_threads(before)
    version = torch.__version__.split("+")[0]
    head = [
        f"# Padded batches: seqlab's recurrent kernel against torch.nn's packed sequences ({cpu_name()}, "
        f"torch {torch.__version__}, {dt.date.today()})",
        "",
        f"Command: `python benchmarks/bench_recurrent_padded.py`. float32, forward + backward; {repeats} repeats, "
        "the contenders alternating; median [first quartile, third quartile] in ms.",
        "",
        f"- hardware: {cpu_name()}, {os.cpu_count()} cores",
        "- lengths drawn in [0.6 t, t] (one row of t): the real positions column; both skip the padded steps' "
        "recurrence (the kernel's whole-sequence products, the input projection and the input and weight "
        "gradients, still cover them)",
        "",
    ]
    text = "\n".join(head + lines) + "\n"
    if args.quick:
        print(text)
        return
    out = args.out or RESULTS / f"recurrent-padded-{hardware_slug(cpu_name())}-torch{version}.md"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
