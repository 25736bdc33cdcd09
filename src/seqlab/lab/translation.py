"""``seqlab compare --suite translation``: the bottleneck experiment of Bahdanau et al. 2015, measured here.

Four encoder–decoders learn English → Spanish on the built-in Bible pairs at matched parameter counts and
matched training time:

* the RNN encoder–decoder without attention (Cho et al. 2014): the source reaches the decoder as one vector;
* RNNsearch (Bahdanau et al. 2015): additive attention over every source position at every step;
* Luong et al. 2015: global attention with the general score and input feeding;
* the Transformer (Vaswani et al. 2017), encoder–decoder, small.

The three RNN models share everything but the attention: a bidirectional GRU encoder, a GRU decoder, one
layer each; their width is chosen so that each has the Transformer's parameter count (within a few percent).
Each trains for the same wall-clock minutes on one thread (``threads``: more): a short calibration times its
steps first, then the number of steps that fits is trained with the full learning-rate schedule, at least
:data:`seqlab.lab.budget.MIN_STEPS` (the log says when a model trains more steps than the minutes asked for).
Test BLEU (sacrebleu, beam 5) is then reported overall and by source length in words (Bahdanau et al. 2015,
Figure 2).

Every run is an ordinary checkpoint directory (``DIR/runs/<name>``), so ``seqlab translate``, ``seqlab eval``
and ``seqlab viz alignment`` read it; a finished run is reused when the compare is run again.
"""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from seqlab.lab.budget import MIN_STEPS, check_budget, floored_steps
from seqlab.lab.records import write_output
from seqlab.lab.workers import (
    quiet_train_log,
    start_worker,
    stop_after_interrupt,
    stop_pool_on_interrupt,
    training,
    worker_run,
)
from seqlab.tasks.base import torch_threads

log = logging.getLogger("seqlab.lab")

BUCKETS = ((1, 10), (11, 20), (21, 30), (31, 40), (41, 50), (51, 200))
"""Source lengths in words (whitespace-separated), as on the x axis of Bahdanau et al.'s Figure 2."""

RNN = {"encoder": "gru", "cell": "gru", "n_encoder_layers": 1, "n_decoder_layers": 1, "dropout": 0.1}
CONTENDERS: dict[str, tuple[str, dict[str, Any]]] = {
    "no attention": ("seq2seq-gru", {**RNN, "attention": "none"}),
    "Bahdanau": ("seq2seq-gru-bahdanau", {**RNN, "attention": "bahdanau"}),
    "Luong": (
        "seq2seq-gru-luong",
        {**RNN, "attention": "luong", "score": "general", "input_feeding": True},
    ),
    "Transformer": ("transformer-small", {"d_model": 128, "n_heads": 4, "d_ff": 512}),
}
TASK = {"name": "translation", "source": "bible", "vocab_size": 2000, "max_len": 96, "batch_size": 64}
"""A shared byte-level BPE vocabulary of 2,000 tokens keeps the output layer, the largest cost at these widths,
small enough that every contender sees several epochs in a quarter of an hour on one CPU thread."""
LR = {"seq2seq": 2e-3, "transformer": 1e-3}


def slug(label: str) -> str:
    """A contender's folder name: lowercase words joined by hyphens ('Show, Attend and Tell' -> 'show-attend-and-tell')."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def match_width(preset: str, fields: dict[str, Any], target: int, vocab: int) -> int:
    """The d_model (a multiple of 8) whose parameter count is nearest ``target``."""
    from seqlab.models import count_parameters

    def size(d: int) -> int:
        return count_parameters(preset, **{**fields, "vocab_size": vocab, "d_model": d})

    return min(range(64, 1025, 8), key=lambda d: abs(size(d) - target))


def _run(
    label: str,
    fields: dict[str, Any],
    out: Path,
    minutes: float,
    seed: int,
    planner=None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Train one contender for ``minutes`` in this process (``threads`` torch threads, default one); its record.
    A run already in ``out`` continues (or, finished, is read back) with the settings it was started with.
    ``planner(label, fields, minutes, seed)`` gives a new run's dict (default: this suite's ``_planned``);
    other suites pass their own."""
    with worker_run(), quiet_train_log(), torch_threads(threads or 1):
        return _train_one(label, fields, out, minutes, seed, planner)


