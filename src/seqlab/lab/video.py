"""``seqlab compare --suite video``: which token mixer fits which shape of video problem? Measured on the
generated moving objects (``seqlab.tasks.clips``), or (from Python, ``compare_video(data={"source": "folder",
"path": ...})``) on a user's folder of clips, without the generated clips' settings and the task 'long'.

Every registered token mixer runs over the frames of the same per-frame encoder (ViT's patch embedding and one
linear map, ``seqlab.models.video``), at matched parameter counts (the temporal width d_model of each mixer
chosen so that the whole model has the LSTM contender's count, within a few percent) and the same steps,
batches and learning rate. ViViT's factorised encoder (a spatial Transformer per frame, then a bidirectional
temporal Transformer: offline, it sees the whole clip at every frame) runs on request (``--mixers vivit``,
``seqlab.models.video`` says why it is not a default: in these steps it stays at chance). Four tasks:

* action — many to one: the motion class of a 16-frame clip (8 classes), read at the last frame;
* frames — many to many, aligned: an event per frame (absent, appeared, still, moving, turned), macro F1;
* caption — many to many, sequence to sequence: a sentence, the frames read by an attentive LSTM decoder
  (temporal attention); exact match and BLEU-4;
* long — the long-range action: the direction of the first 4 frames only, after which the object vanishes
  and reappears elsewhere doing anything; a model must carry the early frames to the end of the clip.

Every run is an ordinary checkpoint directory (``DIR/runs/<task>-<mixer>``), so ``seqlab eval`` and
``seqlab viz video`` read it; a finished run is reused when the compare is run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from seqlab.lab.budget import width_multiple, width_range
from seqlab.lab.records import write_output
from seqlab.lab.translation import slug, timed_train, train_all

TASKS: dict[str, dict[str, Any]] = {
    "action": {"label": "action", "setting": "short"},
    "frames": {"label": "frames", "setting": "short"},
    "caption": {"label": "caption", "setting": "short"},
    "long": {"label": "action", "setting": "long"},
}
STEPS = {"action": 1000, "frames": 1500, "caption": 1500, "long": 1500}
TASK = {"name": "video", "n_train": 4000, "n_eval": 500, "batch_size": 32}
FRAME = {"frame_encoder": "patch", "patch_size": 4, "d_patch": 16, "d_frame": 64}
VIVIT = {
    "frame_encoder": "vit",
    "temporal": "transformer",
    "patch_size": 8,
    "d_spatial": 48,
    "n_spatial_layers": 1,
    "n_spatial_heads": 4,
    "n_layers": 2,
    "n_heads": 4,
}
REFERENCE = ("lstm", 64)
"""The contender, and its d_model, whose parameter count the others match."""
LR = 2e-3
VIVIT_LABEL = "vivit"


def _fields(contender: str, d_model: int) -> dict[str, Any]:
    if contender == VIVIT_LABEL:
        return {**VIVIT, "d_model": d_model}
    return {**FRAME, "mixer": contender, "d_model": d_model}


def _size(contender: str, d_model: int, task: str) -> int:
    from seqlab.models import count_parameters

    over = {"head": TASKS[task]["label"], "n_classes": 8, "vocab_size": 48}
    return count_parameters("video-lstm", **_fields(contender, d_model), **over)


def plan(
    mixers: list[str] | None = None, tasks: list[str] | None = None, steps: dict[str, int] | None = None
) -> dict[str, dict[str, Any]]:
    """Each run's name -> {task, contender, model fields}: every mixer (or those named) on every task, d_model
    matched per task to the reference's parameter count."""
    from seqlab.layers import list_mixers

    known = [*list_mixers(), VIVIT_LABEL]
    mixers = list(mixers or list_mixers())  # ViViT on request only: it stays at chance in these steps
    tasks = list(tasks or TASKS)
    for name, pool, what in ((mixers, known, "mixer"), (tasks, list(TASKS), "task")):
        unknown = sorted(set(name) - set(pool))
        if unknown:
            raise ValueError(f"unknown video suite {what}(s) {unknown}; known: {', '.join(pool)}")
    runs = {}
    for task in tasks:
        target = _size(*REFERENCE, task)
        for contender in mixers:
            width = 8 if contender == VIVIT_LABEL else width_multiple(contender)  # the registry's step
            d = min(width_range(width), key=lambda d: abs(_size(contender, d, task) - target))
            runs[f"{task} {contender}"] = {
                "task": task,
                "contender": contender,
                "model": _fields(contender, d),
                "steps": {**STEPS, **(steps or {})}[task],
            }
    return runs


