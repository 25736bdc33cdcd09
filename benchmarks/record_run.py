"""Record a finished training run: its validation curve, wall time and throughput, as markdown and PNG.

    python benchmarks/record_run.py runs/lstm-shakespeare --name lstm-shakespeare

writes ``benchmarks/results/<name>-<cpu>-torch<version>.md`` (and ``.png`` when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch

from seqlab.lab.report import cpu_name, hardware_slug


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    records = [
        json.loads(ln) for ln in (args.run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()
    ]
    latest = (args.run_dir / "latest").read_text().strip()
    config = json.loads((args.run_dir / latest / "config.json").read_text())
    val = [r for r in records if r["split"] == "val"]
    train = [r for r in records if r["split"] == "train"]
    tps = sorted(r["tokens_per_s"] for r in train[1:]) or [float("nan")]
    stem = f"{args.name}-{hardware_slug(cpu_name(), 2)}-torch{torch.__version__.split('+')[0]}"
    args.out.mkdir(parents=True, exist_ok=True)

    lines = [
        f"# {args.name}",
        "",
        f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
        f"{datetime.date.today().isoformat()}",
        f"- model: `{config['run']['model']}`, task: `{config['run']['task']}`",
        f"- train settings: `{config['run']['train']}`",
        f"- final step {config['step']}, wall time of training {val[-1]['elapsed_s'] / 60:.2f} min "
        f"(evaluation excluded), median throughput {tps[len(tps) // 2]:,.0f} tokens/s",
        f"- final validation loss: **{val[-1]['val_loss']:.4f} nats/char**",
        "",
        "| step | minutes | train loss | val loss |",
        "|---:|---:|---:|---:|",
    ]
    train_at = {r["step"]: r["loss"] for r in train}
    for r in val:
        lines.append(
            f"| {r['step']} | {r['elapsed_s'] / 60:.2f} | {train_at.get(r['step'], float('nan')):.4f} "
            f"| {r['val_loss']:.4f} |"
        )
    md = args.out / f"{stem}.md"
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["elapsed_s"] / 60 for r in train], [r["loss"] for r in train], label="train", alpha=0.6)
    ax.plot([r["elapsed_s"] / 60 for r in val], [r["val_loss"] for r in val], "o-", label="validation")
    ax.set_xlabel("minutes of training")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(args.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / f"{stem}.png", dpi=110)
    print(f"wrote {md} and {md.with_suffix('.png')}")


if __name__ == "__main__":
    main()
