"""Checkpoint directories: safetensors weights, JSON config, trainer state without pickle.

A run directory looks like::

    RUN/
      metrics.jsonl                 one JSON record per log/eval event
      latest                        "checkpoints/step-NNNNNNNN", the newest complete checkpoint
      checkpoints/manifest.json     the checkpoints seqlab wrote here, with a sha256 per file
      checkpoints/step-00001000/
        model.safetensors           the model's state_dict
        config.json                 {"family", "model", "task", "train", "run", "step"}
        tokenizer.json              when the task has a tokenizer
        trainer_state.safetensors   optimizer tensors, RNG states, carried recurrent state
        trainer_state.json          step, optimizer hyper-parameters, structure of the above

Guarantees (seqlab.training.manifest has the manifest's own):

- A checkpoint is written into a temporary directory and flushed to disk; the manifest then records its
  files' checksums, it is renamed into place, and only then does ``latest`` move to it (each step atomic on
  POSIX). A run killed at any moment leaves ``latest`` naming a complete checkpoint whose checksums verify.
- Pruning (``keep``) removes only checkpoints the manifest names: nothing a user put in the run directory,
  not even a ``checkpoints/step-*`` folder of their own, is ever deleted.
- ``latest`` can only name a checkpoint inside its run directory, ``checkpoints/step-NNNNNNNN``.
- Every loader verifies the files it reads against the manifest; a changed file is a
  :class:`~seqlab.training.manifest.CorruptCheckpointError` (a ValueError) naming it, never weights loaded silently.
- Loading reads safetensors and JSON only, so a checkpoint cannot execute code.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from seqlab.training.manifest import (
    MANIFEST,
    CorruptCheckpointError,
    damaged,
    digest_dir,
    fsync_dir,
    holds_run,
    no_checkpoint,
    read_manifest,
    umask,
    verify,
    write_manifest,
    write_text_atomic,
)
from seqlab.training.state_tree import flatten, save_tensors, unflatten

log = logging.getLogger("seqlab.train")

STEP_PREFIX = "step-"
STEP_DIR = re.compile(r"step-\d{8,}")
LATEST = re.compile(r"checkpoints/" + STEP_DIR.pattern)
MODEL_FILES = ("model.safetensors", "config.json")
TRAINER_FILES = ("trainer_state.safetensors", "trainer_state.json")


# ---- save / load ----------------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    config: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
    tokenizer_json: str | None = None,
    keep: int = 2,
    shards: Path | None = None,
) -> Path:
    """Write ``RUN/checkpoints/step-NNNNNNNN`` atomically, record it in the manifest, point ``latest`` at it,
    then keep the newest ``keep`` checkpoints the manifest names (:func:`prune`).

    A directory of that name that the manifest does not name is not seqlab's: a FileExistsError, and it is
    left as it is. ``model`` is a module or its state dict (FSDP's gathered weights); ``shards``, a directory of
    torch.distributed.checkpoint files (FSDP), is moved into the checkpoint and checksummed with it.
    """
    run_dir = Path(run_dir)
    ckpt_root = run_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"{STEP_PREFIX}{step:08d}"
    final = ckpt_root / name
    entries = read_manifest(ckpt_root)
    if (final.exists() or final.is_symlink()) and name not in entries:
        raise FileExistsError(
            f"{final} exists but {ckpt_root / MANIFEST} does not name it (seqlab did not write it): "
            f"move it away to save step {step} here"
        )
    tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=f".tmp-{name}-"))
    try:
        _write_files(tmp, step, model, config, trainer_state, tokenizer_json)
        if shards is not None:
            for f in sorted(shards.iterdir()):
                os.replace(f, tmp / f.name)
            shards.rmdir()
        entries[name] = {"step": step, "files": digest_dir(tmp)}
        _move_into_place(tmp, final, entries)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(run_dir / "latest", f"checkpoints/{name}\n")
    prune(ckpt_root, entries, name, keep)
    return final


def _write_files(tmp: Path, step: int, model, config, trainer_state, tokenizer_json) -> None:
    """A checkpoint's files, written into ``tmp`` and flushed to disk."""
    tmp.chmod(0o777 & ~umask())  # a checkpoint directory like any other (mkdtemp makes it 0700)
    # tied parameters are stored once, under their first name; load_state_dict(strict=False) re-ties them
    state = {}
    seen: dict[int, str] = {}
    for k, v in (model if isinstance(model, dict) else model.state_dict()).items():
        if v.data_ptr() in seen and v.numel() > 0:
            continue
        seen[v.data_ptr()] = k
        state[k] = v.detach().contiguous().cpu()
    save_tensors(state, tmp / "model.safetensors")
    (tmp / "config.json").write_text(json.dumps({**config, "step": step}, indent=2), encoding="utf-8")
    if tokenizer_json is not None:
        (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    if trainer_state is not None:
        tensors: dict[str, Tensor] = {}
        meta = flatten(trainer_state, "s", tensors)
        save_tensors(tensors, tmp / "trainer_state.safetensors")
        (tmp / "trainer_state.json").write_text(json.dumps(meta), encoding="utf-8")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    fsync_dir(tmp)


def _move_into_place(tmp: Path, final: Path, entries: dict[str, Any]) -> None:
    """Record ``entries`` (naming ``final`` with ``tmp``'s checksums), then rename ``tmp`` to ``final``.

    Re-saving a step (a run resumed from an earlier checkpoint) first moves the old directory aside, so the
    manifest never names files other than the ones its checksums describe: at worst (a kill between the two)
    it names a directory that is not there yet, which is never loaded and is forgotten by the next
    :func:`prune` (a manifest naming nothing that is there is no run: ``manifest.holds_run``). An error, or a
    second Ctrl-C, restores the old checkpoint and the manifest as they were.
    """
    old = final.parent / f".old-{final.name}"
    previous = read_manifest(final.parent)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    try:
        write_manifest(final.parent, entries)
        os.replace(tmp, final)
    except BaseException:  # an error or a second Ctrl-C, not a kill: the old checkpoint and its record back
        if not final.exists():
            if old.exists():
                os.replace(old, final)
            write_manifest(final.parent, previous)
        raise
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def prune(ckpt_root: Path, entries: dict[str, Any], saved: str, keep: int) -> None:
    """Keep ``saved`` and the ``keep - 1`` newest checkpoints before it that the manifest names; remove the
    other checkpoints it names (those after ``saved`` belong to a continuation a resume abandoned) and forget
    the ones already gone. ``keep=0`` removes none. A directory the manifest does not name is never touched.

    Each doomed directory is renamed to ``.old-step-*`` before the manifest forgets it, so a kill leaves
    only names that :func:`~seqlab.training.manifest.remove_leftovers` clears at the next start.
    """
    step = entries[saved]["step"]
    before = sorted((e["step"], n) for n, e in entries.items() if e["step"] < step)
    kept = {saved, *(n for _, n in before[max(0, len(before) - keep + 1) :])} if keep > 0 else set(entries)
    drop = [n for n in entries if n not in kept or not (ckpt_root / n).is_dir()]
    if not drop:
        return
    doomed = []
    for n in drop:
        if (ckpt_root / n).is_dir():
            doomed.append(ckpt_root / f".old-{n}")
            shutil.rmtree(doomed[-1], ignore_errors=True)
            os.replace(ckpt_root / n, doomed[-1])
    write_manifest(ckpt_root, {n: e for n, e in entries.items() if n not in drop})
    for d in doomed:
        shutil.rmtree(d, ignore_errors=True)


# ---- finding and verifying checkpoints ------------------------------------------------------------------------


def latest_target(run_dir: Path) -> Path:
    """The checkpoint directory ``run_dir/latest`` names; a ValueError unless it names one inside the run,
    ``checkpoints/step-NNNNNNNN`` (an absolute path or ``..`` is never followed)."""
    latest = Path(run_dir) / "latest"
    text = latest.read_text(encoding="utf-8", errors="replace").strip()
    if not LATEST.fullmatch(text):
        raise ValueError(
            f"{latest} holds {text[:200]!r}; it can only name a checkpoint inside its run directory, "
            f"'checkpoints/step-NNNNNNNN'"
        )
    return Path(run_dir) / text


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a run directory (its ``latest``) or a checkpoint directory itself."""
    path = Path(path)
    if all((path / f).is_file() for f in MODEL_FILES):
        return path
    if (path / "latest").is_file():
        target = latest_target(path)
        if (target / "model.safetensors").is_file():
            return target
        raise FileNotFoundError(f"{path / 'latest'} points at {target}, which is not a complete checkpoint")
    if not path.exists():
        raise no_checkpoint(path)
    raise FileNotFoundError(
        f"{path} is neither a run directory (with a 'latest' file) nor a checkpoint "
        f"directory (with model.safetensors and config.json)"
    )


def check_complete(ckpt_dir: Path) -> None:
    """CorruptCheckpointError unless ``ckpt_dir`` holds a model, its config and trainer state, each matching
    the manifest's checksums (when the manifest names the checkpoint)."""
    for name in MODEL_FILES + TRAINER_FILES:
        if not (ckpt_dir / name).is_file():
            raise CorruptCheckpointError(f"{ckpt_dir / name} is missing")
    verify(ckpt_dir)


def resumable_checkpoint(path: str | Path) -> Path:
    """The checkpoint a resume starts from: complete (model, config, trainer state) and verified.

    ``path`` is a checkpoint directory (taken as it is) or a run directory: the checkpoint ``latest`` names,
    or, when that one is incomplete or fails its checksums, the newest checkpoint the manifest names that
    passes (a warning names both). A CorruptCheckpointError when none does.
    """
    path = Path(path)
    if all((path / f).is_file() for f in MODEL_FILES) or not holds_run(path):
        target = resolve_checkpoint(path)
        check_complete(target)
        return target
    if (path / "latest").is_file():
        target = latest_target(path)
        try:
            check_complete(target)
            return target
        except CorruptCheckpointError as e:
            problem = e
    else:  # checkpoints without 'latest' (deleted, or a copy without it): the newest that verifies
        target, problem = path / "latest", f"{path / 'latest'} is missing"
    for candidate in _newest_first(path / "checkpoints", exclude=target.name):
        try:
            check_complete(candidate)
        except CorruptCheckpointError:
            continue
        log.warning(
            "cannot resume from %s (%s); resuming from %s, the newest complete checkpoint whose checksums "
            "verify",
            target,
            problem,
            candidate,
        )
        return candidate
    raise CorruptCheckpointError(f"no checkpoint in {path} is complete and verified; {problem}")


def _newest_first(ckpt_root: Path, exclude: str) -> list[Path]:
    """The checkpoints the manifest names, newest first; a run written before manifests: its step dirs."""
    names = [
        n for _, n in sorted(((e["step"], n) for n, e in read_manifest(ckpt_root).items()), reverse=True)
    ]
    if not names and ckpt_root.is_dir():
        names = sorted((p.name for p in ckpt_root.iterdir() if STEP_DIR.fullmatch(p.name)), reverse=True)
    return [ckpt_root / n for n in names if n != exclude]


# ---- loading ------------------------------------------------------------------------------------------------


def load_config(ckpt: str | Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint (or of a run's latest), verified against the manifest."""
    where = resolve_checkpoint(ckpt)
    verify(where, ("config.json",))
    return _read_config(where / "config.json")


def _read_config(file: Path) -> dict[str, Any]:
    """config.json as a dict with the 'family' and 'model' that rebuild the model; a clear error otherwise."""
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, FileNotFoundError) as e:
        raise damaged(file, f"is not valid JSON ({e})") from e
    if (
        not isinstance(cfg, dict)
        or not isinstance(cfg.get("family"), str)
        or not isinstance(cfg.get("model"), dict)
    ):
        raise ValueError(
            f"{file} must be a JSON object with 'family' (a string) and 'model' (an object), as seqlab writes it; "
            f"got {type(cfg).__name__} with keys {sorted(cfg) if isinstance(cfg, dict) else []}"
        )
    return cfg


def _load_tensors(file: Path, device: str | None = None) -> dict[str, Tensor]:
    try:
        return load_file(str(file), device=device or "cpu")
    except (OSError, SafetensorError) as e:
        raise damaged(file, f"cannot be read as safetensors ({e})") from e


def load_model(ckpt: str | Path, device=None) -> torch.nn.Module:
    """Rebuild the model from ``config.json`` and load its safetensors weights.

    Both files are verified against the run's manifest first: a file changed since seqlab wrote it raises
    CorruptCheckpointError, a ValueError naming it.
    """
    from seqlab.models import build

    ckpt = resolve_checkpoint(ckpt)
    verify(ckpt, MODEL_FILES)
    cfg = _read_config(ckpt / "config.json")
    model = build(cfg["family"], cfg["model"], device=device)
    load_weights(model, ckpt / "model.safetensors")
    return model


def load_weights(model: torch.nn.Module, file: Path) -> None:
    """``file``'s tensors into ``model``; a ValueError naming the first few names that do not fit (the weights
    and the config.json beside them describe different models), never torch's size-mismatch traceback."""
    state = _load_tensors(file, str(next(model.parameters()).device))
    own, misfit = model.state_dict(), f"the weights in {file} do not fit the model its config.json describes"
    wrong = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    shapes = [f"{k} {tuple(state[k].shape)}, the model's {tuple(own[k].shape)}" for k in wrong]
    if shapes:
        raise ValueError(f"{misfit}: {len(shapes)} tensor(s) of another shape, e.g. {'; '.join(shapes[:3])}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    really_missing = [k for k in missing if not _is_tied(model, k, state)]  # tied weights are stored once
    if really_missing or unexpected:
        raise ValueError(f"{misfit}: {_counted(really_missing)} missing, {_counted(unexpected)} unexpected")


def _counted(names: list[str]) -> str:  # a count and the first five names, not a page of them
    return f"{len(names)}" + (f" ({', '.join(names[:5])}{', ...' * (len(names) > 5)})" if names else "")


def _is_tied(model: torch.nn.Module, key: str, stored: dict[str, Tensor]) -> bool:
    sd = model.state_dict()
    ptr = sd[key].data_ptr()
    return any(sd[k].data_ptr() == ptr for k in stored if k in sd and k != key)


def load_trainer_state(ckpt: str | Path, verified: bool = False) -> dict[str, Any] | None:
    """The trainer state saved with a checkpoint (None when it has none), its files verified against the
    manifest unless the caller has ``verified`` them already (:func:`resumable_checkpoint`)."""
    ckpt = resolve_checkpoint(ckpt)
    meta_file = ckpt / "trainer_state.json"
    if not meta_file.is_file():
        return None
    if not verified:
        verify(ckpt, TRAINER_FILES)
    tensors = _load_tensors(ckpt / "trainer_state.safetensors")
    return unflatten(json.loads(meta_file.read_text(encoding="utf-8")), tensors)


def load_tokenizer_json(ckpt: str | Path) -> str | None:
    """``tokenizer.json`` of a checkpoint, verified against the manifest; None when it was saved without one (one
    the manifest records but that is gone is a CorruptCheckpointError, not a model that never had text)."""
    f = resolve_checkpoint(ckpt) / "tokenizer.json"
    verify(f.parent, ("tokenizer.json",))
    if not f.is_file():
        return None
    return f.read_text(encoding="utf-8")


def load_tokenizer(ckpt: str | Path, needed_for: str, model: torch.nn.Module | None = None):
    """The tokenizer (char, BPE or WordPiece) saved with a checkpoint of a model trained on text; a
    ValueError saying what it is ``needed_for`` when the checkpoint has none, or when it cannot name every
    token ``model`` may produce."""
    from seqlab.tasks.tokenizers import tokenizer_from_json

    text = load_tokenizer_json(ckpt)
    if text is None:
        raise ValueError(f"{resolve_checkpoint(ckpt)} has no tokenizer.json: {needed_for}")
    tok = tokenizer_from_json(text)
    vocab = getattr(getattr(model, "config", None), "vocab_size", 0)
    if tok.vocab_size < vocab:  # a replaced tokenizer.json could not decode every token the model samples
        raise ValueError(
            f"{resolve_checkpoint(ckpt)}: the tokenizer has {tok.vocab_size} tokens, the model {vocab}"
        )
    return tok
