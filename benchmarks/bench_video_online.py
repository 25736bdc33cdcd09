"""Online frame classification: the latency of one new frame through ``step_frame`` (the state carried) against
re-running the whole clip so far through ``forward``, for every causal mixer at the video suite's widths.

    python benchmarks/bench_video_online.py [--frames 16 64 256] [--repeats 7]

Batch 1 (one camera), one thread, fp32, eval mode; the model is the suite's frame-event model for each mixer
(``seqlab.lab.video.plan``). For each clip length T: the median time of the T-th frame's ``step_frame`` (after
T - 1 frames went through it) and of ``forward`` over all T frames (what a model without a state must do for
each new frame), alternating the two, medians over ``--repeats``. Also checks that the stepped labels equal the
forward's (max |difference| of the logits).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from seqlab.lab.report import cpu_name
from seqlab.lab.video import plan
from seqlab.models import create


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


@torch.no_grad()
def measure(mixer: str, fields: dict, frames: list[int], repeats: int) -> dict:
    model = create(
        "video-lstm", **{**fields, "head": "frames", "n_classes": 5, "n_frames": max(frames)}
    ).eval()
    x = torch.randn(1, max(frames), 1, 32, 32)
    state, outs = model.init_state(1), []
    states = {}
    for i in range(max(frames)):  # the states after T - 1 frames, for each T measured
        if i + 1 in frames:
            states[i + 1] = state
        y, state = model.step_frame(x[:, i], state)
        outs.append(y)
    diff = (torch.stack(outs, 1) - model(x)).abs().max().item()
    row = {"mixer": mixer, "max_diff": diff}
    for t in frames:
        step = _median_ms(lambda t=t: model.step_frame(x[:, t - 1], states[t]), repeats)
        full = _median_ms(lambda t=t: model(x[:, :t]), repeats)
        row[t] = (step, full)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    runs = {spec["contender"]: spec["model"] for spec in plan(tasks=["frames"]).values()}
    print(
        f"# Online frame classification, one new frame: step_frame vs forward over the clip so far, {cpu_name()}"
    )
    print(
        f"\ntorch {torch.__version__}, 1 thread, batch 1, fp32, medians of {args.repeats}; ms per new frame\n"
    )
    heads = " | ".join(f"T={t}: step / forward" for t in args.frames)
    print(f"| mixer | {heads} | step = forward (max diff) |")
    print(f"|---|{'---:|' * len(args.frames)}---:|")
    for mixer, fields in runs.items():
        r = measure(mixer, fields, args.frames, args.repeats)
        cells = " | ".join(f"{r[t][0]:.2f} / {r[t][1]:.2f}" for t in args.frames)
        print(f"| {mixer} | {cells} | {r['max_diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
