"""seqlab's ViT against Hugging Face's ViTForImageClassification with the same weights: training throughput.

One forward + cross-entropy + backward on a batch of random images (fp32, training mode, dropout 0), gradients
set to None after each; images/s and tokens/s (tokens = patches + the class token) from the median over
repeats, the two contenders alternating which goes first from repeat to repeat. The ratio of the minima is
reported beside the ratio of the medians: on a CPU shared with other jobs a step is slowed by bursts (a
descheduled OpenMP thread stalls the other at every barrier), and the fastest step is the least disturbed. seqlab's model is made from
HF's by the production converter (``seqlab.interop.hf_vit.convert_vit``); HF runs with
``attn_implementation="sdpa"`` (its default; the file says which one it used). Before timing, the logits (eval
mode) and every parameter's gradient are compared.

Both step the same model to the same logits and gradients; seqlab gets there with less work where it can:
with 'cls' pooling its last layer runs for the class token alone (the only row the classifier reads; the
other tokens still serve as keys and values), and its patch embedding is one matrix multiply over the
patches laid out as rows rather than a convolution.

Configurations (class token, learned positions, 10 classes), each at batch 128 and ``fashion`` at 16 too,
where per-call overheads weigh more:

    fashion   1×28×28, patch 4 (7×7 = 49 patches, T = 50), d 128, 6 layers, 4 heads, d_ff 512
    cifar     3×32×32, patch 4 (8×8 = 64 patches, T = 65), d 192, 6 layers, 3 heads, d_ff 768

On a CPU that multiplies bf16 in hardware (AMX, AVX512-BF16; ``--bf16`` forces it elsewhere) every config is
also timed under CPU bf16 autocast, the four steps (two libraries, two precisions) alternating in one loop.

``--profile`` adds a torch.profiler breakdown of each batch-128 config (self CPU time by kind of op, the
minimum per kind over 3 alternating one-step rounds), the evidence for where the two differ.

    python benchmarks/bench_vit.py --profile     # writes benchmarks/results/vit-<cpu>-torch<version>.md
    python benchmarks/bench_vit.py --quick       # a smoke run that writes no file

On a shared machine the absolute numbers move with the load; the ratios, measured alternately, move less.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from common import add_keep_heap, alternate, keep_heap, report
from seqlab.lab.report import cpu_name
from seqlab.training.config import cpu_has_bf16_matmul

CONFIGS = {
    "fashion": dict(
        image_size=28, patch_size=4, num_channels=1, hidden_size=128, num_hidden_layers=6, heads=4
    ),
    "cifar": dict(image_size=32, patch_size=4, num_channels=3, hidden_size=192, num_hidden_layers=6, heads=3),
}

# op name -> kind, for the profile's breakdown (anything else is "other")
KINDS = {
    "aten::mm": "matmul",
    "aten::addmm": "matmul",
    "aten::bmm": "matmul",
    "mkldnn::_linear_pointwise": "matmul",  # seqlab.kernels.gemm: oneDNN's products, where it is the faster
    "_Linear": "matmul",
    "_LinearBackward": "matmul",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention (SDPA)",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention (SDPA)",
    "_PackedAttention": "attention (SDPA)",  # seqlab's attention kernel (seqlab.kernels.attention)
    "_PackedAttentionBackward": "attention (SDPA)",
    "_Attention": "attention (SDPA)",
    "_AttentionBackward": "attention (SDPA)",
    "_LayerNorm": "LayerNorm",  # seqlab's LayerNorm kernel
    "_LayerNormBackward": "LayerNorm",
    "aten::native_layer_norm": "LayerNorm",
    "aten::native_layer_norm_backward": "LayerNorm",
    "aten::gelu": "GELU",
    "aten::gelu_backward": "GELU",
    "_Gelu": "GELU",  # seqlab's GELU kernel (seqlab.kernels.activations)
    "_GeluBackward": "GELU",
    "_GeluBias": "GELU",  # ... with fc1's bias added inside and its gradient summed in the backward pass
    "_GeluBiasBackward": "GELU",
    "aten::mkldnn_convolution": "patch embedding (conv)",
    "aten::convolution_backward": "patch embedding (conv)",
    "aten::copy_": "copies (copy_, cat, clone)",
    "aten::cat": "copies (copy_, cat, clone)",
    "aten::clone": "copies (copy_, cat, clone)",
    "aten::_to_copy": "copies (copy_, cat, clone)",  # autocast's casts
    "aten::sum": "bias gradients (sum)",
    "aten::add": "residual adds, gradient accumulation",
    "aten::add_": "residual adds, gradient accumulation",
    "aten::fill_": "zero fills",
    "aten::zero_": "zero fills",
}


def contenders(name: str, batch: int, seed: int = 0):
    """HF's ViTForImageClassification (SDPA), seqlab's copy of it, a batch of images and labels."""
    import transformers

    from seqlab.interop.hf_vit import convert_vit

    fields = dict(CONFIGS[name])
    heads = fields.pop("heads")
    torch.manual_seed(seed)
    cfg = transformers.ViTConfig(
        **fields,
        num_attention_heads=heads,
        intermediate_size=4 * fields["hidden_size"],
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    hf = transformers.ViTForImageClassification(cfg).train()
    ours = convert_vit(hf)
    g = torch.Generator().manual_seed(seed + 1)
    size = fields["image_size"]
    images = torch.rand(batch, fields["num_channels"], size, size, generator=g)
    labels = torch.randint(0, 10, (batch,), generator=g)
    return hf, ours, images, labels


def train_step(model, logits_of, images, labels, bf16=False):
    """One forward + backward; ``bf16``: under CPU bf16 autocast (fp32 weights, the loss in fp32), as
    ``train.precision: bf16`` runs it."""

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(logits_of(model, images).float(), labels)
        loss.backward()
        for p in model.parameters():
            p.grad = None

    return step


def agreement(hf, ours, images, labels) -> tuple[float, float]:
    """Max |Δ logits| (eval mode) and the max over parameters of max |Δ grad| / max |grad| (one step)."""
    from seqlab.interop.hf_vit import map_vit_state

    hf.eval(), ours.eval()
    with torch.no_grad():
        d_logits = (ours(images) - hf(images).logits).abs().max().item()
    hf.train(), ours.train()
    F.cross_entropy(hf(images).logits, labels).backward()
    F.cross_entropy(ours(images), labels).backward()
    theirs = map_vit_state({n: p.grad for n, p in hf.named_parameters()}, ours.config.n_layers)
    d_grad = max(
        ((p.grad - theirs[n]).abs().max() / theirs[n].abs().max().clamp_min(1e-30)).item()
        for n, p in ours.named_parameters()
    )
    hf.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    return d_logits, d_grad


def profile_step(fn) -> dict[str, float]:
    """Self CPU milliseconds of one step by kind of op (``KINDS``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    out: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        out[KINDS.get(e.key, "other")] += e.self_cpu_time_total / 1e3
    return dict(out)


def profile_table(name: str, fns: dict, rounds: int = 3) -> list[str]:
    """Per kind of op, the least self CPU time over ``rounds`` alternating profiled steps of each contender."""
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in fns}
    for r in range(rounds):
        for n in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            runs[n].append(profile_step(fns[n]))
    prof = {n: {k: min(run.get(k, 0.0) for run in v) for k in set().union(*v)} for n, v in runs.items()}
    kinds = sorted(set(prof["seqlab"]) | set(prof["hf"]), key=lambda k: -prof["hf"].get(k, 0.0))
    lines = [
        f"Profile, `{name}`: self CPU ms of one step by kind of op, the minimum over {rounds} alternating rounds",
        "",
        "| kind of op | seqlab (ms) | HF (ms) | HF - seqlab (ms) |",
        "|---|---:|---:|---:|",
    ]
    for k in [*kinds, "total"]:
        s = sum(prof["seqlab"].values()) if k == "total" else prof["seqlab"].get(k, 0.0)
        h = sum(prof["hf"].values()) if k == "total" else prof["hf"].get(k, 0.0)
        lines.append(f"| {k} | {s:,.0f} | {h:,.0f} | {h - s:+,.0f} |")
    return [*lines, "", "(the total row sums the per-kind minima)", ""]