def _applying(fields: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """``fields`` without the generated clips' settings when ``data`` names a folder (its clips are the data:
    the task refuses them there)."""
    from seqlab.tasks.video_settings import GENERATED_ONLY

    folder = data.get("source") == "folder"
    return {k: v for k, v in fields.items() if not (folder and k in GENERATED_ONLY)}


def _task_fields(task: str, data: dict[str, Any], seed: int) -> dict[str, Any]:
    return {**_applying(TASK, data), **data, **_applying(TASKS[task], data), "seed": seed}


def _suite_tasks(tasks: list[str] | None, data: dict[str, Any]) -> list[str] | None:
    """The tasks to run: for a folder, every task but 'long' (the generated clips' long setting) unless named;
    'long' named with a folder is refused."""
    if data.get("source") != "folder":
        return tasks
    if tasks is not None and "long" in tasks:
        raise ValueError(
            "the video suite's task 'long' is the long setting of the generated clips (task.setting='long'), "
            f"which does not apply to source='folder' (the folder's clips are the data); leave it out of the "
            f"tasks (those for a folder: {', '.join(t for t in TASKS if t != 'long')})"
        )
    return tasks or [t for t in TASKS if t != "long"]


def _planned(label: str, fields: dict[str, Any], minutes: float, seed: int) -> dict[str, Any]:
    """A run's dict: its fixed steps (``minutes`` is unused: this suite matches steps, not time)."""
    steps = fields["steps"]
    return {
        "model": {"name": "video-lstm", **fields["model"]},
        "task": _task_fields(fields["task"], fields.get("data", {}), seed),
        "train": timed_train(
            steps, seed, lr=LR, warmup_steps=steps // 10, weight_decay=0.01, eval_batches=16
        ),
    }


def compare_video(
    out: str | Path,
    mixers: list[str] | None = None,
    tasks: list[str] | None = None,
    jobs: int = 2,
    seed: int = 0,
    steps: dict[str, int] | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train every (task, contender) run (``jobs`` at a time, one thread each), score it on the test clips,
    write the report. ``steps`` overrides STEPS per task and ``data`` the clips' settings (``n_train``,
    ``n_eval``, ``batch_size``: a smaller suite), or names a folder (``source='folder'``, ``path``: then the
    generated clips' settings are left out, and so is the task 'long')."""

    tasks = _suite_tasks(tasks, dict(data or {}))
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    runs = {k: {**v, "data": dict(data or {})} for k, v in plan(mixers, tasks, steps).items()}
    t0 = time.perf_counter()
    print(f"video suite: {len(runs)} runs, {jobs} at a time -> {out}", flush=True)
    trained = train_all(runs, out, 0.0, seed, jobs, _planned)
    records = _score_all(runs, trained, out, seed)
    minutes = (time.perf_counter() - t0) / 60
    write_output(out / "results.json", json.dumps(records, indent=1))
    return {
        "results": out / "results.json",
        "table": write_table(out, records, minutes),
        "plot": write_plot(out, records),
        "minutes": minutes,
    }


def _score_all(runs, trained, out: Path, seed: int) -> list[dict[str, Any]]:
    """Each run's record with its test metrics (each task built once)."""
    from seqlab.models import count_parameters
    from seqlab.run import build_task
    from seqlab.training.checkpoint import load_config, load_model, resolve_checkpoint

    records, tasks = [], {}
    for label, spec in runs.items():
        key = spec["task"]
        if key not in tasks:
            tasks[key] = build_task({"task": _task_fields(key, spec["data"], seed)})
        where = resolve_checkpoint(out / "runs" / slug(label))
        if load_config(where)["task"].get("vocabulary") != tasks[key].describe().get("vocabulary"):
            raise RuntimeError(f"{where} was trained with another vocabulary than the suite's task builds")
        model = load_model(where).eval()
        summary = trained[label]["summary"]
        test = tasks[key].evaluate(model, max_batches=1000, split="test")
        records.append(
            {
                "label": label,
                "task": key,
                "contender": spec["contender"],
                "d_model": spec["model"]["d_model"],
                "params": count_parameters(model),
                "steps": trained[label]["steps"],
                "data": {**_applying(TASK, spec["data"]), **spec["data"]},
                "n_train": tasks[key].n_clips["train"],
                "n_test": tasks[key].n_clips["test"],
                "clips": (tasks[key].n_frames, tasks[key].frame_size, tasks[key].channels),
                "ms_per_step": 1000 * summary["elapsed_s"] / max(1, trained[label]["steps"]),
                "test": {k.removeprefix("test_"): v for k, v in test.items()},
            }
        )
        print(f"{label}: {_headline(records[-1])}", flush=True)
    return records


HEADLINE = {"action": "acc", "frames": "macro_f1", "caption": "exact", "long": "acc"}


def _headline(record: dict[str, Any]) -> str:
    metric = HEADLINE[record["task"]]
    return f"{metric} {record['test'][metric]:.3f}"


def _family(contender: str) -> str:
    from seqlab.layers import mixer_spec

    return "Transformer (bidirectional)" if contender == VIVIT_LABEL else mixer_spec(contender).family


def write_table(out: Path, records: list[dict[str, Any]], minutes: float) -> Path:
    from seqlab.lab.report import cpu_name

    by = {(r["contender"], r["task"]): r for r in records}
    contenders = list(dict.fromkeys(r["contender"] for r in records))
    tasks = [t for t in TASKS if any(r["task"] == t for r in records)]
    cols = {
        "action": [("action acc", "acc")],
        "frames": [("frames macro F1", "macro_f1"), ("frames acc", "acc")],
        "caption": [("caption exact", "exact"), ("caption BLEU-4", "bleu4")],
        "long": [("long-range acc", "acc")],
    }
    heads = [h for t in tasks for h, _ in cols[t]]
    steps, data = {r["task"]: r["steps"] for r in records}, records[0]["data"]
    n_frames, side, channels = records[0]["clips"]
    n_train, n_test, colour = (
        records[0]["n_train"],
        records[0]["n_test"],
        "grey" if channels == 1 else "colour",
    )
    lines = [
        f"# Video: every token mixer on four shapes of frame-sequence problem, {cpu_name()}",
        "",
        f"torch {torch.__version__}, fp32, one thread per run, {len(records)} runs in {minutes:.1f} min. "
        f"`seqlab compare --suite video`. Steps {', '.join(f'{t} {steps[t]}' for t in tasks)}; batch "
        f"{data['batch_size']} clips of {n_frames} frames ({side}×{side} {colour}), {n_train} training "
        f"clips, AdamW lr {LR}. Metrics on {n_test} test clips. Parameters: the action model's (the heads "
        "differ a little). ms/step: training time per step, measured with the other run of the pair on the second core.",
        "",
        f"| model | family | parameters | {' | '.join(heads)} | ms/step (action) |",
        f"|---|---|---:|{'---:|' * len(heads)}---:|",
    ]
    for c in contenders:
        first = next(by[(c, t)] for t in tasks if (c, t) in by)
        cells = []
        for t in tasks:
            r = by.get((c, t))
            for _, key in cols[t]:
                v = None if r is None else r["test"].get(key)
                cells.append("–" if v is None else f"{v:.1f}" if key == "bleu4" else f"{v:.3f}")
        speed = by.get((c, "action"), first)["ms_per_step"]
        lines.append(f"| {c} | {_family(c)} | {first['params']:,} | {' | '.join(cells)} | {speed:.0f} |")
    return write_output(out / "table.md", "\n".join(lines) + "\n")


def write_plot(out: Path, records: list[dict[str, Any]]) -> Path:
    from seqlab.lab.records import write_figure
    from seqlab.viz.figures import pyplot

    plt = pyplot()
    contenders = list(dict.fromkeys(r["contender"] for r in records))
    tasks = [t for t in TASKS if any(r["task"] == t for r in records)]
    by = {(r["contender"], r["task"]): r for r in records}
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(contenders) + 2), 3.8))
    width = 0.8 / len(tasks)
    for k, t in enumerate(tasks):
        xs = [i + (k - (len(tasks) - 1) / 2) * width for i in range(len(contenders))]
        ys = [by[(c, t)]["test"][HEADLINE[t]] if (c, t) in by else 0.0 for c in contenders]
        ax.bar(xs, ys, width, label=f"{t} ({HEADLINE[t].replace('_', ' ')})")
    ax.set_xticks(range(len(contenders)), contenders, rotation=20)
    ax.set_ylim(0, 1)
    ax.set_title("Video: each mixer on each shape of problem (test clips)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    return write_figure(fig, out / "video-suite.png")
