"""Time seqlab's MultiheadAttention against torch.nn.MultiheadAttention in one process: forward + backward.

Self-attention, b=4, h=8 heads of dim 64 (d=512), over sequence lengths 256 / 1024 / 4096, causal and not.
Both modules hold the same weights (seqlab's is built by ``from_torch``) and run in training mode with
``need_weights=False``, torch's with ``batch_first=True``; the causal case gives torch a boolean attn_mask with
``is_causal=True`` (its documented hint to use the fused causal kernel) and seqlab ``causal=True``.

Within each repeat the two run back to back in an order that alternates from repeat to repeat, so a slow
phase of the machine hits both alike; the table reports medians and seqlab's time as a ratio to torch's.
Long sequences get fewer repeats (``--repeats-long``), since one fwd+bwd at t=4096 takes seconds on a CPU.

    python benchmarks/bench_attention.py                       # t 256 1024 4096
    python benchmarks/bench_attention.py --quick               # a smoke run that writes no file
    python benchmarks/bench_attention.py --device cuda

The table is printed and written to ``benchmarks/results/attention-<cpu or gpu>-torch<version>.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from seqlab.interop import from_torch
from seqlab.lab.report import cpu_name, hardware_slug

RESULTS = Path(__file__).resolve().parent / "results"


def hardware(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def contenders(t: int, causal: bool, device: torch.device, dtype: torch.dtype, b: int, h: int, k: int):
    d = h * k
    theirs = nn.MultiheadAttention(d, h, batch_first=True, device=device, dtype=dtype)
    ours = from_torch(theirs)
    ours.causal = causal
    x = torch.randn(b, t, d, device=device, dtype=dtype, requires_grad=True)
    mask = (
        torch.ones(t, t, dtype=torch.bool, device=device).triu(1) if causal else None
    )  # torch: True = not allowed

    def run_torch():
        y = theirs(x, x, x, attn_mask=mask, is_causal=causal, need_weights=False)[0]
        y.sum().backward()

    def run_ours():
        y = ours(x)[0]
        y.sum().backward()

    return {"torch.nn": run_torch, "seqlab": run_ours}


def time_once(fn: Callable[[], None], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def bench(t, causal, repeats, device, dtype, b, h, k) -> dict[str, float]:
    fns = contenders(t, causal, device, dtype, b, h, k)
    names = list(fns)
    for name in names:  # warm-up: allocator, kernels, autograd graph
        fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(time_once(fns[name], device))
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--repeats", type=int, default=9, help="repeats for t < --long")
    p.add_argument("--repeats-long", type=int, default=3, help="repeats for t >= --long")
    p.add_argument("--long", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--quick", action="store_true", help="t=128, 3 repeats, no file written")
    p.add_argument("--note", default="", help="a line added to the result file (e.g. machine load)")
    a = p.parse_args()
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    if a.quick:
        a.lengths, a.repeats = [128], 3
    torch.manual_seed(0)
    rows = []
    for t in a.lengths:
        for causal in (False, True):
            reps = a.repeats_long if t >= a.long else a.repeats
            m = bench(t, causal, reps, device, dtype, a.batch, a.heads, a.head_dim)
            ratio = m["seqlab"] / m["torch.nn"]
            row = f"| {t} | {'yes' if causal else 'no'} | {reps} | {m['torch.nn'] * 1e3:.1f} | {m['seqlab'] * 1e3:.1f} | {ratio:.3f} |"
            print(row, flush=True)
            rows.append(row)
    hw = hardware(device)
    threads = torch.get_num_threads() if device.type == "cpu" else None
    lines = [
        f"# MultiheadAttention forward + backward: seqlab vs torch.nn ({hw}, torch {torch.__version__})",
        "",
        f"- date: {dt.date.today().isoformat()}; device: {device.type}; dtype: {a.dtype}; "
        f"b={a.batch}, h={a.heads}, head dim={a.head_dim} (d={a.heads * a.head_dim}); self-attention, training mode",
        f"- torch threads: {threads}; logical CPUs: {os.cpu_count()}" if threads else f"- GPU: {hw}",
        "- command: `python benchmarks/bench_attention.py " + " ".join(sys.argv[1:]) + "`",
        "- times are medians over repeats of one forward + backward, the two alternating within each repeat;",
        "  ratio = seqlab / torch.nn (below 1: seqlab faster). Target: ratio <= 1.05.",
    ]
    if a.note:
        lines.append(f"- {a.note}")
    lines += [
        "",
        "| t | causal | repeats | torch.nn (ms) | seqlab (ms) | ratio |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not a.quick:
        RESULTS.mkdir(exist_ok=True)
        tag = hardware_slug(hw) + ("" if a.dtype == "float32" else f"-{a.dtype}")
        path = RESULTS / f"attention-{tag}-torch{torch.__version__.split('+')[0]}.md"
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
