r"""Captioned images from files: an image loader, a captions-file reader and the Tux Paint stamps.

    load_image(path, size)       uint8 RGB (3, H, W); with ``size``, letterboxed into (3, size, size)
    load_images(paths, size)     uint8 (n, 3, size, size)
    read_captions_file(path)     [(image path, caption), ...] from a CSV or JSON-lines file
    split_captioned(pairs)       {split: [(image path, [its captions]), ...]}, 80/10/10 by image
    tuxpaint_stamps()            [(image path, caption), ...] from Debian's ``tuxpaint-stamps-default``

Notation: ``n`` images, ``H, W`` an image's height and width in pixels.

Conversion to RGB: every mode Pillow reads is converted with Pillow's own rules (palette, greyscale, CMYK,
YCbCr ...); an image with transparency (an alpha band, or a palette or greyscale image with a transparent
colour) is composited on white first, so a transparent background comes out white. 16-bit greyscale
(mode ``I;16``, e.g. 16-bit PNG) is scaled to 8 bits (Pillow's conversion would clip it at 255); 32-bit
integer and float greyscale (``I``, ``F``) by the range its values are in: [0, 1] floats times 255, [0, 255] as
they are, [0, 65535] over 257, anything else an error. The EXIF
orientation tag is applied, so photos come out upright.

Letterboxing: with ``size`` the image is resized (bicubic) so its longer side is ``size`` pixels, keeping
its aspect ratio, and centred on a white ``size`` x ``size`` canvas.

The Tux Paint stamps (https://tuxpaint.org, ~785 clip-art PNGs with an English caption each, GPL) are read
from the installed package at run time; nothing of them is copied into this repository.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

from seqlab.tasks.base import SPLIT_SEED, MissingDependencyError, check_int, first_named

__all__ = [
    "TUXPAINT_DIR",
    "TUXPAINT_INSTALL",
    "load_image",
    "load_images",
    "read_captions_file",
    "split_captioned",
    "tuxpaint_stamps",
]

TUXPAINT_DIR = "/usr/share/tuxpaint/stamps"
TUXPAINT_INSTALL = "apt-get install -y --no-install-recommends tuxpaint-stamps-default"
WHITE = (255, 255, 255)
log = logging.getLogger("seqlab.tasks")


def _open_rgb(path: Path):
    """The image at ``path`` as a loaded Pillow RGB image, transparency composited on white."""
    if not path.is_file():
        raise ValueError(
            f"image file {path} does not exist" if not path.exists() else f"{path} is not a file"
        )
    try:
        # Pillow's warning past MAX_IMAGE_PIXELS (printed raw): said below in seqlab's words
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as opened:
                opened.load()
                image = ImageOps.exif_transpose(opened)
    except UnidentifiedImageError as e:
        raise ValueError(f"{path} is not an image Pillow can read ({e})") from e
    except Image.DecompressionBombError as e:  # past Pillow's pixel limit (about 179 megapixels)
        raise ValueError(f"{path} is too large to read safely ({e}); downscale it first") from e
    except OSError as e:  # truncated or corrupt data
        raise ValueError(f"{path} could not be read as an image: {e}") from e
    if image.width == 0 or image.height == 0:
        raise ValueError(f"{path} holds an empty image of size {image.width}x{image.height}")
    if Image.MAX_IMAGE_PIXELS and image.width * image.height > Image.MAX_IMAGE_PIXELS:
        log.warning(
            "%s is %dx%d (%.0f megapixels, past Pillow's %.0f-megapixel warning): read in full, then resized; "
            "downscale such images once to make every epoch faster",
            path,
            image.width,
            image.height,
            image.width * image.height / 1e6,
            Image.MAX_IMAGE_PIXELS / 1e6,
        )
    if image.mode.startswith("I;16"):
        scaled = np.asarray(image, dtype=np.float32) / 257.0  # 0..65535 -> 0..255
        image = Image.fromarray(np.rint(scaled).astype(np.uint8), mode="L")
    elif image.mode in ("F", "I"):
        image = Image.fromarray(
            _wide_to_8_bits(np.asarray(image, dtype=np.float64), image.mode, path), mode="L"
        )
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*WHITE, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    try:
        return image.convert("RGB")
    except ValueError as e:
        raise ValueError(f"{path}: Pillow cannot convert mode {image.mode!r} to RGB ({e})") from e


def _wide_to_8_bits(values: np.ndarray, mode: str, path) -> np.ndarray:
    """A float (``F``) or 32-bit integer (``I``) greyscale image as 8 bits by the range it is in: [0, 1] (floats)
    times 255, [0, 255] as it is, [0, 65535] divided by 257; outside those (or not finite) a ValueError, never
    Pillow's clipping (a [0, 1] float image came out black)."""
    lo, hi = (float(values.min()), float(values.max())) if np.isfinite(values).all() else (np.nan, np.nan)
    if not lo >= 0:
        raise ValueError(
            f"{path}: a mode {mode!r} image with values from {lo} to {hi}; expected 0 or more, finite"
        )
    scale = 255.0 if mode == "F" and hi <= 1.0 else 1.0 if hi <= 255 else 1 / 257 if hi <= 65535 else None
    if scale is None:
        raise ValueError(f"{path}: a mode {mode!r} image with values up to {hi}; expected at most 65535")
    return np.rint(values * scale).clip(0, 255).astype(np.uint8)


