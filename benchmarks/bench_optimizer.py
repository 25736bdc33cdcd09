"""The trainer's AdamW step: torch's fused implementation (what ``seqlab.training.optim.make_optimizer`` picks
where it takes the parameters) against the per-parameter loop torch uses by default on the CPU, and ``foreach``.

Three AdamW optimizers over the same parameter groups (weight decay on matrices only) with fixed random
gradients, stepping alternately, medians over repeats; and the largest difference between the fused and the
default update after 20 steps from the same state (same algorithm, different rounding order).

    python benchmarks/bench_optimizer.py          # writes benchmarks/results/optimizer-<cpu>-torch<version>.md
    python benchmarks/bench_optimizer.py --quick  # 5 repeats, no file written
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import statistics

import torch

from common import alternate, report
from seqlab.lab.report import cpu_name
from seqlab.models import create
from seqlab.training.optim import param_groups

MODELS = {
    "gpt-tiny": {},
    "lstm-lm-small": {},
    "lstm-lm (2 x 512)": {"name": "test-lm-lstm", "d_model": 512, "n_layers": 2, "vocab_size": 96},
    "mamba-small": {},
}
KINDS = {"default (for-loop)": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def build(label: str) -> torch.nn.Module:
    fields = dict(MODELS[label])
    model = create(fields.pop("name", label), **fields)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return model


def drift(model: torch.nn.Module, steps: int = 20) -> float:
    """Max |Δ parameter| between the default and the fused AdamW after ``steps`` steps from the same state."""
    a, b = model, copy.deepcopy(model)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        q.grad = p.grad.clone()
    oa = torch.optim.AdamW(param_groups(a, 0.1), lr=1e-3, foreach=False)
    ob = torch.optim.AdamW(param_groups(b, 0.1), lr=1e-3, fused=True)
    for _ in range(steps):
        oa.step(), ob.step()
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    repeats = 5 if args.quick else args.repeats
    lines = [
        f"# AdamW step: fused vs torch's CPU default ({cpu_name()}, torch {torch.__version__})",
        "",
        f"- {cpu_name()}; {torch.get_num_threads()} threads; {dt.date.today()}; {repeats} repeats, the three "
        "optimizers alternating; ms per step: medians; command: `python benchmarks/bench_optimizer.py`",
        "",
        "| model | parameters (tensors) | " + " | ".join(f"{k} ms" for k in KINDS) + " | fused speed-up | "
        "max |Δ param| after 20 steps |",
        "|---|---:|" + "---:|" * len(KINDS) + "---:|---:|",
    ]
    for label in MODELS:
        model = build(label)
        opts = {k: torch.optim.AdamW(param_groups(model, 0.1), lr=1e-6, **kw) for k, kw in KINDS.items()}
        times = alternate({k: o.step for k, o in opts.items()}, repeats)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        params = list(model.parameters())
        lines.append(
            f"| {label} | {sum(p.numel() for p in params):,} ({len(params)}) | "
            + " | ".join(f"{med[k]:.2f}" for k in KINDS)
            + f" | **{med['default (for-loop)'] / med['fused']:.1f}×** | {drift(model):.1e} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    report("optimizer", text, args.quick)


if __name__ == "__main__":
    main()
