"""seqlab's CPU kernels on inputs that make subnormal floats, against the same kernels on ordinary inputs and
against torch's own ops on both, one process, contenders alternating.

Trained models put values where float32 runs out of normal range: GELU's σ(2z) for pre-activations past about
±10, softmax's exp of scores more than 87 below their row's maximum (peaked attention heads; attention sinks,
whose logits reach the hundreds in trained LMs), a state space model's decay exp(Δ A) for a large step Δ. A
value below 1.2e-38 is subnormal, and on x86 every vector instruction that reads or makes one takes a microcode
assist. seqlab's kernels run each task with the thread's MXCSR set to flush them to zero
(``seqlab_vec::FlushDenormals`` in ``src/seqlab/kernels/vec_math.h``), so their time does not depend on the
values; this table measures that, forward and backward, with each kernel's torch counterpart on the same
inputs where torch has one.

Rows (each forward + backward of a fixed gradient):

* GELU (tanh) with bias, the GPT MLP's (4096, 1024): pre-activations N(0, 1) against N(0, 8²);
  torch: ``F.gelu(p + b, approximate="tanh")``.
* causal attention, the GPT benchmark's (16, 4, 256, 64): q and k N(0, 1) (score std 8 before the 1/8 scale)
  against N(0, 6²) (score std 36 after it); torch: ``F.scaled_dot_product_attention``.
* the selective scan, Mamba's (4, 512, 256, state 16): Δ ~ U(0.001, 0.1) against U(1, 8) with A = -(1..16)
  (exp(Δ A) down to e^-128); no torch op.
* a GRU layer through seqlab's recurrent kernel (32, t 100, 128 → 256): inputs N(0, 1) against N(0, 30²)
  (saturated gates); torch: ``nn.GRU``.

The last column is each contender's time on the tail inputs over its time on the ordinary ones: 1.0 means the
values cost nothing.

    python benchmarks/bench_denormals.py          # writes benchmarks/results/denormals-<cpu>-torch<version>.md
    python benchmarks/bench_denormals.py --quick  # a smoke run that writes no file
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics

import torch
import torch.nn.functional as F

from common import alternate, report
from seqlab.lab.report import cpu_name


def backward_of(make_out, inputs: list[torch.Tensor]):
    """A call that runs make_out() and the backward of a fixed gradient into ``inputs``."""
    grad = torch.randn_like(make_out())

    def run() -> None:
        for x in inputs:
            x.grad = None
        make_out().backward(grad)

    return run


def gelu_rows(scale: float):
    from seqlab.kernels.activations import gelu_bias

    g = torch.Generator().manual_seed(0)
    p = (torch.randn(4096, 1024, generator=g) * scale).requires_grad_()
    b = (torch.randn(1024, generator=g) * 0.02).requires_grad_()
    return {
        "seqlab": backward_of(lambda: gelu_bias(p, b, "tanh"), [p, b]),
        "torch": backward_of(lambda: F.gelu(p + b, approximate="tanh"), [p, b]),
    }


def attention_rows(scale: float):
    from seqlab.kernels.attention import attention

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(16, 4, 256, 64, generator=g) * scale for _ in range(2))
    v = torch.randn(16, 4, 256, 64, generator=g)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    return {
        "seqlab": backward_of(lambda: attention(q, k, v, is_causal=True), [q, k, v]),
        "torch": backward_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v]),
    }


def scan_rows(delta_range: tuple[float, float]):
    from seqlab.kernels import selective_scan_kernel

    g = torch.Generator().manual_seed(0)
    b, t, d, n = 4, 512, 256, 16
    lo, hi = delta_range
    u = torch.randn(b, t, d, generator=g).requires_grad_()
    delta = (lo + (hi - lo) * torch.rand(b, t, d, generator=g)).requires_grad_()
    A = (-torch.arange(1, n + 1, dtype=torch.float32).repeat(d, 1)).requires_grad_()
    B, C = (torch.randn(b, t, n, generator=g).requires_grad_() for _ in range(2))
    return {"seqlab": backward_of(lambda: selective_scan_kernel(u, delta, A, B, C), [u, delta, A, B, C])}


def gru_rows(scale: float):
    from seqlab.kernels.recurrent import recurrent_layer

    torch.manual_seed(0)
    gru = torch.nn.GRU(128, 256)
    x = (torch.randn(100, 32, 128) * scale).requires_grad_()
    h0 = torch.zeros(32, 256)
    w = [gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0]
    return {
        "seqlab": backward_of(lambda: recurrent_layer(x, h0, *w, "GRU")[0], [x, *w]),
        "torch": backward_of(lambda: gru(x, h0[None])[0], [x, *w]),
    }


ROWS = [  # name, rows for ordinary inputs, rows for tail inputs
    ("GELU tanh + bias (4096, 1024)", lambda: gelu_rows(1.0), lambda: gelu_rows(8.0)),
    ("causal attention (16, 4, 256, 64)", lambda: attention_rows(1.0), lambda: attention_rows(6.0)),
    ("selective scan (4, 512, 256, n 16)", lambda: scan_rows((0.001, 0.1)), lambda: scan_rows((1.0, 8.0))),
    ("GRU layer (t 100, b 32, 128 -> 256)", lambda: gru_rows(1.0), lambda: gru_rows(30.0)),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, no file written")
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    repeats = 2 if args.quick else args.repeats
    load_before = os.getloadavg()[0]
    lines = [
        "| kernel | contender | ordinary ms | tail ms | tail / ordinary |",
        "|---|---|---:|---:|---:|",
    ]
    for name, ordinary, tail in ROWS:
        fns = {f"{c} ordinary": f for c, f in ordinary().items()}
        fns.update({f"{c} tail": f for c, f in tail().items()})
        times = {n: statistics.median(v) * 1e3 for n, v in alternate(fns, repeats).items()}
        for c in ("seqlab", "torch"):
            if f"{c} ordinary" in times:
                o, t = times[f"{c} ordinary"], times[f"{c} tail"]
                lines.append(f"| {name} | {c} | {o:.2f} | {t:.2f} | {t / o:.2f} |")
    head = (
        f"# Subnormal floats: seqlab's CPU kernels and torch's ops on ordinary and tail inputs\n\n"
        f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {dt.date.today()}; "
        f"medians of {repeats} repeats, forward + backward, contenders alternating; load average before / after: "
        f"{load_before:.2f} / {os.getloadavg()[0]:.2f}.\n\n"
    )
    report("denormals", head + "\n".join(lines) + "\n", args.quick)


if __name__ == "__main__":
    main()
