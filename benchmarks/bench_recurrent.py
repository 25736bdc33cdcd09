"""Time seqlab's recurrent layers against torch.nn in one process: forward + backward.

Three contenders per (layer, sequence length), all holding the same weights:

* ``torch.nn``: ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` with ``batch_first=True``;
* ``seqlab fast``: seqlab's layer on its default fast path (the fused kernel);
* ``seqlab ref``: seqlab's layer with ``fast_path=False``, the explicit loop over time.

Within each repeat the contenders run back to back in an order that rotates from repeat to repeat, so a
slow phase of the machine (another process, a frequency change) hits them alike; the table reports medians
over repeats and each seqlab time as a ratio to torch.nn's. The thread count is torch's default.

    python benchmarks/bench_recurrent.py                    # lengths 100 and 400, 15 repeats
    python benchmarks/bench_recurrent.py --quick            # a smoke run that writes no file
    python benchmarks/bench_recurrent.py --lengths 50 200 --repeats 11

The table is printed and written to ``benchmarks/results/recurrent-<cpu or device>-torch<version>.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from seqlab.lab.report import cpu_name, hardware_slug
from seqlab.layers import GRU, LSTM, RNN

RESULTS = Path(__file__).resolve().parent / "results"
CPU_NOTE = [
    "- on CPU, torch.nn's LSTM (float32) runs oneDNN's fused RNN kernel; its GRU and RNN run ATen's per-step "
    "cell loop, which is why seqlab's reference loop is close to them and further from the LSTM",
]
LAYERS: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "LSTM": (nn.LSTM, LSTM),
    "GRU": (nn.GRU, GRU),
    "RNN": (nn.RNN, RNN),  # tanh
}


def hardware(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(layer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> Callable[[], None]:
    """One forward + backward through ``layer``; gradients are dropped (set to None) before each."""

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out, _ = layer(x)
        out.backward(grad_out)

    return step


def time_contenders(
    steps: dict[str, Callable[[], None]], repeats: int, warmup: int, device: torch.device
) -> dict[str, float]:
    """Median seconds per call of each step; contenders alternate inside every repeat."""
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in order:
            sync(device)
            start = time.perf_counter()
            steps[name]()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(
    kind: str,
    t: int,
    *,
    batch: int,
    input_size: int,
    hidden_size: int,
    repeats: int,
    warmup: int,
    device: torch.device,
) -> dict[str, float]:
    torch.manual_seed(0)
    theirs_cls, ours_cls = LAYERS[kind]
    kw = {"batch_first": True, "device": device}
    theirs = theirs_cls(input_size, hidden_size, **kw)
    fast = ours_cls(input_size, hidden_size, **kw)
    ref = ours_cls(input_size, hidden_size, fast_path=False, **kw)
    for ours in (fast, ref):
        ours.load_state_dict(theirs.state_dict())
    x = torch.randn(batch, t, input_size, device=device, requires_grad=True)
    grad_out = torch.randn(batch, t, hidden_size, device=device)
    steps = {
        "torch.nn": make_step(theirs, x, grad_out),
        "seqlab fast": make_step(fast, x, grad_out),
        "seqlab ref": make_step(ref, x, grad_out),
    }
    return time_contenders(steps, repeats, warmup, device)


def table(rows: list[tuple[str, int, dict[str, float]]]) -> str:
    lines = [
        "| layer | t | torch.nn (ms) | seqlab fast (ms) | fast / torch.nn | seqlab ref (ms) | ref / torch.nn |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, t, m in rows:
        base = m["torch.nn"]
        lines.append(
            f"| {kind} | {t} | {base * 1e3:.1f} | {m['seqlab fast'] * 1e3:.1f} | "
            f"{m['seqlab fast'] / base:.2f}x | {m['seqlab ref'] * 1e3:.1f} | {m['seqlab ref'] / base:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="timed repeats per contender (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per contender before timing")
    p.add_argument("--lengths", type=int, nargs="+", default=[100, 400], help="sequence lengths t")
    p.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-size", type=int, default=128)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--device", default="cpu", help="'cpu' or a CUDA device such as 'cuda'")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: t=20, 2 repeats, 1 warmup; prints the table and writes no file",
    )
    p.add_argument("--out", type=Path, default=None, help="where to write the table (default: results/)")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.repeats, args.warmup = [20], 2, 1

    device = torch.device(args.device)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    hw = hardware(device)
    version = torch.__version__.split("+")[0]
    rows = []
    for kind in args.layers:
        for t in args.lengths:
            m = bench(
                kind,
                t,
                batch=args.batch,
                input_size=args.input_size,
                hidden_size=args.hidden_size,
                repeats=args.repeats,
                warmup=args.warmup,
                device=device,
            )
            rows.append((kind, t, m))
            print(
                f"{kind:5s} t={t:4d}  " + "  ".join(f"{k} {v * 1e3:8.1f} ms" for k, v in m.items()),
                flush=True,
            )

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    command = f"python benchmarks/bench_recurrent.py --repeats {args.repeats} --lengths " + " ".join(
        map(str, args.lengths)
    )
    header = [
        f"# Recurrent layers: seqlab vs torch.nn, forward + backward ({device.type})",
        "",
        f"- hardware: {hw}"
        + (f", {torch.get_num_threads()} threads (torch default)" if device.type == "cpu" else ""),
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.system()}",
        f"- date: {dt.date.today().isoformat()}; 1-minute load average before / after: "
        f"{load_before:.2f} / {load:.2f}",
        f"- batch {args.batch}, input_size {args.input_size}, hidden_size {args.hidden_size}, one layer, "
        f"unidirectional, float32, no lengths; median of {args.repeats} repeats after {args.warmup} warmup "
        "calls, contenders alternating within each repeat",
        f"- `{command}`",
        "- targets: seqlab fast <= 1.05x torch.nn, seqlab ref <= 1.8x torch.nn",
        *(CPU_NOTE if device.type == "cpu" else []),
        "",
    ]
    text = "\n".join(header) + "\n" + table(rows) + "\n"
    print()
    print(text)
    if not args.quick:
        out = args.out or RESULTS / f"recurrent-{hardware_slug(hw)}-torch{version}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"written to {out}")


if __name__ == "__main__":
    main()
