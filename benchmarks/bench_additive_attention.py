"""Bahdanau's additive attention score, vᵀ tanh(W_q s + W_k h_j + b), through seqlab's C++ kernel
(``seqlab.kernels.additive_score``) against the same score as PyTorch ops, alone and inside the models that
use it: RNNsearch (the translation lab's Bahdanau GRU encoder–decoder) and Show, Attend and Tell.

Each row times the same call with the kernel on and switched off (``SEQLAB_DISABLE_KERNELS=additive_score``, read
at every call, so both run in one process on the same weights and data), alternating, the one going first
alternating too; medians and interquartile ranges over the repeats.

* the score alone: one decoder step's scores and their gradients, b 64 queries over 49 source positions, d 256;
* a training step (forward, backward, AdamW) of the translation lab's Bahdanau model on a Bible batch (64 pairs)
  and of the captioning lab's Show, Attend and Tell on generated scenes (64 images, 8 x 8 regions);
* decoding: the Bahdanau model translating 64 test verses, greedy and beam 5.

    python benchmarks/bench_additive_attention.py           # writes benchmarks/results/additive-attention-<cpu>-...md
    python benchmarks/bench_additive_attention.py --quick   # a smoke run: one thread, 3 repeats, no file
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from collections.abc import Callable

import torch

from bench_mixer_kernels import kernel_off  # a kernel switched off for one call (same folder)
from bench_recurrent_kernel import time_pair  # alternating contenders
from bench_recurrent_padded import cell  # median [quartiles] in ms
from common import report
from seqlab.kernels.additive_score import EXTENSION, additive_scores
from seqlab.lab.report import cpu_name
from seqlab.lab.systems import load_1min
from seqlab.run import build_run


def score_step() -> Callable[[], None]:
    torch.manual_seed(0)
    q, k = torch.randn(64, 256, requires_grad=True), torch.randn(64, 49, 256, requires_grad=True)
    v, de = torch.randn(256, requires_grad=True), torch.randn(64, 49)
    return lambda: additive_scores(q, k, v).backward(de)


def train_step(run: dict) -> Callable[[], None]:
    torch.manual_seed(0)
    model, task, _ = build_run(run)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = task.get_batch("train", 0)

    def step() -> None:
        task.loss(model, batch)[0].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def translation_run() -> dict:
    from seqlab.lab.translation import CONTENDERS, TASK

    name, fields = CONTENDERS["Bahdanau"]
    return {"model": {"name": name, **fields}, "task": dict(TASK), "train": {"warmup_steps": 1}}


def captioning_run() -> dict:
    from seqlab.lab.captioning import CONTENDERS, TASK

    name, fields = CONTENDERS["Show, Attend and Tell"]
    task = {**TASK, "n_train": 256, "n_eval": 64}  # the lab's scenes, fewer of them: one batch is timed
    return {"model": {"name": name, **fields}, "task": task, "train": {"warmup_steps": 1}}


def decode_step(beam: int) -> Callable[[], None]:
    torch.manual_seed(0)
    model, task, _ = build_run(translation_run())
    model.eval()
    texts = [p.source for p in task.pairs("test")[:64]]
    return lambda: task.translate(model, texts, beam_size=beam)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    threads, repeats = ([1], 3) if args.quick else (args.threads, args.repeats)
    if EXTENSION.load() is None:
        raise SystemExit(f"the additive-score kernel could not be built: {EXTENSION.build_info()}")
    rows = {
        "score alone, fwd + bwd (b 64, s 49, d 256)": score_step,
        "RNNsearch training step (64 Bible pairs)": lambda: train_step(translation_run()),
        "Show, Attend and Tell training step (64 scenes)": lambda: train_step(captioning_run()),
        "RNNsearch greedy decoding, 64 test verses": lambda: decode_step(1),
        "RNNsearch beam-5 decoding, 64 test verses": lambda: decode_step(5),
    }
    if args.quick:
        rows = dict(list(rows.items())[:2])
    lines = [
        "| what | threads | PyTorch ops (ms) | seqlab kernel (ms) | speed-up |",
        "|---|---:|---:|---:|---:|",
    ]
    before_load, before = load_1min(), torch.get_num_threads()
    for n in threads:
        torch.set_num_threads(n)
        for label, make in rows.items():
            fn = make()
            times = time_pair({"ops": kernel_off("additive_score", fn), "kernel": fn}, repeats, warmup=1)
            ratio = statistics.median(times["ops"]) / statistics.median(times["kernel"])
            lines.append(f"| {label} | {n} | {cell(times['ops'])} | {cell(times['kernel'])} | {ratio:.2f}x |")
            print(lines[-1], flush=True)
    torch.set_num_threads(before)
    head = [
        f"# Bahdanau's additive attention score: seqlab's kernel against PyTorch ops ({cpu_name()}, torch "
        f"{torch.__version__}, {dt.date.today()})",
        "",
        f"Command: `python benchmarks/bench_additive_attention.py`. float32; {repeats} repeats, the two paths "
        "alternating in one process (`SEQLAB_DISABLE_KERNELS=additive_score` for the PyTorch ops); median [first "
        f"quartile, third quartile] in ms. Load average (1 min) before / after: {before_load or 0:.2f} / "
        f"{load_1min() or 0:.2f} (2 cores).",
        "",
    ]
    report("additive-attention", "\n".join(head + lines) + "\n", args.quick)


if __name__ == "__main__":
    main()
