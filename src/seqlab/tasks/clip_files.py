r"""The user's own clips from a folder, as ``seqlab.tasks.clips.Clips``.

Layout:

    FOLDER/labels.csv    a header row, then one row per clip: column ``clip`` (required), and any of
                         ``action`` (a name), ``caption`` (text) and ``events`` (per-frame names from
                         ``EVENTS``, separated by spaces); other columns are ignored
    FOLDER/NAME.npy      the frames of clip NAME: (t, h, w) or (t, h, w, c) with c 1 or 3; uint8, or float
                         in [0, 1] (scaled by 255 and rounded)
    FOLDER/NAME/         or a folder of frame images (.png, .jpg, ...), in natural filename order (numbers
                         compared as numbers: frame2 before frame10, as ffmpeg's ``%d`` names them), read
                         with ``seqlab.tasks.image_files`` (transparency composited on white)

Notation: ``n`` clips, ``t`` frames per clip, ``c`` channels, ``s`` frame side.

Labels: action names are the sorted distinct non-empty values of the ``action`` column
(``Clips.action_names``); a blank action, a blank events cell or a missing column gives -1, a blank or
missing caption "". Sizes: every clip must have the same number of frames (trim or pad them beforehand),
and without ``frame_size`` every frame the same square size; with ``frame_size`` every frame is resized
(bicubic, aspect ratio not kept) to ``frame_size`` × ``frame_size``. Channels: ``channels=1`` converts
colour with Pillow's luma (L = 0.299 R + 0.587 G + 0.114 B), ``channels=3`` repeats grey; by default a
folder is grey (c = 1) unless some frame has unequal colour channels.

Every problem raises ValueError naming the file: a missing labels file or ``clip`` column, clips the labels
name that are not in the folder (the first few listed), unreadable frames, differing sizes or lengths,
unknown event names, and an events row whose length is not the clip's frame count.

Example::

    clips = read_clip_folder("my_clips", frame_size=32)   # frames (n, t, c, 32, 32) uint8
    clips.action_names, clips.captions[0]
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from seqlab.tasks.base import check_int, first_named
from seqlab.tasks.clips import EVENTS, Clips
from seqlab.tasks.image_files import _open_rgb
from seqlab.tasks.vision import IMAGE_SUFFIXES

__all__ = ["LABELS_FILE", "read_clip", "read_clip_folder"]

LABELS_FILE = "labels.csv"
COLUMNS = ("clip", "action", "caption", "events")


def _read_labels(path: Path) -> list[dict[str, str]]:
    """The rows of the labels file, each with every column of COLUMNS ("" where absent) and ``where``."""
    if not path.is_file():
        raise ValueError(
            f"labels file {path} does not exist: a clip folder needs {LABELS_FILE} (column 'clip')"
        )
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: tolerate a byte-order mark
        reader = csv.DictReader(f)
        if "clip" not in (reader.fieldnames or []):
            raise ValueError(
                f"{path}: the header lacks column 'clip'; found columns {reader.fieldnames or []}"
            )
        rows = []
        for row in reader:
            cells = {k: (row.get(k) or "").strip() for k in COLUMNS}
            rows.append({**cells, "where": f"{path}, line {reader.line_num}"})
    if not rows:
        raise ValueError(f"{path} names no clips")
    first: dict[str, str] = {}
    for row in rows:
        if not row["clip"]:
            raise ValueError(f"{row['where']}: the clip name is empty")
        if row["clip"] in first:  # a second row would make a second sample, which the split could part
            raise ValueError(
                f"{row['where']}: clip {row['clip']!r} is named again (first at {first[row['clip']]}); "
                f"{LABELS_FILE} takes one row per clip"
            )
        first[row["clip"]] = row["where"].rsplit(", ", 1)[-1]
    return rows


def _clip_path(folder: Path, name: str) -> Path | None:
    """``NAME.npy`` or the frame folder ``NAME/``; None if neither exists."""
    npy, frames = folder / f"{name}.npy", folder / name
    if npy.is_file() and frames.is_dir():
        raise ValueError(f"{folder}: clip {name!r} is both {npy.name} and a folder {name}/; keep one")
    return npy if npy.is_file() else frames if frames.is_dir() else None


def _load_npy(path: Path) -> list[np.ndarray]:
    """The frames of a .npy clip as uint8 (h, w, c) arrays, c 1 or 3."""
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} could not be read as a .npy array: {e}") from e
    if array.ndim == 3:
        array = array[..., None]  # (t, h, w) -> (t, h, w, 1)
    if array.ndim != 4 or array.shape[-1] not in (1, 3) or 0 in array.shape:
        raise ValueError(
            f"{path}: expected frames (t, h, w) or (t, h, w, c) with c 1 or 3, got {array.shape}"
        )
    if np.issubdtype(array.dtype, np.floating):
        if not (np.isfinite(array).all() and array.min() >= 0.0 and array.max() <= 1.0):
            raise ValueError(
                f"{path}: float frames must lie in [0, 1], got values in [{array.min()}, {array.max()}]"
            )
        array = np.rint(array * 255.0).astype(np.uint8)
    elif array.dtype != np.uint8:
        raise ValueError(f"{path}: expected uint8 frames or floats in [0, 1], got dtype {array.dtype}")
    return list(array)


def _natural_key(name: str) -> tuple[list, str]:
    """A sort key that compares runs of digits as numbers: frame2 < frame10 (plain sorting puts 10 first).
    re.split with a group alternates text and digits, so a position holds the same kind in every key."""
    parts = re.split(r"(\d+)", name)
    return [int(part) if i % 2 else part for i, part in enumerate(parts)], name


def _load_image_folder(path: Path) -> list[np.ndarray]:
    """The frame images of a clip folder, in natural filename order, as uint8 RGB (h, w, 3) arrays."""
    files = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    files.sort(key=lambda p: _natural_key(p.name))
    if not files:
        raise ValueError(f"clip folder {path} holds no frame images (expected one of {IMAGE_SUFFIXES})")
    return [np.asarray(_open_rgb(p), dtype=np.uint8) for p in files]


def _fit(frames: list[np.ndarray], path: Path, frame_size: int | None) -> np.ndarray:
    """One clip's frames (h, w, c), resized to frame_size or checked to share a square size: (t, s, s, c)."""
    if frame_size is not None:
        sized = (Image.fromarray(f[..., 0] if f.shape[-1] == 1 else f) for f in frames)
        resized = (np.asarray(im.resize((frame_size, frame_size), Image.Resampling.BICUBIC)) for im in sized)
        return np.stack([f[..., None] if f.ndim == 2 else f for f in resized])  # (t, s, s, c)
    for i, f in enumerate(frames):
        if f.shape[:2] != frames[0].shape[:2]:
            raise ValueError(
                f"{path}: frame {i} is {_size(f)} but frame 0 is {_size(frames[0])}; "
                f"pass frame_size to resize them"
            )
    if frames[0].shape[0] != frames[0].shape[1]:
        raise ValueError(f"{path}: frames are {_size(frames[0])}, not square; pass frame_size to resize them")
    return np.stack(frames)  # (t, s, s, c)


