"""How much a busy machine slows seqlab's CPU work, and what OpenMP's wait policy does about it.

torch runs its CPU operators on an OpenMP team (one thread per core by default). At the end of each parallel
operator the team meets at a barrier; with libgomp's default policy a thread that arrives first *spins* there.
When another process holds one of the cores, the team's other thread is off the CPU, and the spinning one burns
the core that thread needs until its spin or its time slice ends: every operator then costs a scheduler tick.
``OMP_WAIT_POLICY=PASSIVE`` makes a waiting thread sleep at once instead (a futex), handing the core over.

Each workload runs in a fresh process per variant (the policy is read when the OpenMP runtime starts, so it
cannot change inside one process), the variants alternating within every repeat, on a quiet machine and with
one busy process (a Python loop) holding a core; medians over repeats of each process's median step.

    python benchmarks/bench_busy_machine.py                 # writes benchmarks/results/busy-machine-<cpu>-...md
    python benchmarks/bench_busy_machine.py --quick         # a smoke run, nothing written

``--train`` times what a user runs instead: the README's first exercise (``seqlab train`` of test-lm-lstm on
the adding problem, 200 steps), with the thread count left to seqlab (it follows the cores other processes
leave, ``seqlab.training.threads``) against ``--train.threads=2`` pinned, quiet, beside one busy Python loop,
and beside a second training of its own kind (two OpenMP teams on two cores).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from common import report
from seqlab.lab.report import cpu_name

VARIANTS = {
    "default (spin)": {},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
}
WORKLOADS = {
    "lstm-exercise": "test-lm-lstm (2 x 32) training step, batch 32 x 50",
    "gpt-train": "GPT 4 x 256 (bench_gpt's shape) training step, batch 16 x 256",
    "gpt-decode": "GPT 4 x 256 greedy decoding, batch 1, 64 new tokens (the fused decode kernel)",
    "mamba-train": "mamba-tiny (12 x 128) training step, batch 8 x 256",
}


def _workload(name: str):
    """(a function running one step of ``name``, its calls per measurement)."""
    from seqlab.models import create

    torch.manual_seed(0)
    if name == "gpt-decode":
        model = create("gpt-tiny", d_model=256, n_layers=4, mixer_config={"n_heads": 4}, dropout=0.0).eval()
        prompt = torch.randint(0, 256, (1, 8))
        return (lambda: model.generate(prompt, 64, temperature=0)), 3
    shapes = {
        "lstm-exercise": ("test-lm-lstm", {}, (32, 50), 20),
        "gpt-train": (
            "gpt-tiny",
            {"d_model": 256, "n_layers": 4, "mixer_config": {"n_heads": 4}},
            (16, 256),
            3,
        ),
        "mamba-train": ("mamba-tiny", {}, (8, 256), 3),
    }
    preset, fields, (b, t), calls = shapes[name]
    model = create(preset, vocab_size=256, dropout=0.0, **fields)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (b, t + 1))

    def step():
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, calls


def _worker(name: str) -> None:
    """Run ``name`` in this process: warm-up calls, then print the median seconds per call as JSON."""
    step, calls = _workload(name)
    step()
    step()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    print(json.dumps({"median_s": statistics.median(times), "threads": torch.get_num_threads()}))


def _run(name: str, env: dict[str, str], timeout: float) -> float:
    full = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", name],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{name} with {env} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["median_s"]


def _busy():
    """A process holding one core until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(workloads: list[str], repeats: int, timeout: float) -> dict:
    results = {(w, v, c): [] for w in workloads for v in VARIANTS for c in ("quiet", "busy")}
    names = list(VARIANTS)
    for r in range(repeats):
        for condition in ("quiet", "busy"):
            hog = _busy() if condition == "busy" else None
            try:
                time.sleep(0.5 if hog else 0.0)
                for w in workloads:
                    for v in names if r % 2 == 0 else names[::-1]:
                        results[(w, v, condition)].append(_run(w, VARIANTS[v], timeout))
                        print(
                            f"[{r + 1}/{repeats}] {condition:5} {w:13} {v:24} {results[(w, v, condition)][-1] * 1e3:9.1f} ms",
                            flush=True,
                        )
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
    return results