def _train_one(label: str, fields: dict[str, Any], out: Path, minutes: float, seed: int, planner):
    """:func:`_run`'s work: plan (or read back) the run, train it, its record."""
    from seqlab.run import build_run
    from seqlab.training import Trainer
    from seqlab.training.checkpoint import load_config, resumable_checkpoint
    from seqlab.training.interrupt import resume_hint

    where = out / "runs" / slug(label)
    started = (where / "latest").is_file()
    _same_settings(where, started, {"fields": fields, "minutes": minutes, "seed": seed})
    run = (
        load_config(resumable_checkpoint(where))["run"]
        if started
        else (planner or _planned)(label, fields, minutes, seed)
    )
    model, task, train = build_run(run)
    t0 = time.perf_counter()
    with training(), resume_hint("the same seqlab compare continues it (finished runs are reused)"):
        summary = Trainer(model, task, train, where, run).fit(resume=started)
    if summary.get("interrupted"):  # a stop signal: saved at a step boundary; the compare stops too
        stop_after_interrupt(summary)
    return {
        "label": label,
        "steps": train.steps,
        "seconds": time.perf_counter() - t0,
        "summary": summary,
        "threads": torch.get_num_threads(),
    }


def _same_settings(where: Path, started: bool, asked: dict[str, Any]) -> None:
    """A run folder records what its compare asked for (``lab-settings.json``: the contender's fields,
    ``--minutes``, ``--seed``); a started run asked for with other settings is an error, never a stale score
    under the new settings' name."""
    asked = json.loads(json.dumps(asked))  # as stored: tuples become lists
    marker = where / "lab-settings.json"
    if not started:
        where.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(asked), encoding="utf-8")
        return
    if marker.is_file() and (saved := json.loads(marker.read_text(encoding="utf-8"))) != asked:
        changed = ", ".join(
            f"{k} {saved.get(k)!r} -> {asked[k]!r}" for k in asked if saved.get(k) != asked[k]
        )
        raise ValueError(
            f"{where} holds a run started with other settings than this compare asks for ({changed}); "
            "delete it, or give another --out"
        )


