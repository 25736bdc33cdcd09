"""seqlab's Mamba LM against Hugging Face's MambaForCausalLM (pure-PyTorch path with mambapy's parallel scan).

    python benchmarks/bench_mamba.py            # full: 5 repeats
    python benchmarks/bench_mamba.py --quick    # 3 repeats, fewer decoding steps

Both models have the same weights (``seqlab.interop.from_hf``): d_model 256, 4 layers, d_state 16, expand 2,
vocab 256. Measured:

* training throughput: forward + cross-entropy + backward, tokens/s, at batch 16 x 256 and 8 x 1024. Within
  each repeat the two contenders run back to back (order alternating), the table gives medians and the
  ratio of medians, so that load from other processes on a shared machine hits both alike.
* peak memory of one training step: each (contender, shape) runs in a fresh subprocess that builds the
  model, resets the kernel's resident-set high-water mark (``echo 5 > /proc/self/clear_refs``), reads its
  RSS, runs one training step and reads the high-water mark (VmHWM). CPU tensors live in the process's
  RSS, so VmHWM minus RSS before is the step's peak extra memory: activations kept for backward,
  gradients, temporaries. (getrusage's ru_maxrss cannot do this: Linux carries it over from the parent
  across fork and exec, so a child of a big benchmark process starts at the parent's peak.) Linux only.
* decoding: seqlab's ``LM.step`` latency per token (batch 1) after a prompt of 64 and of 8192 tokens. A
  recurrent state has a fixed size, so the two should be equal up to noise.

Writes benchmarks/results/mamba-<cpu>-torch<version>.md.
"""

from __future__ import annotations

import argparse
import gc
import logging
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from seqlab.lab.report import cpu_name, hardware_slug

D_MODEL, N_LAYERS, D_STATE, VOCAB = 256, 4, 16, 256
SHAPES = [(16, 256), (8, 1024)]


def build():
    import transformers

    transformers.logging.set_verbosity_error()
    from seqlab.interop import from_hf

    torch.manual_seed(0)
    cfg = transformers.MambaConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        num_hidden_layers=N_LAYERS,
        state_size=D_STATE,
        use_mambapy=True,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf = transformers.MambaForCausalLM(cfg).train()
    return from_hf(hf).train(), hf


def train_step(model, ids, is_hf):
    logits = model(ids).logits if is_hf else model(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def memory_child(which: str, b: int, t: int) -> None:
    ours, hf = build()
    model = hf if which == "hf" else ours
    del ours, hf
    gc.collect()
    ids = torch.randint(0, VOCAB, (b, t))
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    rss_before = _status_kib("VmRSS")
    train_step(model, ids, which == "hf")
    print(f"PEAK_KIB {_status_kib('VmHWM') - rss_before}")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])  # "VmHWM:   123456 kB"
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def peak_mib(which: str, b: int, t: int, threads: int, tries: int = 2) -> float:
    """The child's peak extra MiB; NaN (with the child's error printed) if every try failed."""
    for _ in range(tries):
        res = subprocess.run(
            [sys.executable, __file__, "--memory-child", which, str(b), str(t), "--threads", str(threads)],
            capture_output=True,
            text=True,
        )
        found = re.search(r"PEAK_KIB (\d+)", res.stdout)
        if res.returncode == 0 and found:
            return int(found.group(1)) / 1024  # ru_maxrss is in KiB on Linux
        print(f"memory child {which} {b}x{t} failed: {res.stderr.strip().splitlines()[-1:]}", flush=True)
    return float("nan")


