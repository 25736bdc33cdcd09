"""``seqlab compare --suite captioning``: does attention help a captioner, and does it generalize to unseen
combinations? Measured on the generated scenes (``seqlab.tasks.scenes``).

Three captioners learn to describe 64×64 scenes of one or two objects ("a small red circle above a large blue
square") at matched parameter counts and matched training time:

* Show and Tell (Vinyals et al. 2015): the image reaches the LSTM once, as one vector (the bottleneck);
* Show, Attend and Tell (Xu et al. 2015): soft attention over an 8 × 8 grid of CNN regions at every word;
* ViT + Transformer decoder: cross-attention from every word to the Vision Transformer's 64 patch tokens.

The two CNN models share the encoder; the decoder widths are chosen so that each model has Show, Attend and
Tell's parameter count (within a few percent). Each trains for the same wall-clock minutes on one thread
(``threads``: more; a calibration times its first steps, then the steps that fit are trained with the full
schedule, at least :data:`seqlab.lab.budget.MIN_STEPS`, said in the log when that is more). Each is
then scored on test scenes of the colour–shape pairs seen in training and on the held-out split, whose
scenes contain a pair never seen (say, a red triangle): BLEU-4, CIDEr-D and the attributes read back from
the caption (every object's size, colour and shape and the relation right = "exact").

Every run is an ordinary checkpoint directory (``DIR/runs/<name>``), so ``seqlab caption``, ``seqlab eval``
and ``seqlab viz caption`` read it; a finished run is reused when the compare is run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from seqlab.lab.budget import MIN_STEPS, check_budget, floored_steps
from seqlab.lab.records import write_output
from seqlab.lab.translation import match_width, slug, threads_said, timed_train, train_all

CNN = {"channels": [16, 32, 64]}
CONTENDERS: dict[str, tuple[str, dict[str, Any]]] = {
    "Show and Tell": ("show-tell", dict(CNN)),
    "Show, Attend and Tell": ("show-attend-tell", {**CNN, "d_model": 320}),
    "ViT + Transformer": ("vit-captioner", {"d_encoder": 128, "n_encoder_layers": 4, "n_decoder_layers": 2}),
}
REFERENCE = "Show, Attend and Tell"
"""The contender whose parameter count the others match."""
TASK = {"name": "captioning", "source": "scenes", "image_size": 64, "batch_size": 64, "n_train": 20000}
LR = {"lstm": 2e-3, "transformer": 1e-3}
SPLITS = ("test", "heldout")


def _planned(label: str, fields: dict[str, Any], minutes: float, seed: int) -> dict[str, Any]:
    """The run dict of a contender, its steps those that a calibration says fit in ``minutes``."""
    from seqlab.run import build_run

    preset = CONTENDERS[label][0]
    run = {"model": {"name": preset, **fields}, "task": {**TASK, "seed": seed}, "train": {"steps": 30}}
    model, task, _ = build_run(run)
    steps = floored_steps(label, minutes, _seconds_per_step(model, task))
    run["train"] = timed_train(
        steps,
        seed,
        lr=LR[model.config.decoder],
        warmup_steps=min(300, steps // 10),
        weight_decay=0.01,
        eval_batches=16,
    )
    return run


def _seconds_per_step(model, task, n: int = 6) -> float:
    """Median seconds of a training step (forward, backward, AdamW) over ``n`` batches after a warm-up."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for i in range(n + 1):
        batch = task.get_batch("train", i)
        t0 = time.perf_counter()
        loss, _, _ = task.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[n // 2]


def plan() -> dict[str, dict[str, Any]]:
    """Each contender's model fields, the others' d_model matched to the reference's parameter count."""
    from seqlab.models import count_parameters

    vocab = 21  # the scenes' grammar: 17 words and 4 specials (checked against the task when scoring)
    size = {"vocab_size": vocab, "image_size": TASK["image_size"]}
    preset, base = CONTENDERS[REFERENCE]
    target = count_parameters(preset, **size, **base)
    fields = {}
    for label, (preset, base) in CONTENDERS.items():
        fields[label] = dict(base)
        if label != REFERENCE:
            fields[label]["d_model"] = match_width(
                preset, {**base, "image_size": TASK["image_size"]}, target, vocab
            )
    return fields


def compare_captioning(
    out: str | Path,
    minutes: float = 12.0,
    jobs: int = 2,
    seed: int = 0,
    beam_size: int = 3,
    threads: int | None = None,
) -> dict[str, Path]:
    """Train the three contenders (``jobs`` at a time, ``threads`` torch threads each, default one), score them,
    write the report."""

    from seqlab.run import build_task

    check_budget(minutes, threads, len(CONTENDERS))
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    fields = plan()
    print(
        f"captioning suite: {len(CONTENDERS)} models x {minutes:g} min (at least {MIN_STEPS} steps each), "
        f"{jobs} at a time, {threads or 1} thread(s) each -> {out}",
        flush=True,
    )
    runs = {label: fields[label] for label in CONTENDERS}
    trained = train_all(runs, out, minutes, seed, jobs, _planned, threads)
    task = build_task({"task": {**TASK, "seed": seed}})
    records = [_score(label, fields[label], trained[label], task, out, beam_size) for label in CONTENDERS]
    write_output(out / "results.json", json.dumps(records, indent=1))
    return {
        "results": out / "results.json",
        "table": write_table(out, records, minutes, beam_size),
        "plot": write_plot(out, records),
        **write_attention(out, task, seed),
    }


def _score(label, fields, trained, task, out: Path, beam_size: int) -> dict[str, Any]:
    from seqlab.models import count_parameters
    from seqlab.training.checkpoint import load_config, load_model, resolve_checkpoint

    where = resolve_checkpoint(out / "runs" / slug(label))
    if load_config(where)["task"].get("vocabulary") != task.describe()["vocabulary"]:
        raise RuntimeError(f"{where} was trained with another vocabulary than the suite's task builds")
    model = load_model(where).eval()
    rec = {
        "label": label,
        "preset": CONTENDERS[label][0],
        "fields": fields,
        "params": count_parameters(model),
        "steps": trained["steps"],
        "train_minutes": trained["summary"]["elapsed_s"] / 60,
        "threads": trained.get("threads", 1),
        "val_nll": trained["summary"].get("val_nll"),
    }
    for split in SPLITS:
        rec[split] = task.score(model, split, beam_size=beam_size)
    ids = model.generate(task.prepare(task.images("heldout")[:4]), beam_size=beam_size)
    rec["examples"] = [
        {"reference": task.references("heldout")[i][0], "output": task.decode(ids[i])} for i in range(4)
    ]
    print(
        f"{label}: exact {rec['test']['exact']:.3f} seen, {rec['heldout']['exact']:.3f} held out", flush=True
    )
    return rec


def write_table(out: Path, records: list[dict[str, Any]], minutes: float, beam_size: int) -> Path:
    from seqlab.lab.report import cpu_name

    lines = [
        f"# Captioning generated scenes: {minutes:g} min of training each, {cpu_name()}",
        "",
        f"torch {torch.__version__}, {threads_said(records)} per run, fp32. "
        f"`seqlab compare --suite captioning --minutes {minutes:g}`. Beam {beam_size}. 'seen': 1,000 test scenes "
        "of colour–shape pairs seen in training; 'held out': 1,000 scenes each holding a pair never seen. "
        "exact = every object's size, colour and shape and the relation read back right; BLEU-4 by sacrebleu, "
        "CIDEr-D by pycocoevalcap, both against the scene's two equivalent captions.",
        "",
        "| model | parameters | steps | minutes | val nll | exact seen | exact held out | colour held out "
        "| shape held out | relation seen | BLEU-4 seen | CIDEr-D seen | BLEU-4 held out |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        s, h = r["test"], r["heldout"]
        nll = f"{r['val_nll']:.3f}" if r.get("val_nll") is not None else "–"
        lines.append(
            f"| {r['label']} | {r['params']:,} | {r['steps']:,} | {r['train_minutes']:.1f} | {nll} | "
            f"{s['exact']:.3f} | {h['exact']:.3f} | {h['colour']:.3f} | {h['shape']:.3f} | {s['relation']:.3f} | "
            f"{s['bleu4']:.1f} | {s['cider_d']:.2f} | {h['bleu4']:.1f} |"
        )
    lines += ["", "Held-out examples (reference → output):", ""]
    for r in records:
        lines += [f"- {r['label']}:"] + [f"  - {e['reference']} → {e['output']}" for e in r["examples"]]
    return write_output(out / "table.md", "\n".join(lines) + "\n")


def write_plot(out: Path, records: list[dict[str, Any]]) -> Path:
    from seqlab.lab.records import write_figure
    from seqlab.viz.figures import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.38
    for k, (split, name) in enumerate((("test", "seen pairs"), ("heldout", "held-out pairs"))):
        xs = [i + (k - 0.5) * width for i in range(len(records))]
        ax.bar(xs, [r[split]["exact"] for r in records], width, label=name)
    ax.set_xticks(range(len(records)), [r["label"] for r in records])
    ax.set_ylabel("captions exactly right")
    ax.set_ylim(0, 1)
    ax.set_title("Captioning generated scenes: seen vs held-out colour–shape pairs")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return write_figure(fig, out / "exact-seen-heldout.png")


def write_attention(out: Path, task, seed: int) -> dict[str, Path]:
    """The attention figure of each attentive contender on the same held-out scene."""
    from seqlab.lab.records import write_kept
    from seqlab.training.checkpoint import load_model, resolve_checkpoint
    from seqlab.viz.captions import caption_figure_data, plot_caption_attention

    paths = {}
    image = task.images("heldout")[1]
    for label, (preset, _) in CONTENDERS.items():
        model = load_model(resolve_checkpoint(out / "runs" / slug(label))).eval()
        if model.config.attention == "none":
            continue
        ids, alpha = caption_figure_data(model, task.prepare, image)
        words = task.words(ids)
        title = f"{label}: {task.decode(ids)}"
        paths[f"attention-{slug(preset)}"] = write_kept(
            out / f"attention-{preset}.png",
            lambda where: plot_caption_attention(image, words, alpha, where, title=title),  # noqa: B023
        )
    return paths
