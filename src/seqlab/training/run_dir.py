"""A run directory as training and evaluation open it: locked, never mixed with another run, an earlier run's files
set aside, checkpoints never saved over a user's directories, and a rebuilt task checked against the data the
checkpoint was trained on."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from seqlab.training import checkpoint as ckpt
from seqlab.training import manifest as run_files

log = logging.getLogger("seqlab.train")

__all__ = [
    "check_disk_room",
    "check_same_data",
    "check_same_description",
    "check_save_steps",
    "check_saves",
    "open_run_dir",
    "saved_run",
]


def open_run_dir(out_dir: Path, resume: bool | str | Path) -> int:
    """Lock ``out_dir`` for this process (the lock's descriptor is returned, for ``manifest.unlock_run``), refuse
    to mix another run into one that holds a run, clear an interrupted save's leftovers, and on a fresh start set
    an earlier run's metrics and TensorBoard events aside.

    ``resume``: False for a fresh start, True to continue this directory's run, or a checkpoint (or run
    directory) to continue from: inside ``out_dir``, or anywhere when ``out_dir`` holds no run yet (a run
    continued into a new directory)."""
    (out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    lock = run_files.lock_run(out_dir)  # before anything here is moved or removed
    try:
        _refuse_mixing(out_dir, resume)
        run_files.remove_leftovers(out_dir)
        if not resume:  # never append to an earlier run's metrics, nor mix its events into this run's
            run_files.set_aside(out_dir / "metrics.jsonl")
            run_files.set_aside(out_dir / "tb")
        _check_writable(out_dir)
    except BaseException:
        run_files.unlock_run(lock)
        raise
    return lock


def _check_writable(out_dir: Path) -> None:
    """Before step 1: a checkpoint can be made in checkpoints/ and metrics.jsonl appended to (an immutable or
    read-only folder, or a folder named metrics.jsonl, was found by the first save, after the work)."""
    metrics = out_dir / "metrics.jsonl"
    existed = metrics.exists()
    try:
        os.rmdir(tempfile.mkdtemp(dir=out_dir / "checkpoints", prefix=".tmp-probe-"))
        with open(metrics, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise OSError(f"cannot write the run in {out_dir} ({e}); nothing was trained") from None
    if not existed:
        metrics.unlink(missing_ok=True)


def _refuse_mixing(out_dir: Path, resume: bool | str | Path) -> None:
    if not ckpt.holds_run(out_dir):  # its manifest would list, and prune, both runs
        return
    if not resume:
        raise ValueError(
            f"{out_dir} already holds a run's checkpoints; resume it (fit(resume=True), or --resume) "
            "or train into another directory (nothing is overwritten)"
        )
    if resume is not True and not Path(resume).resolve().is_relative_to(out_dir.resolve()):
        raise ValueError(
            f"{out_dir} already holds a run's checkpoints, and {resume} belongs to another run: continuing it "
            "here would prune this run's later checkpoints and metrics; resume it into a new directory "
            "(nothing is overwritten)"
        )


def save_steps(first: int, steps: int, save_every: int) -> set[int]:
    """The steps after ``first`` at which a run of ``steps`` saves: every ``save_every``-th (0: none) and the last."""
    return {s for s in range(first + 1, steps + 1) if (save_every and s % save_every == 0) or s == steps}


def check_save_steps(out_dir: Path, first: int, steps: int, save_every: int) -> None:
    """Before training from step ``first``: a ValueError when a directory seqlab did not write (the manifest does
    not name it) sits where this run will save a checkpoint, found now rather than by the save after the work.
    Other directories of the user's in checkpoints/ stay as they are."""
    ckpt_root = out_dir / "checkpoints"
    named = run_files.read_manifest(ckpt_root)
    saves = save_steps(first, steps, save_every)
    strays = sorted(
        p.name
        for p in ckpt_root.glob(f"{ckpt.STEP_PREFIX}*")
        if p.name not in named
        and p.name.removeprefix(ckpt.STEP_PREFIX).isdigit()
        and int(p.name.removeprefix(ckpt.STEP_PREFIX)) in saves
    )
    if strays:
        raise ValueError(
            f"{ckpt_root} holds {', '.join(strays[:3])}, which seqlab did not write (its manifest does not name "
            "it), where this run will save a checkpoint; move it out of checkpoints/ first (nothing is overwritten)"
        )


