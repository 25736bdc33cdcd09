"""Checkpoint directories: safetensors weights, JSON config, trainer state without pickle.

A run directory looks like::

    RUN/
      metrics.jsonl                 one JSON record per log/eval event
      latest                        name of the newest complete checkpoint, replaced atomically
      checkpoints/step-00001000/
        model.safetensors           the model's state_dict
        config.json                 {"family", "model", "task", "train", "run", "step"}
        tokenizer.json              when the task has a tokenizer
        trainer_state.safetensors   optimizer tensors, RNG states, carried recurrent state
        trainer_state.json          step, optimizer hyper-parameters, structure of the above

A checkpoint is written into a temporary directory, flushed to disk, and renamed into place; only then does
``latest`` move to it (``os.replace``, atomic on POSIX). A run killed at any moment leaves the previous
checkpoint complete and ``latest`` pointing at a complete one. Loading reads safetensors and JSON only, so a
checkpoint cannot execute code.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

STEP_PREFIX = "step-"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old or the new file, never half of one.

    The file gets the permissions a plain ``open(path, "w")`` would give it (0666 less the umask), not the
    0600 of the temporary file it is written through.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


# ---- flattening nested state into (tensors, JSON) -------------------------------------------------------------


def flatten(obj: Any, prefix: str, tensors: dict[str, Tensor]) -> Any:
    """Replace every tensor in a nested dict/list/tuple by a reference ``{"__tensor__": key}``."""
    if isinstance(obj, Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().contiguous().cpu()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__dict__": [[k, flatten(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, list | tuple):
        items = [flatten(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in trainer state")


def unflatten(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(unflatten(v, tensors) for v in obj["__tuple__"])
        return {k: unflatten(v, tensors) for k, v in obj["__dict__"]}
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    return obj


# ---- save / load ----------------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    config: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
    tokenizer_json: str | None = None,
    keep: int = 2,
) -> Path:
    """Write ``RUN/checkpoints/step-NNNNNNNN`` atomically, point ``latest`` at it, keep the newest ``keep``."""
    run_dir = Path(run_dir)
    ckpt_root = run_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"{STEP_PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=f".tmp-{name}-"))
    try:
        tmp.chmod(0o777 & ~_umask())  # a checkpoint directory like any other (mkdtemp makes it 0700)
        # tied parameters are stored once, under their first name; load_state_dict(strict=False) re-ties them
        state = {}
        seen: dict[int, str] = {}
        for k, v in model.state_dict().items():
            if v.data_ptr() in seen and v.numel() > 0:
                continue
            seen[v.data_ptr()] = k
            state[k] = v.detach().contiguous().cpu()
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps({**config, "step": step}, indent=2), encoding="utf-8")
        if tokenizer_json is not None:
            (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        if trainer_state is not None:
            tensors: dict[str, Tensor] = {}
            meta = flatten(trainer_state, "s", tensors)
            save_file(tensors, str(tmp / "trainer_state.safetensors"))
            (tmp / "trainer_state.json").write_text(json.dumps(meta), encoding="utf-8")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        final = ckpt_root / name
        if final.exists():  # re-saving the same step (e.g. after a resume): move the old one aside first
            old = ckpt_root / f".old-{name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(ckpt_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(run_dir / "latest", f"checkpoints/{name}\n")
    complete = sorted(p for p in ckpt_root.iterdir() if p.name.startswith(STEP_PREFIX))
    for old in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a run directory (its ``latest``) or a checkpoint directory itself."""
    path = Path(path)
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        return path
    latest = path / "latest"
    if latest.is_file():
        target = path / latest.read_text(encoding="utf-8").strip()
        if (target / "model.safetensors").is_file():
            return target
        raise FileNotFoundError(f"{latest} points at {target}, which is not a complete checkpoint")
    if not path.exists():
        raise FileNotFoundError(f"no such checkpoint or run directory: {path}")
    raise FileNotFoundError(
        f"{path} is neither a run directory (with a 'latest' file) nor a checkpoint "
        f"directory (with model.safetensors and config.json)"
    )


def load_config(ckpt: str | Path) -> dict[str, Any]:
    return json.loads((resolve_checkpoint(ckpt) / "config.json").read_text(encoding="utf-8"))


def load_model(ckpt: str | Path, device=None) -> torch.nn.Module:
    """Rebuild the model from ``config.json`` and load its safetensors weights."""
    from seqlab.models import build

    ckpt = resolve_checkpoint(ckpt)
    cfg = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    model = build(cfg["family"], cfg["model"], device=device)
    load_weights(model, ckpt / "model.safetensors")
    return model


def load_weights(model: torch.nn.Module, file: Path) -> None:
    state = load_file(str(file), device=str(next(model.parameters()).device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    really_missing = [k for k in missing if not _is_tied(model, k, state)]  # tied weights are stored once
    if really_missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit the model: missing {really_missing}, unexpected {unexpected}"
        )


def _is_tied(model: torch.nn.Module, key: str, stored: dict[str, Tensor]) -> bool:
    sd = model.state_dict()
    ptr = sd[key].data_ptr()
    return any(sd[k].data_ptr() == ptr for k in stored if k in sd and k != key)


def load_trainer_state(ckpt: str | Path) -> dict[str, Any] | None:
    ckpt = resolve_checkpoint(ckpt)
    meta_file = ckpt / "trainer_state.json"
    if not meta_file.is_file():
        return None
    tensors = load_file(str(ckpt / "trainer_state.safetensors"))
    return unflatten(json.loads(meta_file.read_text(encoding="utf-8")), tensors)


def load_tokenizer_json(ckpt: str | Path) -> str | None:
    f = resolve_checkpoint(ckpt) / "tokenizer.json"
    return f.read_text(encoding="utf-8") if f.is_file() else None


def load_tokenizer(ckpt: str | Path, needed_for: str):
    """The tokenizer (char, BPE or WordPiece) saved with a checkpoint of a model trained on text; a
    ValueError saying what it is ``needed_for`` when the checkpoint has none."""
    from seqlab.tasks.tokenizers import tokenizer_from_json

    text = load_tokenizer_json(ckpt)
    if text is None:
        raise ValueError(f"{resolve_checkpoint(ckpt)} has no tokenizer.json: {needed_for}")
    return tokenizer_from_json(text)
