"""seqlab's CPU attention kernel (``seqlab.kernels.attention``) against torch's fused CPU SDPA, one process.

Each contender computes softmax(q kᵀ / √d [+ causal mask]) v on q, k, v taken as (b, h, t, d) views of one
packed (b, t, 3 h d) projection, as the attention layers make them, then merges the heads to (b, t, h d);
"fwd+bwd" adds the backward of a fixed gradient into the projection (so both pay for gathering dq, dk, dv into
its gradient). torch runs ``F.scaled_dot_product_attention`` (its flash kernel for CPU). The contenders alternate
which goes first from repeat to repeat; the table gives the median time, the interquartile range as a share of
the median, and the ratio torch / seqlab of the medians (above 1: seqlab faster). Rows whose spread exceeds 10%
are marked.

Shapes: the ViT trainings of ``benchmarks/bench_vit.py`` (batch 128), a ViT-B/16 image batch (197 tokens), the
GPT of ``benchmarks/bench_gpt.py`` (batch 16, causal, 256), and longer sequences, past the lengths up to which
seqlab's SDPA sends calls to the kernel (``MAX_KEYS``: 512 keys, 1,024 causal; the kernel is called directly
here), which show where those limits come from. Before timing, each row checks that the two agree (outputs and
input gradient).

``--models`` adds whole training steps (forward, backward, AdamW) of seqlab models with the kernel on and off
(off: ``seqlab.kernels.attention.why_not_shapes`` refuses every call, so torch's SDPA runs), alternating: the
translation suite's Transformer (padded source batches, dropout 0.1), a BERT-style encoder (padding, dropout
0.1), gpt-tiny (dropout 0.1), the GPT benchmark's model, the lab's attention mixer and the ViT of bench_vit.

    python benchmarks/bench_attention_kernel.py           # writes benchmarks/results/attention-kernel-<cpu>-torch<v>.md
    python benchmarks/bench_attention_kernel.py --models  # ... with the model rows
    python benchmarks/bench_attention_kernel.py --quick   # a smoke run that writes no file
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from common import alternate, result_file
from seqlab.kernels import attention as kernel
from seqlab.lab.report import cpu_name

# name, b, h, t, d, causal
SHAPES = [
    ("ViT fashion (bench_vit)", 128, 4, 50, 32, False),
    ("ViT cifar (bench_vit)", 128, 3, 65, 64, False),
    ("ViT-B/16 image batch", 8, 12, 197, 64, False),
    ("GPT (bench_gpt)", 16, 4, 256, 64, True),
    ("the lab's attention mixer (head dim 12, padded to 16)", 8, 4, 1024, 12, True),
    ("bidirectional 512", 4, 8, 512, 64, False),
    ("causal 512", 4, 8, 512, 64, True),
    ("causal 1024", 2, 8, 1024, 64, True),
    ("causal 2048", 1, 8, 2048, 64, True),
    ("bidirectional 1024", 2, 8, 1024, 64, False),
    ("bidirectional 2048", 1, 8, 2048, 64, False),
    ("causal 4096", 1, 8, 4096, 64, True),
    ("the full suite's attention mixer (t 4096)", 8, 4, 4096, 12, True),
    ("causal 8192, head dim 12", 1, 4, 8192, 12, True),
]


def runner(fn, b, h, t, d, causal, backward: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, 3 * h * d, generator=g, requires_grad=backward)
    grad = torch.randn(b, t, h * d, generator=g)

    def run():
        with torch.set_grad_enabled(backward):
            q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in qkv.split(h * d, dim=-1))
            y = fn(q, k, v, causal).transpose(1, 2).reshape(b, t, h * d)
            if backward:
                (gq,) = torch.autograd.grad(y, qkv, grad)
                return y, gq
            return y, None

    return run


def ours(q, k, v, causal):
    return kernel.attention(q, k, v, causal)


def theirs(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def model_steps(quick: bool) -> list[tuple[str, object]]:
    """(name, a training step of a seqlab model): forward, a loss, backward and an AdamW update."""
    import seqlab.models as models
    from seqlab.lab.budget import build_lab_model
    from seqlab.lab.suite import SUITES
    from seqlab.lab.systems import VOCAB_SIZE

    g = torch.Generator().manual_seed(0)

    def lm_step(model, ids):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            model(ids).float().logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    def padded(b, t, vocab, low):
        ids = torch.randint(4, vocab, (b, t), generator=g)
        lengths = torch.randint(low, t + 1, (b,), generator=g)
        return ids, torch.arange(t)[None, :] < lengths[:, None]

    steps = []
    tr = models.create("transformer-small", vocab_size=2000, d_model=128, n_heads=4, d_ff=512).train()
    src, keep = padded(64, 60, 2000, 20)
    src[~keep] = tr.config.pad_id
    tgt = torch.randint(4, 2000, (64, 60), generator=g)
    opt_tr = torch.optim.AdamW(tr.parameters(), lr=1e-4)

    def translation():
        tr(src, tgt).float().mean().backward()
        opt_tr.step()
        opt_tr.zero_grad(set_to_none=True)

    steps.append(
        (
            "translation suite's Transformer (3+3 × 128, 4 heads, batch 64 × 60, padded, dropout 0.1)",
            translation,
        )
    )
    enc = models.create("bert-base", vocab_size=2000, n_layers=4, n_heads=4, d_model=256, d_ff=1024).train()
    ids, mask = padded(32, 128, 2000, 40)
    opt_enc = torch.optim.AdamW(enc.parameters(), lr=1e-4)

    def encoder():
        enc(ids, attention_mask=mask).float().mean().backward()
        opt_enc.step()
        opt_enc.zero_grad(set_to_none=True)

    steps.append(("BERT-style encoder (4 × 256, 4 heads, batch 32 × 128, padded, dropout 0.1)", encoder))
    tiny = models.create("gpt-tiny", vocab_size=256).train()
    steps.append(
        (
            "gpt-tiny (6 × 192, 6 heads, batch 16 × 256, dropout 0.1)",
            lm_step(tiny, torch.randint(0, 256, (16, 256), generator=g)),
        )
    )
    if not quick:
        gpt = models.create(
            "gpt-tiny", vocab_size=256, n_layers=4, d_model=256, n_heads=4, dropout=0.0
        ).train()
        steps.append(
            (
                "the GPT benchmark's shape (4 × 256, 4 heads, batch 16 × 256)",
                lm_step(gpt, torch.randint(0, 256, (16, 256), generator=g)),
            )
        )
        lab = build_lab_model("attention", SUITES["quick"], {"vocab_size": VOCAB_SIZE}, 0)[0].train()
        steps.append(
            (
                "the lab's attention mixer (quick suite, batch 8 × 1024)",
                lm_step(lab, torch.randint(0, 256, (8, 1024), generator=g)),
            )
        )
        full = build_lab_model("attention", SUITES["full"], {"vocab_size": VOCAB_SIZE}, 0)[0].train()
        steps.append(
            (
                "the lab's attention mixer at the full suite's longest length (batch 8 × 4096; the kernel takes "
                "it where max_keys allows)",
                lm_step(full, torch.randint(0, 256, (8, 4096), generator=g)),
            )
        )
        vit = models.create("vit-fashion").train()
        images = torch.rand(128, 1, 28, 28, generator=g)
        labels = torch.randint(0, 10, (128,), generator=g)
        opt_vit = torch.optim.AdamW(vit.parameters(), lr=1e-4)

        def vit_step():
            torch.nn.functional.cross_entropy(vit(images), labels).backward()
            opt_vit.step()
            opt_vit.zero_grad(set_to_none=True)

        steps.append(("vit-fashion (6 × 128, patch 7, batch 128)", vit_step))
    return steps


def model_rows(repeats: int, quick: bool) -> list[str]:
    """Training step time of each model with the kernel on and off, alternating."""
    real = kernel.why_not_shapes

    def switched(step, on: bool):
        def run():
            kernel.why_not_shapes = real if on else (lambda *a, **k: "off for the comparison")
            try:
                step()
            finally:
                kernel.why_not_shapes = real

        return run

    rows = []
    for name, step in model_steps(quick):
        med, sp, mark = summarize(
            alternate({"on": switched(step, True), "off": switched(step, False)}, repeats)
        )
        rows.append(
            f"| {name} | {med['on'] * 1e3:,.1f} ({sp['on']:.0%}) | {med['off'] * 1e3:,.1f} ({sp['off']:.0%}) | "
            f"**{med['off'] / med['on']:.2f}**{mark} |"
        )
        print(rows[-1], flush=True)
    return rows


def spread(v: list[float]) -> float:
    q1, _, q3 = statistics.quantiles(v, n=4)
    return (q3 - q1) / statistics.median(v)


def summarize(times: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, float], str]:
    """Each contender's median and spread, and the mark of a row whose spread is over 10%."""
    med = {n: statistics.median(v) for n, v in times.items()}
    sp = {n: spread(v) for n, v in times.items()}
    return med, sp, " (!)" if max(sp.values()) > 0.10 else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 repeats, the first four shapes, no file written")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the table here instead of benchmarks/results/")
    p.add_argument(
        "--models", action="store_true", help="add whole models' training steps, kernel on and off"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shapes, repeats = (SHAPES[:4], 3) if args.quick else (SHAPES, args.repeats)
    kernel.EXTENSION.load()
    build = kernel.EXTENSION.build_info()
    if "error" in build:
        sys.exit(f"the attention kernel could not be built: {build['error']}")
    load_before = os.getloadavg()[0]
    rows, worst = [], 0.0
    for name, b, h, t, d, causal in shapes:
        for backward in (False, True):
            fns = {
                "seqlab": runner(ours, b, h, t, d, causal, backward),
                "torch": runner(theirs, b, h, t, d, causal, backward),
            }
            (y1, g1), (y2, g2) = fns["seqlab"](), fns["torch"]()
            worst = max(worst, (y1 - y2).abs().max().item())
            if backward:
                worst = max(worst, ((g1 - g2).abs().max() / g2.abs().max()).item())
            times = alternate(fns, repeats if t * b < 8192 or not backward else max(5, repeats // 2))
            med, spreads, mark = summarize(times)
            rows.append(
                f"| {name} | {b} | {h} | {t} | {d} | {'yes' if causal else 'no'} | "
                f"{'fwd+bwd' if backward else 'fwd'} | {med['seqlab'] * 1e3:,.2f} ({spreads['seqlab']:.0%}) | "
                f"{med['torch'] * 1e3:,.2f} ({spreads['torch']:.0%}) | **{med['torch'] / med['seqlab']:.2f}**{mark} |"
            )
            print(rows[-1], flush=True)
    model_lines = []
    if args.models or args.quick:
        model_lines = [
            "",
            "Whole training steps (forward, backward, AdamW) with seqlab's attention kernel on and off (off: torch's "
            "SDPA for every call), alternating; ms: median (IQR / median); ratio = off / on.",
            "",
            "| model | kernel on (ms) | kernel off (ms) | ratio |",
            "|---|---:|---:|---:|",
            *model_rows(3 if args.quick else 9, args.quick),
        ]
    load_after = os.getloadavg()[0]
    how = "loaded from the cache" if build["cached"] else "compiled"
    text = "\n".join(
        [
            f"# Attention kernel vs torch's fused CPU SDPA ({cpu_name()}, torch {torch.__version__})",
            "",
            f"- CPU: {cpu_name()}; {torch.get_num_threads()} threads; float32; {dt.date.today()}; load average "
            f"{load_before:.2f} before, {load_after:.2f} after",
            f"- command: `python benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}`",
            f"- kernel {how} in {build['seconds']:.1f} s before timing (first use on a machine compiles it, "
            "about 10 s; later processes load the cached build)",
            f"- ms per call: median (interquartile range / median), the two alternating, {repeats} repeats "
            "(half, at least 5, for the largest backward rows); ratio = torch / seqlab (above 1: seqlab faster); "
            "(!) marks a spread above 10%" + (" Quick run." if args.quick else ""),
            f"- agreement before timing: max |Δ output| and max relative |Δ input gradient| {worst:.1e}",
            "",
            "| shape | b | h | t | d | causal | pass | seqlab ms | torch ms | ratio |",
            "|---|---:|---:|---:|---:|---|---|---:|---:|---:|",
            *rows,
            *model_lines,
            "",
        ]
    )
    print(text)
    out = args.out or (None if args.quick else result_file("attention-kernel"))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
