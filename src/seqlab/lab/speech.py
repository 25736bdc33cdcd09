"""``seqlab compare --suite speech``: which token mixer hears best? Measured on the espeak-ng corpus
(``seqlab.tasks.speech_corpus``), on voices never heard in training, or (from Python, ``compare_speech(data=
{"source": "folder", "path": ...})``) on a user's folder, without the suite's corpus sizes.

Every registered token mixer runs in two layers over the frames of the same front end (two convolutions over
40 log-mel bands, the first with stride 3: 33 output frames a second, ``seqlab.models.speech``), causal (output
τ hears no frame after τ beyond the front end's look-ahead of 80 ms), at matched parameter counts (each mixer's
d_model chosen so that the whole model has the LSTM contender's count, within a few percent) and the same
steps, batches and learning rate. Two tasks:

* keywords — many to one: which of 20 words (ten digits, ten commands) an utterance is; accuracy;
* digits — many to many without alignment: the transcript of 2-5 spoken digits, as characters, by CTC;
  character and word error rates (jiwer) of greedy decoding and of prefix beam search.

Every run is an ordinary checkpoint directory (``DIR/runs/<task>-<mixer>``), so ``seqlab eval``,
``seqlab transcribe`` and ``seqlab viz speech`` read it; a finished run is reused when the compare is run again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from seqlab.lab.budget import width_multiple, width_range
from seqlab.lab.records import write_output
from seqlab.lab.translation import slug, timed_train, train_all

log = logging.getLogger("seqlab.lab")

TASKS: dict[str, dict[str, Any]] = {
    "keywords": {"name": "keywords"},
    "digits": {"name": "speech_ctc", "units": "chars"},
}
OUTPUTS = {"keywords": 20, "digits": 29}
"""The heads' widths (20 words; the blank and 28 characters), for matching parameter counts."""
STEPS = {"keywords": 1200, "digits": 1500}
TASK = {"n_train": 3000, "n_eval": 500, "batch_size": 32}
FRONT = {"frontend": "conv", "subsample": 3, "kernel_size": 5, "d_frontend": 64, "n_layers": 2}
REFERENCE = ("lstm", 64)
"""The contender, and its d_model, whose parameter count the others match."""
LR = 2e-3


def _size(contender: str, d_model: int, task: str) -> int:
    from seqlab.models import count_parameters

    head = "classify" if task == "keywords" else "ctc"
    fields = {**FRONT, "mixer": contender, "d_model": d_model}
    return count_parameters("speech-lstm", **fields, head=head, n_outputs=OUTPUTS[task])


def _match(contender: str, task: str, target: int) -> int:
    """The d_model (a multiple of the mixer's registered width step, in 16..256) whose model has the parameter
    count nearest ``target``: a bisection, the count growing with d_model."""
    widths = list(width_range(width_multiple(contender)))
    lo, hi = 0, len(widths) - 1
    while lo < hi:  # the first width whose count reaches the target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if _size(contender, widths[mid], task) < target else (lo, mid)
    near = widths[max(0, lo - 1) : lo + 1]
    return min(near, key=lambda d: abs(_size(contender, d, task) - target))


def plan(
    mixers: list[str] | None = None, tasks: list[str] | None = None, steps: dict[str, int] | None = None
) -> dict[str, dict[str, Any]]:
    """Each run's name -> {task, contender, model fields, steps}: every mixer (or those named) on every task,
    d_model matched per task to the reference's parameter count."""
    from seqlab.layers import list_mixers

    mixers, tasks = list(mixers or list_mixers()), list(tasks or TASKS)
    for names, pool, what in ((mixers, list_mixers(), "mixer"), (tasks, list(TASKS), "task")):
        unknown = sorted(set(names) - set(pool))
        if unknown:
            raise ValueError(f"unknown speech suite {what}(s) {unknown}; known: {', '.join(pool)}")
    runs = {}
    for task in tasks:
        target = _size(*REFERENCE, task)
        for contender in mixers:
            d = _match(contender, task, target)
            runs[f"{task} {contender}"] = {
                "task": task,
                "contender": contender,
                "model": {**FRONT, "mixer": contender, "d_model": d},
                "steps": {**STEPS, **(steps or {})}[task],
            }
    return runs