def train_all(
    runs: dict[str, dict[str, Any]],
    out: Path,
    minutes: float,
    seed: int,
    jobs: int,
    planner=None,
    threads: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Each run's record from :func:`_run` (label -> the fields its planner reads), ``jobs`` spawned processes
    of ``threads`` torch threads (default one) at a time; every suite trains its runs through this. A stop
    signal stops the workers too, and this returns (raises) only once they have exited
    (:mod:`seqlab.lab.workers`)."""
    import multiprocessing as mp

    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=start_worker)
    with pool, stop_pool_on_interrupt(pool):
        futures = {
            label: pool.submit(_run, label, f, out, minutes, seed, planner, threads)
            for label, f in runs.items()
        }
        return {label: f.result() for label, f in futures.items()}


def _planned(label: str, fields: dict[str, Any], minutes: float, seed: int) -> dict[str, Any]:
    """The run dict of a contender, its steps those that a calibration says fit in ``minutes``."""
    from seqlab.run import build_run

    preset = CONTENDERS[label][0]
    run = {
        "model": {"name": preset, **fields},
        "task": {**TASK, "seed": seed},
        "train": {"steps": 30, "seed": seed},
    }
    model, task, _ = build_run(run)
    steps = floored_steps(label, minutes, _seconds_per_step(model, task))
    lr = LR["transformer" if preset.startswith("transformer") else "seq2seq"]
    run["train"] = timed_train(steps, seed, lr=lr, warmup_steps=min(400, steps // 10))
    return run


def timed_train(steps: int, seed: int, **settings) -> dict[str, Any]:
    """The train section of a suite's run given its calibrated steps: evaluated and saved once, at the end,
    on the CPU, without a progress bar, about 100 log lines; ``settings`` add the contender's own fields."""
    return {
        "steps": steps,
        **settings,
        "eval_every": 0,
        "save_every": steps,
        "log_every": max(1, steps // 100),
        "progress": False,
        "seed": seed,
        "device": "cpu",
    }


def _seconds_per_step(model, task, n: int = 8) -> float:
    """Seconds of an average training step (forward, backward, AdamW): the time per target token over ``n``
    batches spread across the epoch (lengths vary from batch to batch), times the epoch's mean tokens per batch.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    per = task.batches_per_epoch()
    seconds, tokens = 0.0, 0
    for i in range(n + 1):
        batch = task.get_batch("train", (i * per) // (n + 1))
        t0 = time.perf_counter()
        loss, _, _ = task.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:  # the first step warms up
            seconds += time.perf_counter() - t0
            tokens += task.tokens_in(batch)
    mean_tokens = sum(len(t) for t in task.data["train"][1]) / per
    return seconds / tokens * mean_tokens


def bucket_scores(task, model, beam_size: int = 5, limit: int | None = None) -> dict[str, Any]:
    """Test BLEU and chrF overall and per source-length bucket (words), with sacrebleu."""
    import sacrebleu

    pairs = task.pairs("test")[:limit]
    hyps = task.translate(model, [p.source for p in pairs], beam_size=beam_size)
    refs = [p.target for p in pairs]
    out: dict[str, Any] = {
        "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
        "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
        "sentences": len(pairs),
        "buckets": {},
    }
    for lo, hi in BUCKETS:
        rows = [i for i, p in enumerate(pairs) if lo <= len(p.source.split()) <= hi]
        if rows:
            bleu = sacrebleu.corpus_bleu([hyps[i] for i in rows], [[refs[i] for i in rows]]).score
            out["buckets"][f"{lo}-{hi}"] = {"bleu": bleu, "sentences": len(rows)}
    out["examples"] = [{"source": pairs[i].source, "reference": refs[i], "output": hyps[i]} for i in range(3)]
    return out


def plan(seed: int = 0) -> tuple[Any, dict[str, dict[str, Any]]]:
    """(the task, each contender's model fields): the RNN models' widths matched to the Transformer's count."""
    from seqlab.models import count_parameters
    from seqlab.run import build_task

    task = build_task({"task": {**TASK, "seed": seed}})
    vocab = task.source_vocab_size
    target = count_parameters("transformer-small", vocab_size=vocab, **CONTENDERS["Transformer"][1])
    fields = {}
    for label, (preset, base) in CONTENDERS.items():
        fields[label] = dict(base)
        if not preset.startswith("transformer"):
            fields[label]["d_model"] = match_width(preset, base, target, vocab)
    return task, fields


def compare_translation(
    out: str | Path,
    minutes: float = 8.0,
    jobs: int = 2,
    seed: int = 0,
    limit: int | None = None,
    threads: int | None = None,
) -> dict[str, Path]:
    """Train the four contenders (``jobs`` at a time, ``threads`` torch threads each, default one), score them,
    write the report."""

    from seqlab.models import count_parameters
    from seqlab.training.checkpoint import load_model, load_tokenizer_json, resolve_checkpoint

    check_budget(minutes, threads, len(CONTENDERS))
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    task, fields = plan(seed)
    print(
        f"translation suite: {len(CONTENDERS)} models x {minutes:g} min (at least {MIN_STEPS} steps each), "
        f"{jobs} at a time, {threads or 1} thread(s) each -> {out}",
        flush=True,
    )
    trained = train_all(
        {label: fields[label] for label in CONTENDERS}, out, minutes, seed, jobs, None, threads
    )
    records = []
    for label, (preset, _) in CONTENDERS.items():
        where = resolve_checkpoint(out / "runs" / slug(label))
        if load_tokenizer_json(where) != task.tokenizer.to_json():
            raise RuntimeError(f"{where} was trained with another tokenizer than the suite's task builds")
        model = load_model(where).eval()
        t0 = time.perf_counter()
        scores = bucket_scores(task, model, limit=limit)
        rec = {
            "label": label,
            "preset": preset,
            "fields": fields[label],
            "params": count_parameters(model),
            "steps": trained[label]["steps"],
            "train_minutes": trained[label]["summary"]["elapsed_s"] / 60,
            "threads": trained[label].get("threads", 1),
            "val_nll": trained[label]["summary"].get("val_nll"),
            "decode_seconds": time.perf_counter() - t0,
            **scores,
        }
        records.append(rec)
        print(
            f"{label}: test BLEU {rec['bleu']:.2f}, chrF {rec['chrf']:.1f} ({rec['params']:,} parameters)",
            flush=True,
        )
    write_output(out / "results.json", json.dumps(records, indent=1, ensure_ascii=False))
    return {
        "results": out / "results.json",
        "table": write_table(out, records, minutes),
        "plot": write_plot(out, records),
    }


def write_table(out: Path, records: list[dict[str, Any]], minutes: float) -> Path:
    from seqlab.lab.report import cpu_name

    buckets = [f"{lo}-{hi}" for lo, hi in BUCKETS]
    lines = [
        f"# The bottleneck experiment: English → Spanish (Bible), {minutes:g} min of training each, {cpu_name()}",
        "",
        "Each model's steps are what a calibration (its first steps, timed) predicted for the minutes asked; "
        "the minutes column is how long the training took (with --jobs 2, two runs shared the machine at a time).",
        "",
        f"torch {torch.__version__}, {threads_said(records)} per run, fp32. "
        f"`seqlab compare --suite translation --minutes {minutes:g}`."
        " Test BLEU and chrF by sacrebleu, beam 5; columns by source length in words.",
        "",
        "| model | d_model | parameters | steps | minutes | val nll | BLEU | chrF | "
        + " | ".join(f"BLEU {b}" for b in buckets)
        + " |",
        "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(buckets),
    ]
    for r in records:
        cells = [f"{r['buckets'][b]['bleu']:.1f}" if b in r["buckets"] else "–" for b in buckets]
        nll = f"{r['val_nll']:.3f}" if r.get("val_nll") is not None else "–"
        lines.append(
            f"| {r['label']} | {r['fields'].get('d_model', '–')} | {r['params']:,} | {r['steps']:,} | "
            f"{r['train_minutes']:.1f} | {nll} | {r['bleu']:.2f} | {r['chrf']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    counts = records[0]["buckets"] if records else {}
    lines += [
        "",
        "Test sentences per bucket: " + ", ".join(f"{b}: {v['sentences']}" for b, v in counts.items()),
        "",
    ]
    return write_output(out / "table.md", "\n".join(lines))


def threads_said(records: list[dict[str, Any]]) -> str:
    """The torch threads the runs trained with, as the table says it: 'one thread', '4 threads'."""
    n = sorted({r.get("threads", 1) for r in records}) or [1]
    return "one thread" if n == [1] else " or ".join(map(str, n)) + " threads"


def write_plot(out: Path, records: list[dict[str, Any]]) -> Path:
    from seqlab.lab.records import write_figure
    from seqlab.viz.figures import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in records:
        keys = list(r["buckets"])
        ax.plot(range(len(keys)), [r["buckets"][k]["bleu"] for k in keys], marker="o", label=r["label"])
    counts = records[0]["buckets"]
    ax.set_xticks(range(len(keys)), [f"{k.replace('-200', '+')}\n({counts[k]['sentences']})" for k in keys])
    ax.set_xlabel("source length in words (test sentences)")
    ax.set_ylabel("test BLEU (beam 5)")
    ax.set_title("BLEU against source length (cf. Bahdanau et al. 2015, Fig. 2)")
    ax.grid(alpha=0.3)
    ax.legend()
    return write_figure(fig, out / "bleu-by-length.png")