def run_config(
    name: str, batch: int, repeats: int, profile: bool, bf16: bool
) -> tuple[list[str], list[str], str]:
    """The table rows (fp32, and bf16 autocast if asked: all four steps alternating in one loop), the profile
    lines (if asked) and a parity line for one configuration and batch."""
    hf, ours, images, labels = contenders(name, batch)
    d_logits, d_grad = agreement(hf, ours, images, labels)
    fns, precisions = {}, ["fp32", "bf16"] if bf16 else ["fp32"]
    for prec in precisions:
        fns[f"seqlab {prec}"] = train_step(ours, lambda m, x: m(x), images, labels, prec == "bf16")
        fns[f"hf {prec}"] = train_step(hf, lambda m, x: m(x).logits, images, labels, prec == "bf16")
    times = alternate(fns, repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    c, tokens = ours.config, ours.config.n_tokens
    img = {k: batch / v for k, v in med.items()}
    rows = []
    for prec in precisions:
        s, h = f"seqlab {prec}", f"hf {prec}"
        rows.append(
            f"| {name}: {c.in_channels}×{c.image_size}², patch {c.patch_size}, T {tokens}, d {c.d_model}, "
            f"{c.n_layers} layers, {c.n_heads} heads | {'fp32' if prec == 'fp32' else 'bf16 autocast'} | {batch} "
            f"| {med[s] * 1e3:,.0f} ({best[s] * 1e3:,.0f}) | {med[h] * 1e3:,.0f} ({best[h] * 1e3:,.0f}) "
            f"| {img[s]:,.1f} | {img[h]:,.1f} | {img[s] * tokens:,.0f} | {img[h] * tokens:,.0f} "
            f"| **{med[h] / med[s]:.2f}** | {best[h] / best[s]:.2f} |"
        )
    parity = (
        f"`{name}` batch {batch}: HF attention `{hf.config._attn_implementation}`; max |Δ logits| "
        f"{d_logits:.1e}, max relative |Δ grad| over parameters {d_grad:.1e}"
    )
    profiles = []
    for prec in precisions if profile else []:
        pair = {"seqlab": fns[f"seqlab {prec}"], "hf": fns[f"hf {prec}"]}
        profiles += profile_table(f"{name}, batch {batch}, {prec}", pair)
    return rows, profiles, parity


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, batch 16, no file written")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--small-batch", type=int, default=16, help="fashion's second batch size (0: none)")
    p.add_argument("--profile", action="store_true", help="add a torch.profiler breakdown of each config")
    p.add_argument("--note", default="", help="a line added to the result file (e.g. the machine's load)")
    p.add_argument(
        "--bf16", action="store_true", help="bf16 autocast rows on a CPU without bf16 matmul units too"
    )
    add_keep_heap(p, "vit")
    args = p.parse_args()
    malloc = keep_heap(p, args)
    torch.set_num_threads(args.threads)
    repeats, batch = (2, 16) if args.quick else (args.repeats, args.batch)
    import transformers

    runs = [("fashion", batch), ("cifar", batch)] + (
        [("fashion", args.small_batch)] if args.small_batch else []
    )
    rows, profiles, parity = [], [], []
    bf16 = args.bf16 or cpu_has_bf16_matmul()  # bf16 rows where the CPU multiplies bf16 in hardware
    for i, (name, b) in enumerate(runs):
        row, prof, same = run_config(name, b, repeats, args.profile and i < 2, bf16)
        rows.extend(row), profiles.extend(prof), parity.append(same)
    lines = [
        f"# ViT training step (forward + backward) vs HF ViTForImageClassification ({cpu_name()}, torch "
        f"{torch.__version__})",
        "",
        f"- CPU: {cpu_name()}; {torch.get_num_threads()} threads; fp32"
        + (" and bf16 autocast (fp32 weights, loss in fp32)" if bf16 else "")
        + f"; bf16 matmul units: {'yes' if cpu_has_bf16_matmul() else 'no'}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; {dt.date.today()}",
        f"- command: `python benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}`",
        f"- {repeats} repeats, the contenders of a config (both libraries, each precision) alternating within each "
        "repeat; ms/step: median (minimum); img/s and tok/s "
        "from the medians; ratio = seqlab images/s over HF's (above 1: seqlab faster), of the medians and of the "
        "minima. Target: ratio >= 1.2." + (" Quick run." if args.quick else ""),
        f"- {malloc}",
        *([f"- {args.note}"] if args.note else []),
        "",
        "| config | precision | batch | seqlab ms/step | HF ms/step | seqlab img/s | HF img/s | seqlab tok/s "
        "| HF tok/s | ratio (medians) | ratio (minima) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Same weights, same outputs (checked before timing): " + "; ".join(parity) + ".",
        "",
        *profiles,
    ]
    text = "\n".join(lines)
    report("vit-keep-heap" if args.keep_heap else "vit", text, args.quick)


if __name__ == "__main__":
    main()
