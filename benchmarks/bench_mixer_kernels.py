"""minGRU and causal linear attention on the CPU: their C++ recurrences against their parallel forms and loops,
beside the LSTM, GRU and Mamba.

Three paths of each mixer, timed alternately in one process:

* ``kernel``: ``forward`` on the CPU, the recurrence in C++ (``seqlab.kernels.mingru_scan``,
  ``seqlab.kernels.linear_attention``);
* the parallel form: ``forward`` with that kernel switched off (``SEQLAB_DISABLE_KERNELS``, read at every call):
  minGRU's log-space scan through ``torch.logcumsumexp``, linear attention's chunked form, what runs on a GPU;
* ``loop``: ``forward_ref``, the equations one position at a time;

beside ``create_mixer("lstm")`` and ``create_mixer("gru")`` of the same width (seqlab's recurrent kernel; the
LSTM also with that kernel switched off, through torch's fused oneDNN kernel), and in the LM setting beside the
Mamba LM (the selective-scan, causal-conv and LayerNorm kernels). Two settings: the mixer alone, forward +
backward, at ``docs/adding-a-mixer.md``'s step-cost shape (b 32, t 128, d 72, one thread); and whole training
steps (forward, backward, AdamW) of the lab's systems-row LMs (``seqlab compare``'s quick suite: batch 8, t 1024,
torch's default threads), as the lab times them.

    python benchmarks/bench_mixer_kernels.py          # writes benchmarks/results/mixer-kernels-<cpu>-torch<v>.md
    python benchmarks/bench_mixer_kernels.py --quick  # a smoke run that writes no file
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
from collections.abc import Callable

import torch

from common import alternate, report
from seqlab.kernels import linear_attention, mingru_scan, recurrent
from seqlab.lab.budget import build_lab_model
from seqlab.lab.report import cpu_name
from seqlab.lab.suite import QUICK
from seqlab.lab.systems import BATCH_SIZE, VOCAB_SIZE
from seqlab.layers import create_mixer
from seqlab.training.allocator import keep_freed_memory

KERNELS = {"mingru": ("minGRU", "mingru_scan", "log-space scan"), "linear-attention": ("linear attention",
           "linear_attention", "chunked form")}  # fmt: skip


def kernel_off(name: str, fn: Callable[[], object]) -> Callable[[], object]:
    """fn with the kernel ``name`` switched off for the call: the mixer runs its parallel form."""

    def call() -> object:
        os.environ["SEQLAB_DISABLE_KERNELS"] = name
        try:
            return fn()
        finally:
            os.environ.pop("SEQLAB_DISABLE_KERNELS", None)

    return call


def mixer_rows(b: int, t: int, d: int, repeats: int) -> list[str]:
    """Each mixer alone, forward + backward, one thread: ms and the ratio to the LSTM."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        x = torch.randn(b, t, d, requires_grad=True)

        def step(forward: Callable) -> Callable[[], None]:
            return lambda: forward(x)[0].square().mean().backward()

        fns = {}
        for mixer, (label, kernel, parallel) in KERNELS.items():
            m = create_mixer(mixer, d)
            fns[f"{label}, kernel"] = step(m)
            fns[f"{label}, {parallel}"] = kernel_off(kernel, step(m))
            fns[f"{label}, loop"] = step(m.forward_ref)
        lstm = create_mixer("lstm", d)
        fns["LSTM (seqlab's kernel)"] = step(lstm)
        fns["LSTM (oneDNN)"] = kernel_off("recurrent", step(lstm))
        fns["GRU (seqlab's kernel)"] = step(create_mixer("gru", d))
        times = {n: statistics.median(v) for n, v in alternate(fns, repeats).items()}
    finally:
        torch.set_num_threads(threads)
    lstm_s = times["LSTM (seqlab's kernel)"]
    return [f"| {n} | {s * 1e3:.1f} | {s / lstm_s:.2f} |" for n, s in times.items()]


def lm_rows(t: int, repeats: int) -> list[str]:
    """Training steps of the lab's systems-row LMs: tokens/s and the ratio to the LSTM LM."""
    x = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, t))
    names = [*KERNELS, "lstm", "gru", "mamba"]
    models = {m: build_lab_model(m, QUICK, {"vocab_size": VOCAB_SIZE}, 0)[0].train() for m in names}
    opts = {m: torch.optim.AdamW(model.parameters(), lr=1e-4) for m, model in models.items()}

    def step(name: str) -> Callable[[], None]:
        def run() -> None:
            models[name](x).float().logsumexp(-1).mean().backward()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)

        return run

    fns = {}
    for mixer, (label, kernel, parallel) in KERNELS.items():
        fns[f"{label} LM, kernel"] = step(mixer)
        fns[f"{label} LM, {parallel}"] = kernel_off(kernel, step(mixer))
    fns["LSTM LM"], fns["LSTM LM, oneDNN"] = step("lstm"), kernel_off("recurrent", step("lstm"))
    fns["GRU LM"], fns["Mamba LM"] = step("gru"), step("mamba")
    times = {n: statistics.median(v) for n, v in alternate(fns, repeats).items()}
    lstm_s = times["LSTM LM"]
    return [f"| {n} | {BATCH_SIZE * t / s:,.0f} | {lstm_s / s:.2f} |" for n, s in times.items()]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument(
        "--quick", action="store_true", help="a smoke run (3 repeats, short sequences); writes no file"
    )
    args = p.parse_args(argv)
    kept = keep_freed_memory()  # as `seqlab compare` and `seqlab train` run
    repeats, t_mixer, t_lm = (3, 32, 128) if args.quick else (args.repeats, 128, 1024)
    builds = []
    for module in (mingru_scan, linear_attention, recurrent):
        module.EXTENSION.load()
        info = module.EXTENSION.build_info() or {}
        how = "loaded from the cache" if info.get("cached") else "built"
        builds.append(f"{module.EXTENSION.stem} {how} in {info.get('seconds', float('nan')):.1f} s")
    load = os.getloadavg()[0]
    mixer = mixer_rows(32, t_mixer, 72, repeats)
    lm = lm_rows(t_lm, repeats)
    lines = [
        "# minGRU and linear attention on the CPU: C++ recurrences, parallel forms and loops, "
        "beside the LSTM, GRU and Mamba",
        "",
        f"{cpu_name()}, torch {torch.__version__}, {dt.date.today().isoformat()}; medians of {repeats} repeats, "
        f"contenders alternating; load average before / after: {load:.2f} / {os.getloadavg()[0]:.2f}. "
        f"Kernels, before the timed calls: {'; '.join(builds)} (a first build costs 10-20 s each, once per "
        "machine). malloc keeps freed memory (`seqlab.training.allocator.keep_freed_memory`, as `seqlab compare` "
        f"runs): {'yes' if kept else 'not available here'}. Command: `python benchmarks/bench_mixer_kernels.py`.",
        "",
        f"## Each mixer alone, forward + backward (b 32, t {t_mixer}, d 72, one thread)",
        "",
        "| | ms | / LSTM |",
        "|---|---:|---:|",
        *mixer,
        "",
        f"## The lab's systems-row LMs, training steps (batch {BATCH_SIZE}, t {t_lm}, "
        f"{torch.get_num_threads()} threads)",
        "",
        "| | tokens/s | × the LSTM LM |",
        "|---|---:|---:|",
        *lm,
        "",
    ]
    report("mixer-kernels", "\n".join(lines), args.quick)


if __name__ == "__main__":
    main()