def _size(frame: np.ndarray) -> str:
    return f"{frame.shape[1]}x{frame.shape[0]}"  # width x height, as image tools say it


def _to_channels(clip: np.ndarray, channels: int) -> np.ndarray:
    """(t, s, s, c) -> (t, s, s, channels): Pillow's luma for colour to grey, repeats for grey to colour."""
    if clip.shape[-1] == channels:
        return clip
    if channels == 3:
        return np.repeat(clip, 3, axis=-1)
    return np.stack([np.asarray(Image.fromarray(f).convert("L"))[..., None] for f in clip])


def _is_grey(clip: np.ndarray) -> bool:
    return clip.shape[-1] == 1 or bool((clip == clip[..., :1]).all())


def _check_same(clips: dict[str, np.ndarray], paths: dict[str, Path]):
    """Every clip has the first clip's frame count and frame size."""
    first = next(iter(clips))
    t, s = clips[first].shape[:2]
    for name, clip in clips.items():
        if clip.shape[0] != t:
            raise ValueError(
                f"{paths[name]} has {clip.shape[0]} frames but {paths[first]} has {t}; all clips must have "
                f"the same number of frames (trim or pad them)"
            )
        if clip.shape[1] != s:
            raise ValueError(
                f"{paths[name]} has frames of {clip.shape[1]}x{clip.shape[1]} but {paths[first]} of {s}x{s}; "
                f"pass frame_size to resize every frame to one size"
            )


