"""bf16 autocast against fp32 on the CPU, for every mixer: one LM training step (forward, loss, backward).

Each mixer in the same LM (d 128, 2 layers, vocabulary 96, batch 16 x 256), the two precisions alternating
which goes first from repeat to repeat, medians over repeats; bf16 is ``torch.autocast("cpu", torch.bfloat16)``
around the forward and the loss (fp32 weights, the loss in fp32), what ``train.precision: bf16`` runs. On a CPU
without bf16 matmul units (no AMX, no AVX512-BF16) bf16 is emulated and the ratios say how much slower it is there.

    python benchmarks/bench_cpu_bf16.py             # writes benchmarks/results/cpu-bf16-<cpu>-torch<version>.md
    python benchmarks/bench_cpu_bf16.py --quick     # 2 repeats, no file written
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics

import torch
import torch.nn.functional as F

from common import alternate, report
from seqlab.lab.report import cpu_name
from seqlab.layers import list_mixers
from seqlab.models import create
from seqlab.training.config import cpu_has_bf16_matmul


def step_fn(model, ids: torch.Tensor, bf16: bool):
    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        for p in model.parameters():
            p.grad = None

    return step


def measure(name: str, repeats: int) -> dict[str, float]:
    """Median seconds per step of one mixer's LM in fp32 and under bf16 autocast, alternating."""
    torch.manual_seed(0)
    model = create("test-lm-lstm", mixer=name, d_model=128, n_layers=2, vocab_size=96).train()
    ids = torch.randint(0, 96, (16, 257))
    times = alternate({"fp32": step_fn(model, ids, False), "bf16": step_fn(model, ids, True)}, repeats)
    return {n: statistics.median(v) for n, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, no file written")
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    repeats = 2 if args.quick else args.repeats
    units = "yes (AMX or AVX512-BF16)" if cpu_has_bf16_matmul() else "no: bf16 matmuls are emulated"
    lines = [
        f"# bf16 autocast vs fp32 on the CPU, every mixer ({cpu_name()}, torch {torch.__version__})",
        "",
        f"- CPU: {cpu_name()}; {torch.get_num_threads()} threads; bf16 matmul units: {units}; {dt.date.today()}",
        "- one LM training step (forward, cross-entropy, backward), d 128, 2 layers, batch 16 x 256; "
        f"{repeats} repeats, the two precisions alternating; ms/step: medians",
        "- command: `python benchmarks/bench_cpu_bf16.py" + (" --quick`" if args.quick else "`"),
        "",
        "| mixer | fp32 ms/step | bf16 autocast ms/step | bf16 speed-up |",
        "|---|---:|---:|---:|",
    ]
    for name in list_mixers():
        med = measure(name, repeats)
        lines.append(
            f"| {name} | {med['fp32'] * 1e3:,.1f} | {med['bf16'] * 1e3:,.1f} | **{med['fp32'] / med['bf16']:.2f}** |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    report("cpu-bf16", text, args.quick)


if __name__ == "__main__":
    main()