def decode_latency(model, context: int, steps: int) -> float:
    with torch.no_grad():
        model.eval()
        ids = torch.randint(0, VOCAB, (1, context))
        _, state = model(ids, return_state=True)
        tok = ids[:, -1]
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            logits, state = model.step(tok, state)
            times.append(time.perf_counter() - t0)
            tok = logits.argmax(-1)
        model.train()
    return statistics.median(times)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'16x256,8x1024' -> [(16, 256), (8, 1024)]; argparse's error for anything else."""
    try:
        shapes = [tuple(int(v) for v in pair.split("x")) for pair in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected positive BxT pairs such as 16x256,8x1024, got {text!r}")
    return shapes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--memory-child", nargs=3, metavar=("WHICH", "B", "T"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        default=None,
        help="batch x length pairs to train at, comma-separated (default: "
        + ",".join(f"{b}x{t}" for b, t in SHAPES)
        + "); where HF's scan is slow (about 80 s a step at 16x256 on one Intel Xeon) fewer shapes keep the run "
        "short",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.memory_child:
        which, b, t = args.memory_child
        memory_child(which, int(b), int(t))
        return
    repeats = args.repeats or (3 if args.quick else 5)
    ours, hf = build()
    rows = []
    for b, t in args.shapes or SHAPES:
        ids = torch.randint(0, VOCAB, (b, t))
        train_step(ours, ids, False)  # warm-up both
        train_step(hf, ids, True)
        times = {"seqlab": [], "hf": []}
        for r in range(repeats):
            order = [("seqlab", ours, False), ("hf", hf, True)]
            for name, model, is_hf in order if r % 2 == 0 else order[::-1]:
                times[name].append(timed(lambda m=model, h=is_hf, x=ids: train_step(m, x, h)))
            print(
                f"{b}x{t} repeat {r}: seqlab {times['seqlab'][-1]:.2f}s, hf {times['hf'][-1]:.2f}s",
                flush=True,
            )
        tok = {k: b * t / statistics.median(v) for k, v in times.items()}
        mem = {k: peak_mib(k, b, t, args.threads) for k in ("seqlab", "hf")}
        rows.append((b, t, tok, mem))
        print(rows[-1], flush=True)
    steps = 50 if args.quick else 200
    lat = {c: decode_latency(ours, c, steps) for c in (64, 8192)}
    print("decode", lat, flush=True)

    import transformers

    lines = [
        "# Mamba LM: seqlab vs Hugging Face (mambapy scan), CPU",
        "",
        f"- CPU: {cpu_name()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{args.threads} intra-op threads",
        f"- Model: d_model {D_MODEL}, {N_LAYERS} layers, d_state {D_STATE}, expand 2, vocab {VOCAB}; "
        "the same "
        "weights in both (seqlab.interop.from_hf). HF: MambaForCausalLM(use_mambapy=True), train mode, "
        "pure-PyTorch path (no CUDA kernels on CPU).",
        f"- {repeats} repeats, contenders alternating within each repeat; medians. "
        "**The machine was shared with other developers' jobs while this ran**: absolute numbers are noisy, "
        "the ratios are the result.",
        "- Peak memory: peak RSS (VmHWM) during one training step minus RSS before it, in a fresh "
        "subprocess per contender and shape (see the script's docstring).",
        f"- Command: `python benchmarks/bench_mamba.py{' --quick' if args.quick else ''}"
        f"{' --shapes ' + ','.join(f'{b}x{t}' for b, t in args.shapes) if args.shapes else ''}"
        f"{f' --repeats {args.repeats}' if args.repeats else ''}`",
        "",
        "## Training step (forward + cross-entropy + backward)",
        "",
        "| batch x length | seqlab tok/s | HF tok/s | speed-up "
        "| seqlab peak MiB | HF peak MiB | memory ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for b, t, tok, mem in rows:
        lines.append(
            f"| {b} x {t} | {tok['seqlab']:.0f} | {tok['hf']:.0f} | {tok['seqlab'] / tok['hf']:.2f}x "
            f"| {mem['seqlab']:.0f} | {mem['hf']:.0f} | {mem['hf'] / max(mem['seqlab'], 1e-9):.1f}x less |"
        )
    lines += [
        "",
        "## Decoding (seqlab `LM.step`, batch 1, median per token)",
        "",
        "| context | ms / token |",
        "|---:|---:|",
        *[f"| {c} | {v * 1e3:.3f} |" for c, v in lat.items()],
        "",
        f"Ratio 8192 / 64: {lat[8192] / lat[64]:.2f} (flat: the state is (conv (b, d_inner, d_conv), ssm "
        "(b, d_inner, d_state)) whatever the context).",
        "",
    ]
    cpu = hardware_slug(cpu_name())
    ver = torch.__version__.split("+")[0]
    out = args.out or Path(__file__).parent / "results" / f"mamba-{cpu}-torch{ver}.md"
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