def table(results: dict, workloads: list[str], repeats: int, load: tuple[float, float]) -> str:
    med = {k: statistics.median(v) for k, v in results.items()}
    lines = [
        "# A busy machine: torch's OpenMP team against one busy process, and the wait policy",
        "",
        f"{cpu_name()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
        f"{dt.date.today().isoformat()}; {repeats} repeats, a fresh process per variant, variants alternating; "
        f"ms per step: median over repeats of each process's median. Busy: one `while True: pass` Python "
        f"process beside it. Load average before / after: {load[0]:.2f} / {load[1]:.2f}.",
        "",
        "| workload | variant | quiet ms | busy ms | busy / quiet | quiet / default's quiet |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for w in workloads:
        base = med[(w, "default (spin)", "quiet")]
        for v in VARIANTS:
            q, b = med[(w, v, "quiet")], med[(w, v, "busy")]
            lines.append(
                f"| {WORKLOADS[w]} | {v} | {q * 1e3:.1f} | {b * 1e3:.1f} | {b / q:.2f} | {q / base:.2f} |"
            )
    return "\n".join(lines) + "\n"


EXERCISE = [
    "train",
    "--model.name=test-lm-lstm",
    "--task.name=adding",
    "--task.seq_len=50",
    "--train.steps=200",
    "--train.lr=3e-3",
    "--train.progress=false",
    "--train.eval_every=0",
]
TRAIN_VARIANTS = {"seqlab's choice (adapts)": [], "--train.threads=2 (pinned)": ["--train.threads=2"]}
NEIGHBOURS = {
    "quiet": None,
    "one busy core": [sys.executable, "-c", "while True: pass"],
    "another training": [sys.executable, "-m", "seqlab.cli", *EXERCISE[:-4], "--train.steps=100000",
                         "--train.progress=false", "--train.eval_every=0", "--train.save_every=0"],
}  # fmt: skip


def _train_seconds(extra: list[str], folder: str) -> float:
    import shutil
    import tempfile

    out = tempfile.mkdtemp(prefix="busy-", dir=folder)
    shutil.rmtree(out)
    done = subprocess.run(
        [sys.executable, "-m", "seqlab.cli", *EXERCISE, *extra, "--out", out], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["elapsed_s"]


def measure_training(repeats: int) -> str:
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="bench-busy-")
    times = {(n, v): [] for n in NEIGHBOURS for v in TRAIN_VARIANTS}
    before = os.getloadavg()[0]
    try:
        for r in range(repeats):
            for n, argv in NEIGHBOURS.items():
                extra = ["--out", os.path.join(folder, f"neighbour-{r}")] if n == "another training" else []
                hog = (
                    subprocess.Popen([*argv, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    if argv
                    else None
                )
                try:
                    time.sleep(2.0 if hog else 0.0)  # the neighbour is running (and past its start-up)
                    names = list(TRAIN_VARIANTS) if r % 2 == 0 else list(TRAIN_VARIANTS)[::-1]
                    for v in names:
                        times[(n, v)].append(_train_seconds(TRAIN_VARIANTS[v], folder))
                        print(f"[{r + 1}/{repeats}] {n:16} {v:28} {times[(n, v)][-1]:7.2f} s", flush=True)
                finally:
                    if hog:
                        hog.kill()
                        hog.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        "## The README's first exercise, `seqlab train` (200 steps of test-lm-lstm on the adding problem, T=50)",
        "",
        f"{repeats} repeats, the two variants alternating; seconds of training (the summary's elapsed_s), "
        f"medians. Load average before / after: {before:.2f} / {os.getloadavg()[0]:.2f}.",
        "",
        "| beside it | seqlab's choice (s) | --train.threads=2 (s) | pinned / seqlab's choice |",
        "|---|---:|---:|---:|",
    ]
    for n in NEIGHBOURS:
        a, b = med[(n, "seqlab's choice (adapts)")], med[(n, "--train.threads=2 (pinned)")]
        lines.append(f"| {n} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    ap.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, of: " + ", ".join(WORKLOADS)
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one worker process may take")
    ap.add_argument("--quick", action="store_true", help="one repeat, nothing written")
    ap.add_argument("--train", action="store_true", help="time `seqlab train` of the first exercise instead")
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    if args.train:
        text = measure_training(1 if args.quick else args.repeats)
        print(text)
        if not args.quick:
            from common import result_file

            path = result_file("busy-machine")
            path.write_text(
                path.read_text(encoding="utf-8") + "\n" + text if path.exists() else text, encoding="utf-8"
            )
            print(f"wrote {path}")
        return
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    repeats = 1 if args.quick else args.repeats
    before = os.getloadavg()[0]
    results = measure(workloads, repeats, args.timeout)
    report("busy-machine", table(results, workloads, repeats, (before, os.getloadavg()[0])), args.quick)


if __name__ == "__main__":
    main()