def checkpoint_bytes(model) -> int:
    """About what one checkpoint of ``model`` takes on disk: its state (each tensor once, tied weights too) and
    AdamW's two moments of every trained parameter, plus 1 MiB for the configs, trainer state and tokenizer."""
    state = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return state + moments + 2**20


def check_saves(out_dir: Path, first: int, config, model) -> None:
    """Before training from step ``first`` with ``config`` (a TrainConfig): :func:`check_save_steps` and
    :func:`check_disk_room`."""
    check_save_steps(out_dir, first, config.steps, config.save_every)
    check_disk_room(out_dir, first, config.steps, config.save_every, config.keep_checkpoints, model)


def check_disk_room(out_dir: Path, first: int, steps: int, save_every: int, keep: int, model) -> None:
    """Before training from step ``first``: a ValueError when the run's disk has no room for one checkpoint (the
    first save would fail after the work), a warning when it has too little for the checkpoints the run will keep
    (a later save fails then; the previous checkpoint stays)."""
    saves = len(save_steps(first, steps, save_every))
    if not saves:
        return
    one = checkpoint_bytes(model)
    present = sum(1 for p in (out_dir / "checkpoints").glob(f"{ckpt.STEP_PREFIX}*") if p.is_dir())
    peak = (
        saves if not keep else min(saves, max(keep + 1 - present, 1))
    )  # written before the oldest is pruned
    free = shutil.disk_usage(out_dir).free
    if free < one:
        raise ValueError(
            f"{out_dir}'s disk has {_size(free)} free; one checkpoint of this model (weights and AdamW's two "
            f"moments) takes about {_size(one)}: free some space or train into another disk (nothing was trained)"
        )
    if free < peak * one:
        log.warning(
            "%s's disk has %s free; the %d checkpoint(s) this run will hold at once take about %s: a later save "
            "will fail (the one before it stays); free space, or lower train.keep_checkpoints",
            out_dir,
            _size(free),
            peak,
            _size(peak * one),
        )


def _size(n: int) -> str:
    """Bytes for a message: '3.2 MiB', '1.50 GiB'."""
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_same_data(task, where: str | Path) -> None:
    """A task rebuilt from its settings (``eval``, ``--resume``) must have the vocabulary the checkpoint was
    trained with and the sizes (``DATA_COUNTS``) its description saved: a ValueError when its tokenizer or a count
    differs, as when the text or corpus file was changed or replaced since (the ids would mean other tokens, and
    the scores other data)."""
    tok = getattr(task, "tokenizer", None)
    saved = ckpt.load_tokenizer_json(where)
    source = next((s for s in (getattr(task, k, None) for k in ("path", "data_dir", "source")) if s), None)
    data = f"its data{f' ({source})' if isinstance(source, str) else ''}"
    if saved is not None and tok is not None and hasattr(tok, "to_json") and tok.to_json() != saved:
        raise ValueError(
            f"the task rebuilt for {ckpt.resolve_checkpoint(where)} has another vocabulary than the one it was "
            f"trained with: {data} changed since the run was trained; restore that data, or train a new run on it"
        )
    # a text edited within its old characters keeps the vocabulary: its counts tell
    described = ckpt.load_config(where).get("task") or {}
    now = task.describe()
    _check_same_values(now, described, DATA_COUNTS, data)
    # a renamed class folder keeps every count but swaps the labels' ids; a rescaled series keeps its length
    _check_same_names(now, described, data)
    if "n_points" in described:
        _check_same_statistics(now, described, data)


