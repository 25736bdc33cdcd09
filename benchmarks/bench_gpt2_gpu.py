"""GPT-2 small (124M) training on one GPU: tokens/s and model FLOPs utilization against the GPU's bf16 peak.

The training step is seqlab's own (``seqlab.training.Trainer.train_step``: the task's batch, bf16 autocast per
``train.precision``, AdamW, gradient clipping), on random token windows of the GPT-2 context (1024) and
vocabulary (50,257), so no data is read. Model FLOPs per token = 3 × the forward's (``seqlab.models.flops``:
2 N_matmul + 4 n_layers t d_attn, the PaLM appendix B count without recomputation); MFU = FLOPs per token ×
tokens/s / peak. The peak is looked up from the device name (dense bf16, no sparsity) or given with
``--peak-tflops``.

    python benchmarks/bench_gpt2_gpu.py                       # on a CUDA machine; writes the table
    python benchmarks/bench_gpt2_gpu.py --compile             # the same step under torch.compile
    python benchmarks/bench_gpt2_gpu.py --smoke               # tiny model on CPU: checks the script, no file

``--profile`` adds the GPU's busy fraction over two profiled steps (kernel time / wall time: below 1, the GPU
waits on the host) and the kernels that take the most GPU time.

The issue that asked for it aims at an MFU of at least 50% on an H100-class GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from pathlib import Path

import torch

from seqlab.lab.report import hardware_slug
from seqlab.layers import vocab_head
from seqlab.models import create
from seqlab.models.flops import forward_flops_per_token
from seqlab.tasks.base import Task
from seqlab.training import TrainConfig, Trainer

RESULTS = Path(__file__).resolve().parent / "results"
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0, "4090": 165.0}
"""Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts), by a substring of the device name."""


class RandomTokens(Task):
    """Uniformly random (b, t) token windows: the step's cost without a data pipeline."""

    name = "random_tokens"

    def __init__(self, vocab_size: int, seq_len: int, batch_size: int):
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size

    def model_overrides(self):
        return {"vocab_size": self.vocab_size}

    def get_batch(self, split: str, index: int):
        g = torch.Generator().manual_seed(index)
        x = torch.randint(self.vocab_size, (self.batch_size, self.seq_len + 1), generator=g)
        return {"x": x[:, :-1], "y": x[:, 1:]}

    def loss(self, model, batch, state=None):
        logits = model(batch["x"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["y"].flatten())
        return loss, {"loss": loss.item()}, None


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def measure(args: argparse.Namespace) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    preset, seq_len = ("test-gpt", 32) if args.smoke else ("gpt2", 1024)
    model = (
        create(preset, dropout=0.0, max_seq_len=max(seq_len, 64))
        if args.smoke
        else create(preset, dropout=0.0)
    )
    task = RandomTokens(model.config.vocab_size, seq_len, args.batch_size)
    config = TrainConfig(steps=10**9, device=str(device), progress=False, warmup_steps=10, grad_clip=1.0)
    trainer = Trainer(model, task, config)
    trainer._start(False)  # threads, precision and the SDPA report, as fit() does before its first step
    if args.compile:
        trainer.net = torch.compile(trainer.net)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        trainer.train_step()
    times = []
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        trainer.train_step()
        sync()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    profile = kernel_profile(trainer, sync) if args.profile and device.type == "cuda" else ""
    tokens_per_s = args.batch_size * seq_len / step_s
    flops_per_token = 3 * forward_flops_per_token(model, seq_len)[0]
    peak = peak_tflops(device, args.peak_tflops)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "preset": preset,
        "tokens_per_s": tokens_per_s,
        "step_ms": 1e3 * step_s,
        "iqr_ms": 1e3 * (statistics.quantiles(times, n=4)[2] - statistics.quantiles(times, n=4)[0]),
        "tflops": flops_per_token * tokens_per_s / 1e12,
        "mfu": None if peak is None else flops_per_token * tokens_per_s / (peak * 1e12),
        "peak": peak,
        "precision": config.autocast_dtype() or torch.float32,
        "seq_len": seq_len,
        "profile": profile,
    }


def kernel_profile(trainer: Trainer, sync, steps: int = 2, top: int = 15) -> str:
    """Markdown: the GPU's busy fraction over ``steps`` profiled steps and the ``top`` kernels by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        sync()
        wall = time.perf_counter() - t0
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu = sum(e.self_device_time_total for e in kernels) / 1e6
    lines = [
        f"Profile of {steps} steps: GPU kernels busy {gpu / wall:.0%} of the wall time "
        f"({1e3 * gpu / steps:.1f} of {1e3 * wall / steps:.1f} ms per step, the profiler's own cost included).",
        "",
        "| kernel | GPU ms per step | share of kernel time | calls per step |",
        "|---|---:|---:|---:|",
    ]
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]:
        name = e.key if len(e.key) <= 90 else e.key[:87] + "..."
        lines.append(
            f"| `{name.replace('|', '/')}` | {e.self_device_time_total / 1e3 / steps:.2f} | "
            f"{e.self_device_time_total / 1e6 / gpu:.1%} | {e.count // steps} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=30, help="timed steps (median)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--peak-tflops", type=float, help="the GPU's dense bf16 peak, when the name is not in the table"
    )
    p.add_argument("--smoke", action="store_true", help="a tiny model on CPU; writes no file")
    p.add_argument("--profile", action="store_true", help="add the GPU's busy fraction and top kernels")
    p.add_argument(
        "--no-pad",
        action="store_true",
        help="the head's product on the unpadded vocabulary (seqlab.layers.vocab_head), for comparison",
    )
    a = p.parse_args()
    if a.smoke:
        a.batch_size, a.steps, a.warmup = 4, 3, 1
    elif not torch.cuda.is_available():
        raise SystemExit("error: this benchmark needs a CUDA GPU (use --smoke to check the script on CPU)")
    if a.no_pad:
        vocab_head.PAD_MULTIPLE = 1
    r = measure(a)
    mfu = "n/a (peak unknown: --peak-tflops)" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    text = (
        f"# GPT-2 small training on {r['device']} (torch {torch.__version__}, {dt.date.today().isoformat()})\n\n"
        f"{r['preset']}, batch {a.batch_size} × {r['seq_len']}, {r['precision']}, "
        f"{'torch.compile, ' if a.compile else ''}"
        f"{'the head on the unpadded vocabulary, ' if a.no_pad else ''}median over {a.steps} steps after {a.warmup} warm-up steps.\n\n"
        f"| tokens/s | step (ms) | IQR (ms) | model TFLOP/s | peak bf16 TFLOP/s | MFU |\n|---:|---:|---:|---:|---:|---:|\n"
        f"| {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {r['iqr_ms']:.1f} | {r['tflops']:.1f} | "
        f"{r['peak'] or 'n/a'} | {mfu} |\n"
    )
    if r["profile"]:
        text += "\n" + r["profile"]
    print(text)
    if not a.smoke:
        kind = "gpt2-gpu" + ("-compile" if a.compile else "") + ("-unpadded" if a.no_pad else "")
        path = RESULTS / f"{kind}-{hardware_slug(r['device'])}-torch{torch.__version__.split('+')[0]}.md"
        path.write_text(text, encoding="utf-8")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
