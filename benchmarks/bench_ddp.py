"""Two processes with DDP against one process with two threads: the same model, the same global batch.

On a 2-core CPU the question is what data parallelism buys when the alternative is intra-op threading: each
DDP rank runs with one thread on half the rows (``OMP_NUM_THREADS=1``, torchrun's default), plus a gloo
all-reduce of the gradients per step; the single process runs both threads inside each matmul. Contenders
alternate launch by launch (A, B, A, B, ...), each a fresh ``seqlab train`` of ``--steps`` steps whose
throughput is read from its own ``metrics.jsonl`` (the first record, warm-up, is left out); the table gives
medians over ``--repeats`` launches, the interquartile range, and the ratio.

    python benchmarks/bench_ddp.py                         # gpt-tiny and lstm-lm-small on Shakespeare
    python benchmarks/bench_ddp.py --quick                 # a smoke run that writes no file

The table is printed and written to ``benchmarks/results/ddp-<cpu>-torch<version>.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from seqlab.lab.report import cpu_name, hardware_slug

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {  # model -> task overrides: a global batch of 16 rows of 128 characters
    "gpt-tiny": ["--task.sampling=random"],
    "lstm-lm-small": [],
}


def _run(model: str, steps: int, nproc: int, out: Path) -> list[float]:
    """Launch one training run; its tokens/s records after the first."""
    args = [
        "train",
        f"--model.name={model}",
        "--task.name=shakespeare",
        "--task.seq_len=128",
        "--task.batch_size=16",
        *MODELS[model],
        f"--train.steps={steps}",
        "--train.log_every=5",
        "--train.eval_every=0",
        "--train.eval_batches=1",
        "--train.save_every=0",
        "--train.progress=false",
        "--train.device=cpu",
        "--out",
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "OMP_NUM_THREADS")}
    if nproc == 1:
        cmd = [sys.executable, "-m", "seqlab", *args, "--train.threads=2"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "-m", "seqlab"]
        cmd += args
        env["OMP_NUM_THREADS"] = "1"
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=900)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["tokens_per_s"] for r in recs if r["split"] == "train"][1:]


def _iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[2] - q[0]


def measure(model: str, steps: int, repeats: int) -> dict[str, list[float]]:
    """tokens/s per launch, launches alternating between the contenders."""
    out: dict[str, list[float]] = {"1 process × 2 threads": [], "2 processes × 1 thread (DDP)": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            order = list(out) if r % 2 == 0 else list(reversed(out))
            for name in order:
                nproc = 2 if "DDP" in name else 1
                out[name].append(statistics.median(_run(model, steps, nproc, Path(tmp) / f"{name[0]}-{r}")))
    return out


def table(results: dict[str, dict[str, list[float]]], steps: int, repeats: int) -> str:
    load = os.getloadavg()[0]
    lines = [
        f"# Two DDP processes vs one process with two threads ({cpu_name()}, torch {torch.__version__})",
        "",
        f"{os.cpu_count()} logical CPUs; Shakespeare characters, global batch 16 × 128, {steps} steps per launch, "
        f"{repeats} launches per contender alternating; tokens/s per launch = median of its records after the "
        f"first; 1-min load average at the end {load:.2f}. {dt.date.today().isoformat()}.",
        "",
        "| model | contender | tokens/s (median) | IQR | ratio to 1 process |",
        "|---|---|---:|---:|---:|",
    ]
    for model, res in results.items():
        base = statistics.median(next(iter(res.values())))
        for name, xs in res.items():
            med = statistics.median(xs)
            lines.append(f"| {model} | {name} | {med:,.0f} | {_iqr(xs):,.0f} | {med / base:.2f}× |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--quick", action="store_true", help="one short launch each; writes no file")
    a = p.parse_args()
    steps, repeats = (12, 1) if a.quick else (a.steps, a.repeats)
    results = {m: measure(m, steps, repeats) for m in a.models}
    text = table(results, steps, repeats)
    print(text)
    if not a.quick:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"ddp-{hardware_slug(cpu_name())}-torch{torch.__version__.split('+')[0]}.md"
        path.write_text(text, encoding="utf-8")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