DATA_COUNTS = ("train_chars", "val_chars", "n_train", "n_images", "n_clips", "n_utterances", "n_points")
"""Integer sizes in a task's description (``derived``): the same data gives the same counts on any machine."""
DATA_NAMES = ("classes", "class_names", "vocabulary")
"""The names a task's output ids stand for, in id order: the same data gives the same names."""


def _check_same_names(now: dict[str, Any], saved: dict[str, Any], data: str) -> None:
    """The class names or vocabulary the rebuilt task describes (``now``) are the saved ones, in the same order:
    a ValueError saying which names came and went (or that the order changed) otherwise."""
    for key in DATA_NAMES:
        if key not in saved or saved[key] is None:
            continue
        mine = json.loads(json.dumps(now.get(key)))  # as stored: lists, not tuples
        if mine == saved[key]:
            continue
        if isinstance(mine, list) and isinstance(saved[key], list):
            added = [x for x in mine if x not in saved[key]]
            gone = [x for x in saved[key] if x not in mine]
            change = f"new {added}, missing {gone}" if added or gone else "the same names in another order"
        else:
            change = f"now {mine!r}"
        raise ValueError(
            f"{data} changed since the checkpoint was trained on it: its {key} are {change} (the checkpoint's "
            f"{key}: {saved[key]!r}), so the ids would mean other classes; restore the data, or train a new run"
        )


def _check_same_statistics(now: dict[str, Any], saved: dict[str, Any], data: str) -> None:
    """A series' training-span mean and std (``now``) match the saved ones to 1e-6 relative (the summation
    order of another machine may differ in the last digits): a ValueError naming both otherwise."""
    for key in ("mean", "std"):
        if key not in saved:
            continue
        mine, theirs = now.get(key), saved[key]
        close = (
            isinstance(mine, list)
            and isinstance(theirs, list)
            and len(mine) == len(theirs)
            and all(abs(a - b) <= 1e-6 * max(abs(a), abs(b)) for a, b in zip(mine, theirs, strict=True))
        )
        if not close:
            raise ValueError(
                f"{data} changed since the checkpoint was trained on it: the training span's {key} is now "
                f"{mine!r}, the checkpoint's {theirs!r}; restore the data, or train a new run on it"
            )


def check_same_description(task, saved: dict[str, Any], keys: tuple[str, ...], what: str) -> None:
    """A task rebuilt from its settings for a checkpoint (``viz video``, ``forecast``) must describe the data the
    checkpoint was trained on: a ValueError naming the first of ``keys`` (class names, statistics, lengths) whose
    value in ``task.describe()`` differs from ``saved`` (the checkpoint's task description), as when the data
    (``what``) was edited since."""
    _check_same_values(task.describe(), saved, keys, what)


def _check_same_values(now: dict[str, Any], saved: dict[str, Any], keys: tuple[str, ...], what: str) -> None:
    """:func:`check_same_description` on a description already made (``now``)."""
    for key in keys:
        if (
            key in saved and json.loads(json.dumps(now.get(key))) != saved[key]
        ):  # as stored: lists, not tuples
            raise ValueError(
                f"{what} changed since the checkpoint was trained on it: {key} is now {now.get(key)!r}, the "
                f"checkpoint's {saved[key]!r}; restore it, or train a new run on it"
            )


def saved_run(where: Path, sections: tuple[str, ...], instead: str) -> dict[str, Any]:
    """The run settings saved with the checkpoint ``where``, which must hold ``sections`` for the command line to
    rebuild its model, task or training; a ValueError saying ``instead`` (what to do from Python) for one saved
    without them (by the Python ``Trainer`` without ``run_config``)."""
    run = ckpt.load_config(where).get("run") or {}
    if not all(isinstance(run.get(s), dict) and run[s] for s in sections):
        raise ValueError(
            f"{where} was saved without its run settings (by seqlab.training.Trainer without run_config), so the "
            f"command line cannot rebuild its {' and '.join(sections)}; {instead}"
        )
    return run