def _events(row: dict[str, str], t: int) -> list[int]:
    """The per-frame event indices of a labels row, -1 everywhere when the cell is blank."""
    names = row["events"].split()
    if not names:
        return [-1] * t
    unknown = sorted(set(names) - set(EVENTS))
    if unknown:
        raise ValueError(f"{row['where']}: unknown event name(s) {unknown}; known: {EVENTS}")
    if len(names) != t:
        raise ValueError(f"{row['where']}: {len(names)} events for clip {row['clip']!r} of {t} frames")
    return [EVENTS.index(e) for e in names]


def _load_clips(folder: Path, names: list[str], frame_size: int | None) -> tuple[dict, dict]:
    """Each distinct clip once: {name: (t, s, s, c) uint8}, {name: path}."""
    paths = {name: _clip_path(folder, name) for name in dict.fromkeys(names)}
    missing = [name for name, p in paths.items() if p is None]
    if missing:
        raise ValueError(
            f"{folder / LABELS_FILE}: {len(missing)} clip(s) it names are not in the folder (as NAME.npy or "
            f"NAME/): {first_named(missing)}"
        )
    clips = {}
    for name, p in paths.items():
        frames = _load_npy(p) if p.suffix == ".npy" and p.is_file() else _load_image_folder(p)
        clips[name] = _fit(frames, p, frame_size)
    _check_same(clips, paths)
    return clips, paths


def read_clip(path: str | os.PathLike, *, frame_size: int, channels: int) -> Tensor:
    """One clip, ``NAME.npy`` or a folder of frame images (the module docstring's rules), as a model of
    ``frame_size`` × ``frame_size`` frames with ``channels`` channels reads it: uint8 (t, c, s, s)."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".npy":
        frames = _load_npy(p)
    elif p.is_dir():
        frames = _load_image_folder(p)
    else:
        raise ValueError(f"{p} is neither a .npy clip nor a folder of frame images")
    clip = _to_channels(_fit(frames, p, check_int("frame_size", frame_size, 1)), channels)  # (t, s, s, c)
    return torch.from_numpy(np.ascontiguousarray(clip.transpose(0, 3, 1, 2)))


def read_clip_folder(
    path: str | os.PathLike, *, frame_size: int | None = None, channels: int | None = None
) -> Clips:
    """The clips of a folder and their labels (see the module docstring for the layout and the rules)."""
    if frame_size is not None:
        check_int("frame_size", frame_size, 1)
    if channels is not None and (isinstance(channels, bool) or channels not in (1, 3)):
        raise ValueError(f"channels must be 1, 3 or None, got {channels!r}")
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"clip folder {folder} does not exist or is not a folder")
    rows = _read_labels(folder / LABELS_FILE)
    clips, _ = _load_clips(folder, [r["clip"] for r in rows], frame_size)
    if channels is None:
        channels = 1 if all(_is_grey(c) for c in clips.values()) else 3
    frames = np.stack([_to_channels(clips[r["clip"]], channels) for r in rows])  # (n, t, s, s, c)
    action_names = tuple(sorted({r["action"] for r in rows} - {""}))
    actions = [action_names.index(r["action"]) if r["action"] else -1 for r in rows]
    events = [_events(r, frames.shape[1]) for r in rows]
    return Clips(
        torch.from_numpy(np.ascontiguousarray(frames.transpose(0, 1, 4, 2, 3))),  # (n, t, c, s, s)
        torch.tensor(actions, dtype=torch.long),
        torch.tensor(events, dtype=torch.long).reshape(len(rows), frames.shape[1]),
        [r["caption"] for r in rows],
        action_names,
    )