def _suite_data(data: dict[str, Any]) -> dict[str, Any]:
    """The corpus settings of every run: the suite's (``TASK``) that apply to ``data``'s source (a folder's
    own recordings are its data: the task refuses corpus sizes there), then ``data``'s own."""
    from seqlab.tasks.speech_settings import GENERATED_ONLY

    generated = data.get("source", "generated") == "generated"
    return {**{k: v for k, v in TASK.items() if generated or k not in GENERATED_ONLY}, **data}


def _task_fields(task: str, data: dict[str, Any], seed: int) -> dict[str, Any]:
    return {**_suite_data(data), **TASKS[task], "seed": seed}


def _planned(label: str, fields: dict[str, Any], minutes: float, seed: int) -> dict[str, Any]:
    """A run's dict: its fixed steps (``minutes`` is unused: this suite matches steps, not time)."""
    steps = fields["steps"]
    return {
        "model": {"name": "speech-lstm", **fields["model"]},
        "task": _task_fields(fields["task"], fields.get("data", {}), seed),
        "train": timed_train(
            steps, seed, lr=LR, warmup_steps=steps // 10, weight_decay=0.01, grad_clip=1.0, eval_batches=8
        ),
    }


def compare_speech(
    out: str | Path,
    mixers: list[str] | None = None,
    tasks: list[str] | None = None,
    jobs: int = 2,
    seed: int = 0,
    steps: dict[str, int] | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train every (task, mixer) run (``jobs`` at a time, one thread each), score it on the test voices, write
    the report. ``steps`` overrides STEPS per task and ``data`` the corpus settings (``n_train``, ``n_eval``,
    ``batch_size``, ``cache_dir``: a smaller suite), or names a folder (``source='folder'``, ``path``: then
    ``TASK``'s corpus sizes are left out). The corpora are built (the folders read) first, here, once."""

    from seqlab.run import build_task

    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    runs = {k: {**v, "data": dict(data or {})} for k, v in plan(mixers, tasks, steps).items()}
    t0 = time.perf_counter()
    built = {
        t: build_task({"task": _task_fields(t, dict(data or {}), seed)})
        for t in dict.fromkeys(r["task"] for r in runs.values())
    }
    log.info("speech suite: %d runs, %d at a time -> %s", len(runs), jobs, out)
    trained = train_all(runs, out, 0.0, seed, jobs, _planned)
    records = _score_all(runs, trained, out, built)
    minutes = (time.perf_counter() - t0) / 60
    write_output(out / "results.json", json.dumps(records, indent=1))
    return {
        "results": out / "results.json",
        "table": write_table(out, records, minutes),
        "plot": write_plot(out, records),
        "minutes": minutes,
    }


def _score_all(runs, trained, out: Path, tasks: dict) -> list[dict[str, Any]]:
    """Each run's record with its metrics on the whole test split (the held-out voices)."""
    from seqlab.models import count_parameters
    from seqlab.training.checkpoint import load_model, resolve_checkpoint

    records = []
    for label, spec in runs.items():
        task = tasks[spec["task"]]
        model = load_model(resolve_checkpoint(out / "runs" / slug(label))).eval()
        summary, steps = trained[label]["summary"], trained[label]["steps"]
        test = task.evaluate(model, max_batches=10_000, split="test")
        records.append(
            {
                "label": label,
                "task": spec["task"],
                "contender": spec["contender"],
                "d_model": spec["model"]["d_model"],
                "params": count_parameters(model),
                "steps": steps,
                "data": _suite_data(spec["data"]),
                "n_train": task.n_utterances["train"],
                "n_test": task.n_utterances["test"],
                "ms_per_step": 1000 * summary["elapsed_s"] / max(1, steps),
                "test": {k.removeprefix("test_"): v for k, v in test.items()},
            }
        )
        log.info("%s: %s", label, _headline(records[-1]))
    return records


HEADLINE = {"keywords": "acc", "digits": "beam_cer"}


def _headline(record: dict[str, Any]) -> str:
    metric = HEADLINE[record["task"]]
    return f"{metric} {record['test'][metric]:.3f}"


COLUMNS = {
    "keywords": [("keyword acc", "acc")],
    "digits": [("CER greedy", "cer"), ("CER beam", "beam_cer"), ("WER beam", "beam_wer"), ("exact", "exact")],
}


def _data_said(records: list[dict[str, Any]], tasks: list[str]) -> str:
    """The table's words on the data: the training utterances, the learning rate, the test utterances and
    whom they were spoken by (the corpus's held-out voices, or a folder's held-out speakers)."""
    n_train = {r["task"]: r["n_train"] for r in records}
    n_test = {r["task"]: r["n_test"] for r in records}
    if len(set(n_train.values())) == 1:
        trained_on = f"{records[0]['n_train']} training utterances per task"
    else:
        trained_on = f"training utterances {', '.join(f'{t} {n_train[t]}' for t in tasks)}"
    data = records[0]["data"]
    if data.get("source", "generated") == "generated":
        held_out = "spoken by espeak-ng voice variants never heard in training"
    else:
        held_out = f"from {data.get('path')}, by speakers (or files) held out of training"
    tested = ", ".join(f"{t} {n_test[t]}" for t in tasks)
    return f"{trained_on}, AdamW lr {LR}. Scores on the test split ({tested} utterances), {held_out}"


def write_table(out: Path, records: list[dict[str, Any]], minutes: float) -> Path:
    from seqlab.lab.report import cpu_name
    from seqlab.layers import mixer_spec

    by = {(r["contender"], r["task"]): r for r in records}
    contenders = list(dict.fromkeys(r["contender"] for r in records))
    tasks = [t for t in TASKS if any(r["task"] == t for r in records)]
    heads = [h for t in tasks for h, _ in COLUMNS[t]]
    steps, data = {r["task"]: r["steps"] for r in records}, records[0]["data"]
    lines = [
        f"# Speech: every token mixer on spoken keywords and digit strings, {cpu_name()}",
        "",
        f"torch {torch.__version__}, fp32, one thread per run, {len(records)} runs in {minutes:.1f} min. "
        f"`seqlab compare --suite speech`. Steps {', '.join(f'{t} {steps[t]}' for t in tasks)}; batch "
        f"{data['batch_size']} utterances, {_data_said(records, tasks)}. CER/WER: jiwer; beam: prefix beam "
        "search, width 8. "
        "Parameters: the keyword model's (the CTC head differs a little). ms/step: training time per step, "
        "with the other run of the pair on the second core.",
        "",
        f"| model | family | parameters | d_model | {' | '.join(heads)} | ms/step |",
        f"|---|---|---:|---:|{'---:|' * len(heads)}---:|",
    ]
    for c in contenders:
        first = next(by[(c, t)] for t in tasks if (c, t) in by)
        cells = []
        for t in tasks:
            r = by.get((c, t))
            for _, key in COLUMNS[t]:
                v = None if r is None else r["test"].get(key)
                cells.append("–" if v is None else f"{v:.3f}")
        speed = " / ".join(f"{by[(c, t)]['ms_per_step']:.0f}" for t in tasks if (c, t) in by)
        family = mixer_spec(c).family
        lines.append(
            f"| {c} | {family} | {first['params']:,} | {first['d_model']} | {' | '.join(cells)} | {speed} |"
        )
    return write_output(out / "table.md", "\n".join(lines) + "\n")


def write_plot(out: Path, records: list[dict[str, Any]]) -> Path:
    from seqlab.lab.records import write_figure
    from seqlab.viz.figures import pyplot

    plt = pyplot()
    contenders = list(dict.fromkeys(r["contender"] for r in records))
    by = {(r["contender"], r["task"]): r for r in records}
    series = [("keywords", "acc", "keyword accuracy"), ("digits", "beam_cer", "digit-string CER (beam)")]
    series = [s for s in series if any(r["task"] == s[0] for r in records)]
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(contenders) + 2), 3.8))
    width = 0.8 / len(series)
    for k, (task, key, name) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(contenders))]
        ys = [by[(c, task)]["test"][key] if (c, task) in by else 0.0 for c in contenders]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks(range(len(contenders)), contenders, rotation=20)
    ax.set_ylim(0, 1)
    ax.axhline(0.95, color="tab:blue", ls=":", lw=0.8)
    ax.axhline(0.10, color="tab:orange", ls=":", lw=0.8)
    ax.set_title("Speech: each mixer on held-out voices (targets: accuracy ≥ 0.95, CER ≤ 0.10)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return write_figure(fig, out / "speech-suite.png")