def _letterbox(image, size: int, background: tuple[int, int, int] = WHITE):
    """Fit ``image`` into ``size`` x ``size`` keeping its aspect ratio, centred on ``background``."""
    scale = size / max(image.width, image.height)
    width, height = max(1, round(image.width * scale)), max(1, round(image.height * scale))
    resized = image.resize((width, height), Image.Resampling.BICUBIC)
    canvas = Image.new("RGB", (size, size), background)
    canvas.paste(resized, ((size - width) // 2, (size - height) // 2))
    return canvas


def load_image(
    path: str | os.PathLike,
    size: int | None = None,
    background: tuple[int, int, int] = WHITE,
    grey: bool = False,
) -> Tensor:
    """The image at ``path`` as uint8 RGB (3, H, W), or letterboxed into (3, size, size) on ``background`` when
    ``size`` is set; with ``grey``, (1, H, W) as Pillow's mode ``L`` gives it (ITU-R 601 luma).

    Raises ValueError, naming the path, for a missing file, a file that is not a readable image, and an
    empty image.
    """
    if size is not None:
        check_int("size", size, 1)
    image = _open_rgb(Path(path))
    if size is not None:
        image = _letterbox(image, size, background)
    if grey:
        return torch.from_numpy(np.asarray(image.convert("L"), dtype=np.uint8).copy())[None]  # (1, H, W)
    array = np.asarray(image, dtype=np.uint8)  # (H, W, 3)
    return torch.from_numpy(array.transpose(2, 0, 1).copy())  # (3, H, W)


def load_images(paths: Iterable[str | os.PathLike], size: int) -> Tensor:
    """Images letterboxed to a common ``size``, stacked: uint8 (n, 3, size, size); (0, 3, size, size) if none."""
    check_int("size", size, 1)
    images = [load_image(p, size) for p in paths]
    if not images:
        return torch.empty(0, 3, size, size, dtype=torch.uint8)
    return torch.stack(images)  # (n, 3, size, size)


# ---- captions files ------------------------------------------------------------------------------------


def _csv_rows(path: Path) -> list[tuple[str, object, object]]:
    """(where, image, caption) per data row of a CSV file with ``image`` and ``caption`` columns."""
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: tolerate a byte-order mark
        reader = csv.DictReader(f)
        found = reader.fieldnames or []
        missing = [c for c in ("image", "caption") if c not in found]
        if missing:
            raise ValueError(f"{path}: the header lacks column(s) {missing}; found columns {found}")
        return [(f"{path}, line {reader.line_num}", row["image"], row["caption"]) for row in reader]


def _jsonl_rows(path: Path) -> list[tuple[str, object, object]]:
    """(where, image, caption) per non-blank line of a JSON-lines file, one object per line."""
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: expected one JSON object per line, got invalid JSON ({e})") from e
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object per line, got {type(record).__name__}")
            missing = [k for k in ("image", "caption") if k not in record]
            if missing:
                raise ValueError(f"{where}: the object lacks key(s) {missing}; found keys {sorted(record)}")
            rows.append((where, record["image"], record["caption"]))
    return rows


def read_captions_file(path: str | os.PathLike) -> list[tuple[Path, str]]:
    """(image path, caption) per row of a captions file, in file order; an image may have several rows.

    Formats, chosen by extension: ``.csv`` with a header row holding columns ``image`` and ``caption``
    (other columns ignored); ``.jsonl`` or ``.json`` holding one JSON object per line with keys ``image``
    and ``caption``. A relative image path is relative to the captions file's folder. Captions are stripped
    of surrounding whitespace. Everything is checked before any image is read: an unknown extension,
    missing columns or keys, an empty caption, and image files that do not exist raise ValueError.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"captions file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        rows = _csv_rows(path)
    elif suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path)
    else:
        raise ValueError(f"{path}: unknown captions file type {suffix!r}; expected .csv, .jsonl or .json")
    if not rows:
        raise ValueError(f"{path} holds no captions")
    pairs = []
    for where, image, caption in rows:
        if not isinstance(image, str) or not image.strip():
            raise ValueError(f"{where}: the image must be a non-empty path, got {image!r}")
        if not isinstance(caption, str) or not caption.strip():
            raise ValueError(f"{where}: the caption must be non-empty text, got {caption!r}")
        pairs.append((path.parent / Path(image.strip()), caption.strip()))  # an absolute path stays as is
    missing = sorted({str(p) for p, _ in pairs if not p.is_file()})
    if missing:
        raise ValueError(
            f"{path}: {len(missing)} of the images it names do not exist: {first_named(missing)}"
        )
    return pairs


def split_captioned(pairs: list[tuple[Path, str]]) -> dict[str, list[tuple[Path, list[str]]]]:
    """(image, all its captions) per split 'train', 'val', 'test': the images, sorted, in a random order that is the
    same for every seed (``base.SPLIT_SEED``), cut 80/10/10; every caption of an image stays with it. A prefix of
    a split is its first images in that order (what ``n_train``/``n_eval`` keep). Fewer than 10 images: ValueError.
    """
    by_image: dict[Path, list[str]] = {}
    for path, caption in pairs:
        by_image.setdefault(path, []).append(caption)
    paths = sorted(by_image)
    if len(paths) < 10:
        raise ValueError(
            f"captioning needs at least 10 images to split into train/val/test, got {len(paths)}"
        )
    order = torch.randperm(len(paths), generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    cut_val, cut_test = int(0.8 * len(paths)), int(0.9 * len(paths))
    parts = {"train": order[:cut_val], "val": order[cut_val:cut_test], "test": order[cut_test:]}
    return {split: [(paths[r], by_image[paths[r]]) for r in rows] for split, rows in parts.items()}


# ---- Tux Paint stamps ----------------------------------------------------------------------------------


def tuxpaint_stamps(root: str | os.PathLike = TUXPAINT_DIR) -> list[tuple[Path, str]]:
    """(PNG path, English caption) for every stamp under ``root`` that has a caption, sorted by path.

    A stamp ``<name>.png`` is captioned by the first line of ``<name>.txt`` beside it (the English text;
    later lines are translations); stamps without a caption file or with an empty first line (e.g. the
    ``*_mirror.png`` variants) are skipped.
    """
    root = Path(root)
    if not root.is_dir():
        raise MissingDependencyError(
            f"Tux Paint stamps not found in {root}: install the Debian package tuxpaint-stamps-default "
            f"with: {TUXPAINT_INSTALL}"
        )
    stamps = []
    for png in sorted(root.rglob("*.png")):
        text = png.with_suffix(".txt")
        if not text.is_file():
            continue
        with open(text, encoding="utf-8", errors="replace") as f:
            caption = f.readline().strip()
        if caption:
            stamps.append((png, caption))
    return stamps
