"""Time seqlab's fused CPU recurrent kernel against torch.nn's GRU, RNN and LSTM: forward + backward, one process.

Two contenders per (layer, sequence length), holding the same weights and the same input:

* ``torch.nn``: ``nn.GRU`` / ``nn.RNN`` (tanh) / ``nn.LSTM``, ``batch_first=True``: on CPU, ATen's per-step cell
  loop for the GRU and the RNN, oneDNN's fused LSTM kernel for the LSTM;
* ``seqlab kernel``: seqlab's ``GRU`` / ``RNN`` / ``LSTM`` on its fast path, which on CPU is
  ``seqlab.kernels.recurrent``;
* ``matmuls alone``: only the matrix products that both do (the input projection, the t per-step products each
  way, the input and weight gradients), on buffers made beforehand. No implementation of these equations can
  take less time with torch's BLAS (MKL), so torch.nn over this time is the largest speed-up any kernel calling
  it could show; the table gives it beside the kernel's. (With AVX-512 and float32 seqlab's kernel runs the
  larger per-step products, the input projection and the input gradient through oneDNN's brgemm instead, which
  takes it below this time.)

Within each repeat the contenders run back to back, the one going first alternating from repeat to repeat,
so a slow phase of the shared machine hits both alike; the table gives the median over repeats with the
interquartile range, and the speed-up as the ratio of the medians. The thread count is torch's default.

    python benchmarks/bench_recurrent_kernel.py --cold-build      # the committed table: a real first build
    python benchmarks/bench_recurrent_kernel.py --quick           # smoke run, writes no file

The compile cost is measured in this process: with ``--cold-build`` the kernel is built into an empty
temporary folder (what a first use costs), otherwise it comes from the cache if it is there.
The table goes to ``benchmarks/results/recurrent-kernel-<cpu>-torch<version>.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from bench_recurrent import make_step  # the same fwd+bwd step as the torch.nn comparison (same folder)
from seqlab.kernels.recurrent import build_info, load_recurrent_kernel
from seqlab.lab.report import cpu_name, hardware_slug
from seqlab.layers import GRU, LSTM, RNN

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "GRU": (nn.GRU, GRU),
    "RNN": (nn.RNN, RNN),
    "LSTM": (nn.LSTM, LSTM),
}
NAMES = ("torch.nn", "seqlab kernel", "matmuls alone")
DEFAULT_THREADS = torch.get_num_threads()
NOTES = [
    "- both contenders do the same arithmetic (a GRU at t=100: about 5.7 GFLOP, mostly matmuls); the kernel "
    "saves torch.nn's per-step autograd nodes and temporaries, fuses the gate arithmetic into one loop each way "
    "(the bias gradients summed in it), computes dW_hh as one matmul instead of t small ones, and multiplies the "
    "per-step products, the input projection and the input gradient with oneDNN's brgemm (float32, AVX-512) "
    "where torch.nn calls MKL",
    "- the LSTM's torch.nn contender is not a cell loop but oneDNN's fused LSTM kernel (its whole sequence in one "
    "call, forward and backward), so its target is to beat that kernel at all, not 1.5x",
    "- the LSTM at t 400 on one thread (AMD EPYC): some calls of the kernel's forward (its step loop, not the "
    "input projection) take 1.5-2x the usual time, a few in forty when the calls run back to back and up to one "
    "in two right after a large matrix product; the same page faults and no context switches in slow and fast "
    "calls, and page-aligned buffers or a huge page for W_hh did not remove it (not understood): the third "
    "quartile of those rows shows it",
    "- on a shared machine the 2-thread rows suffer most (an OpenMP thread waits at every operation for a "
    "descheduled partner, and torch.nn has more operations per step); the 1-thread rows are the steadier "
    "comparison",
    "- matmuls alone: the same matrix products with nothing else (buffers made beforehand; the per-step ones one "
    "call each from Python), so torch.nn over that time is the largest speed-up that an implementation calling "
    "torch's BLAS (MKL) per step could show; the kernel's brgemm products go below it",
    "- the kernel asks Linux for transparent huge pages for its O(t*b*H) buffers (page faults are costly on this "
    "machine: about 1 ms per fresh MB); torch does the same for all its CPU memory only with "
    "THP_MEM_ALLOC_ENABLE=1, which is not set here",
]


def time_pair(steps: dict[str, Callable[[], None]], repeats: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each step, ``repeats`` times; the contender going first alternates."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(repeats):
        for name in list(steps)[:: 1 if r % 2 == 0 else -1]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return times


def bench(kind: str, t: int, args: argparse.Namespace) -> dict[str, list[float]]:
    torch.manual_seed(0)
    theirs_cls, ours_cls = LAYERS[kind]
    theirs = theirs_cls(args.input_size, args.hidden_size, batch_first=True)
    ours = ours_cls(args.input_size, args.hidden_size)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(args.batch, t, args.input_size, requires_grad=True)
    if (reason := ours.why_not_kernel(x)) is not None:
        raise SystemExit(f"seqlab's kernel would not run: {reason}")
    grad_out = torch.randn(args.batch, t, args.hidden_size)
    contenders = (make_step(theirs, x, grad_out), make_step(ours, x, grad_out), matmul_step(kind, t, args))
    return time_pair(dict(zip(NAMES, contenders, strict=True)), args.repeats, args.warmup)


def matmul_step(kind: str, t: int, args: argparse.Namespace) -> Callable[[], None]:
    """The matrix products of one forward + backward and nothing else, on buffers made here: the input
    projection for all steps, t products (b, H) x (H, G) forward and t (b, G) x (G, H) backward, then dx, dW_ih
    and dW_hh as one product each, as both contenders compute them. Each product is one call from Python (a few
    microseconds each, so this floor is if anything a little high)."""
    b, n_in, hidden = args.batch, args.input_size, args.hidden_size
    g = LAYERS[kind][1].n_gates * hidden  # G: the gates' rows of W_ih and W_hh
    x2, bias, w_ih, w_ih_t = (
        torch.randn(t * b, n_in),
        torch.randn(g),
        torch.randn(g, n_in),
        torch.randn(n_in, g),
    )
    w_hh, w_hh_t = torch.randn(g, hidden), torch.randn(hidden, g)
    hs, dgh = torch.randn(t, b, hidden), torch.randn(t, b, g)
    gx, gh, dh, dx = (
        torch.empty(t * b, g),
        torch.empty(b, g),
        torch.zeros(b, hidden),
        torch.empty(t * b, n_in),
    )

    def step() -> None:
        torch.addmm(bias, x2, w_ih_t, out=gx)
        for s in range(t):
            torch.mm(hs[s], w_hh_t, out=gh)
        for s in range(t - 1, -1, -1):
            dh.addmm_(dgh[s], w_hh)
        dgh2 = dgh.view(t * b, g)
        torch.mm(dgh2, w_ih, out=dx)
        dgh2.t().mm(x2), dgh2.t().mm(hs.view(t * b, hidden))

    return step


def summary(ts: list[float]) -> str:
    q1, median, q3 = statistics.quantiles(ts, n=4, method="inclusive")
    return f"{median * 1e3:.1f} [{q1 * 1e3:.1f}, {q3 * 1e3:.1f}]"


def table(rows: list[tuple[str, int, int, dict[str, list[float]]]]) -> str:
    lines = [
        "| layer | t | threads | torch.nn (ms) | seqlab kernel (ms) | matmuls alone (ms) | speed-up (torch.nn / "
        "kernel) | largest possible (torch.nn / matmuls) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, t, threads, m in rows:
        theirs, ours, floor = (statistics.median(m[name]) for name in NAMES)
        cells = " | ".join(summary(m[name]) for name in NAMES)
        lines.append(f"| {kind} | {t} | {threads} | {cells} | {theirs / ours:.2f}x | {theirs / floor:.2f}x |")
    return "\n".join(lines)


def load_kernel(cold: bool) -> dict:
    """Build or load the kernel now (not inside the first timed call) and return what that cost."""
    if cold:
        os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="seqlab-kernel-")
    if load_recurrent_kernel() is None:
        raise SystemExit(f"seqlab's recurrent kernel could not be built: {build_info()}")
    return build_info()


def header(args: argparse.Namespace, build: dict, loads: tuple[float, float]) -> list[str]:
    how = "cached load (no compile)" if build["cached"] else "first build, compile and link"
    command = "python benchmarks/bench_recurrent_kernel.py" + (" --cold-build" if args.cold_build else "")
    command += f" --repeats {args.repeats} --lengths " + " ".join(map(str, args.lengths))
    command += " --threads " + " ".join(map(str, args.threads))
    return [
        "# seqlab's fused recurrent kernel vs torch.nn, forward + backward (CPU)",
        "",
        f"- hardware: {cpu_name()}, {os.cpu_count()} cores; intra-op threads as in the table (torch's default "
        f"is {DEFAULT_THREADS})",
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.system()}",
        f"- date: {dt.date.today().isoformat()}; 1-minute load average before / after: "
        f"{loads[0]:.2f} / {loads[1]:.2f} (the machine is shared)",
        f"- compile cost: {build['seconds']:.1f} s ({how}), paid once per machine; later processes load the "
        "cached library",
        f"- batch {args.batch}, input_size {args.input_size}, hidden_size {args.hidden_size}, one layer, "
        f"unidirectional, float32, batch_first; median [first quartile, third quartile] of {args.repeats} "
        f"repeats after {args.warmup} warmup calls, contenders alternating within each repeat",
        f"- `{command}`",
        "- target: seqlab kernel >= 1.5x faster than torch.nn's GRU and RNN; faster than its (oneDNN) LSTM",
        *NOTES,
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=11, help="timed repeats per contender (at least 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per contender before timing")
    p.add_argument("--lengths", type=int, nargs="+", default=[100, 400], help="sequence lengths t")
    p.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-size", type=int, default=128)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--threads", type=int, nargs="+", default=[DEFAULT_THREADS], help="intra-op thread counts")
    p.add_argument("--cold-build", action="store_true", help="build the kernel afresh in a temporary folder")
    p.add_argument("--quick", action="store_true", help="smoke run: t=20, 3 repeats; writes no file")
    p.add_argument("--out", type=Path, default=None, help="where to write the table (default: results/)")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.repeats, args.warmup = [20], 3, 1

    load_before = os.getloadavg()[0]
    build = load_kernel(args.cold_build)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for kind in args.layers:
            for t in args.lengths:
                m = bench(kind, t, args)
                rows.append((kind, t, threads, m))
                times = "  ".join(f"{k} {summary(v)} ms" for k, v in m.items())
                print(f"{kind:4s} t={t:4d} threads={threads}  {times}", flush=True)
    text = "\n".join(header(args, build, (load_before, os.getloadavg()[0]))) + "\n" + table(rows) + "\n"
    print()
    print(text)
    if not args.quick:
        version = torch.__version__.split("+")[0]
        out = args.out or RESULTS / f"recurrent-kernel-{hardware_slug(cpu_name())}-torch{version}.md"
        out.write_text(text)
        print(f"written to {out}")


if __name__ == "__main__":
    main()
