"""The LSTM with a projection (LSTMP, ``proj_size``): seqlab's recurrent kernel against torch.nn, forward + backward.

torch.nn runs a projected LSTM on the CPU through ATen's per-step cell loop (oneDNN's fused LSTM has no
projection: torch warns so); seqlab's kernel runs it as its plain LSTM with one more product per step, h_s = m_s
W_hrᵀ, and dW_hr as one product after the backward loop. Two contenders per row, on the same weights and input:
``torch.nn`` (``nn.LSTM(..., proj_size=P)``) and ``seqlab kernel`` (``seqlab.layers.LSTM(..., proj_size=P)``);
padded rows (``lengths``) go through ``pack_padded_sequence`` for torch.nn and ``lengths=`` for seqlab. Within
each repeat the two run back to back, the one going first alternating; medians and interquartile ranges.

    python benchmarks/bench_lstm_projection.py            # writes benchmarks/results/lstm-projection-<cpu>-...md
    python benchmarks/bench_lstm_projection.py --quick    # smoke run, writes no file
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import warnings

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from bench_recurrent_kernel import time_pair  # alternating contenders (same folder)
from bench_recurrent_padded import cell  # median [quartiles] in ms
from common import report
from seqlab.lab.report import cpu_name
from seqlab.layers import LSTM

# (batch, time, inputs, hidden, proj, bidirectional, padded): the recurrent benchmark's shape with P = H / 2, and
# a speech encoder's (80 mel bands, 200 frames), whole and padded
ROWS = [
    (32, 100, 128, 256, 128, False, False),
    (16, 200, 80, 320, 160, True, False),
    (16, 200, 80, 320, 160, True, True),
]


def steps(b: int, t: int, n_in: int, hidden: int, proj: int, bi: bool, padded: bool) -> dict:
    """The two contenders' forward + backward calls on shared weights and input (lengths in [0.6 t, t])."""
    torch.manual_seed(0)
    theirs = nn.LSTM(n_in, hidden, batch_first=True, bidirectional=bi, proj_size=proj)
    ours = LSTM(n_in, hidden, bidirectional=bi, proj_size=proj)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(b, t, n_in, requires_grad=True)
    lengths = torch.randint(int(0.6 * t), t + 1, (b,)) if padded else None
    if lengths is not None:
        lengths[0] = t
    grad = torch.randn(b, t, proj * (1 + bi))
    if (reason := ours.why_not_kernel(x, lengths)) is not None:
        raise SystemExit(f"seqlab's kernel would not run: {reason}")

    def torch_nn() -> None:
        if lengths is None:
            theirs(x)[0].backward(grad)
            return
        seq = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(theirs(seq)[0], batch_first=True, total_length=t)
        out.backward(grad)

    def kernel() -> None:
        ours(x, lengths=lengths)[0].backward(grad)

    return {"torch.nn": torch_nn, "seqlab kernel": kernel}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats, no file written")
    args = p.parse_args()
    rows = [(4, 12, 8, 16, 8, bi, pad) for *_, bi, pad in ROWS] if args.quick else ROWS
    repeats = 3 if args.quick else args.repeats
    lines = [
        "| b | t | in -> H -> P | directions | padded | threads | torch.nn (ms) | seqlab kernel (ms) | speed-up |",
        "|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    before = torch.get_num_threads()
    warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for b, t, n_in, hidden, proj, bi, padded in rows:
            times = time_pair(steps(b, t, n_in, hidden, proj, bi, padded), repeats, warmup=2)
            ratio = statistics.median(times["torch.nn"]) / statistics.median(times["seqlab kernel"])
            lines.append(
                f"| {b} | {t} | {n_in} -> {hidden} -> {proj} | {1 + bi} | {'lengths in [0.6 t, t]' if padded else 'no'} "
                f"| {threads} | {cell(times['torch.nn'])} | {cell(times['seqlab kernel'])} | {ratio:.2f}x |"
            )
            print(lines[-1], flush=True)
    torch.set_num_threads(before)
    head = [
        f"# The projected LSTM (proj_size): seqlab's recurrent kernel against torch.nn ({cpu_name()}, torch "
        f"{torch.__version__}, {dt.date.today()})",
        "",
        f"Command: `python benchmarks/bench_lstm_projection.py`. float32, forward + backward; {repeats} repeats, "
        "the contenders alternating; median [first quartile, third quartile] in ms. torch.nn: ATen's per-step "
        "cell loop (oneDNN's LSTM has no projection); padded rows through pack_padded_sequence.",
        "",
    ]
    report("lstm-projection", "\n".join(head + lines) + "\n", args.quick)


if __name__ == "__main__":
    main()
