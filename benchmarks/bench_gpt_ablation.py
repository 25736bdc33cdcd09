"""What each part of seqlab's GPT training step costs: the step of ``bench_gpt.py`` (4 x 256, context 256, batch
16, fp32, torch's fused AdamW) timed whole and with one part taken out, alternating, in one process.

Each variant removes one part and keeps every shape, so its saving is what the step spends on that part, the
most that fusing or speeding it up could gain:

* attention: the kernel's call returns the value third of the packed projection (no scores, softmax or
  products, forward or backward);
* LayerNorm: every norm an identity;
* the biases of the QKV, output and second MLP projections removed (the first MLP projection's bias is added
  inside the GELU kernel);
* GELU: the MLP's activation an identity on its product (its bias dropped with it);
* the optimizer: no AdamW update (the gradients are still made and cleared);
* the weight GEMMs alone, nothing else (``bench_gpt.gemm_floor_fn``): the floor under any step built on torch's
  GEMMs.

The table gives each variant's median and its saving as a share of the whole step.

    python benchmarks/bench_gpt_ablation.py          # writes benchmarks/results/gpt-ablation-<cpu>-torch<v>.md
    python benchmarks/bench_gpt_ablation.py --quick  # a smoke run that writes no file
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import os
import statistics
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from bench_gpt import gemm_floor_fn, train_step_fn
from common import alternate, report
from seqlab.lab.report import cpu_name
from seqlab.training.allocator import keep_freed_memory


@contextmanager
def patched(module, name: str, value):
    """``module.name`` set to ``value`` for the duration."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def during(step, module, name: str, value):
    """A call that runs ``step`` with ``module.name`` patched."""

    def run() -> None:
        with patched(module, name, value):
            step()

    return run


def without_norms(model):
    out = copy.deepcopy(model)
    for blk in out.blocks:
        blk.norm1, blk.norm2 = nn.Identity(), nn.Identity()
    out.norm = nn.Identity()
    return out


def without_biases(model):
    out = copy.deepcopy(model)
    for blk in out.blocks:
        blk.mixer.in_proj_bias = None
        blk.mixer.out_proj.bias = None
        blk.mlp.fc2.bias = None
    return out


def no_update_step(model, batch):
    """The training step without the optimizer's update (the gradients made and cleared)."""

    def step() -> None:
        logits = model(batch)  # (b, t, v)
        F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten()).backward()
        model.zero_grad(set_to_none=True)

    return step


def contenders(model, batch) -> dict:
    import seqlab.kernels.attention as attention_kernel
    import seqlab.layers.mlp as mlp_module

    whole = train_step_fn(model, lambda m, x: m(x), batch)

    def value_third(qkv, n_heads, is_causal=False, scale=None, dropout_p=0.0):
        return qkv[..., 2 * qkv.size(-1) // 3 :]

    gemms, _ = gemm_floor_fn(model, batch.numel())
    return {
        "whole step": whole,
        "without attention": during(whole, attention_kernel, "attention_packed", value_third),
        "without LayerNorm": train_step_fn(without_norms(model), lambda m, x: m(x), batch),
        "without the QKV, output and fc2 biases": train_step_fn(
            without_biases(model), lambda m, x: m(x), batch
        ),
        "without GELU": during(whole, mlp_module, "gelu_bias", lambda p, b, approximate="none": p),
        "without the optimizer update": no_update_step(copy.deepcopy(model), batch),
        "the weight GEMMs alone": gemms,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, no file written")
    p.add_argument("--repeats", type=int, default=11)
    args = p.parse_args()
    repeats = 2 if args.quick else args.repeats
    keep_freed_memory()  # as seqlab train runs
    import transformers

    from seqlab.interop.hf_gpt2 import convert_gpt2

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=256, n_positions=256, n_embd=256, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = convert_gpt2(transformers.GPT2LMHeadModel(cfg)).train()
    batch = torch.randint(0, 256, (16, 256))
    load_before = os.getloadavg()[0]
    times = {n: statistics.median(v) * 1e3 for n, v in alternate(contenders(model, batch), repeats).items()}
    whole = times["whole step"]
    lines = [
        "# What each part of seqlab's GPT training step costs (bench_gpt's model, fp32)",
        "",
        f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {dt.date.today()}; medians of "
        f"{repeats} repeats, alternating; freed memory kept (`seqlab train`'s setting); load average before / "
        f"after: {load_before:.2f} / {os.getloadavg()[0]:.2f}.",
        "",
        "| step | ms | saving, share of the whole step |",
        "|---|---:|---:|",
    ]
    for name, ms in times.items():
        saving = "" if name == "whole step" else f"{(whole - ms) / whole:.1%}"
        lines.append(f"| {name} | {ms:.1f} | {saving} |")
    report("gpt-ablation", "\n".join(lines) + "\n", args.quick)


if __name__ == "__main__":
    main()
