"""The single files the CLI's figure commands write (``viz ...``, ``forecast --out``): never one that exists.

A command declares its file with :func:`add_out_file`; before the command does any work, the dispatcher turns
``args.out`` into the path to write with :func:`fresh_file`:

* a path the user gave that exists is refused (a user's notes.pdf was replaced by a figure before), and so are
  an empty path, a folder, and a path under a file;
* the command's default path (under ``runs/viz/``) that exists from an earlier call gets the next free number,
  ``positions-2.png``, and the command prints the name it wrote;
* a name without a suffix gets ``.png`` (what matplotlib wrote there anyway), so the printed name is the file;
  a suffix that is not a figure format, a bare suffix (``viz/.png``) and a trailing dot are refused;
* the folder it goes in must exist or be creatable, and be writable (probed with a nameless temporary file),
  so that /sys/grad.png fails before minutes of training, not after them.

One rule for ``--out`` across the figure commands: a name ending in a figure format (``.png``, ``.pdf``, ``.svg``,
...) is a file; a name with no suffix is a file with ``.png`` added for a one-figure command, and a folder for
``viz attention`` (which can write several figures); any other suffix is refused by both.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

__all__ = ["add_out_file", "check_writable", "figure_suffix", "fresh_file", "nearest_existing"]


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists: where a new file or folder at ``path`` would be made (a file
    there means ``path`` lies under a file and cannot be made)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(out: str | Path, flag: str = "--out") -> None:
    """A ValueError unless a file or folder can be made at ``out``: its nearest existing ancestor must be a
    writable folder. ``os.access`` alone says yes to root on /sys, so a nameless temporary file is made and
    dropped there (``O_TMPFILE``: nothing with a name appears in the user's folder)."""
    parent = nearest_existing(Path(out) if Path(out).is_dir() else Path(out).parent)
    if not parent.is_dir():
        raise ValueError(f"{flag} {out}: {parent} is a file, not a folder")
    try:
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError:
        raise ValueError(
            f"{flag} {out}: the folder {parent} is not writable; choose another {flag}"
        ) from None


def figure_suffix(out: str) -> str:
    """The figure format ``out`` names (``'png'``), ``''`` for a name without a suffix; a ValueError for a
    suffix matplotlib cannot write, a bare suffix (``.png``: a hidden file with no name) or a trailing dot."""
    name = Path(out).name
    if name.endswith("."):
        raise ValueError(f"--out {out}: the name ends in a dot; give a name such as figure.png")
    if name.startswith(".") and name.count(".") == 1:
        raise ValueError(f"--out {out}: {name} is a suffix without a name; give a name such as figure{name}")
    suffix = Path(out).suffix[1:].lower()
    if not suffix:
        return ""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:  # found now, not after the figure's work
        raise ValueError(
            f"--out {out}: .{suffix} is not a figure format; use one of {', '.join(sorted(formats))}"
        )
    return suffix


def add_out_file(parser: argparse.ArgumentParser, default: str | None, help: str) -> None:
    """``--out`` for a command that writes one file: checked by :func:`fresh_file` before the command runs."""
    parser.add_argument("--out", default=default, help=f"{help} (never overwritten)")
    parser.set_defaults(out_file_default=default)


def fresh_file(out: str | None, default: str | None) -> str | None:
    """The path to write for ``--out`` (None stays None: no file asked); a ValueError naming the problem."""
    if out is None:
        return None
    if not out.strip():
        raise ValueError("--out is empty: give a file name, e.g. runs/viz/figure.png")
    if Path(out).is_dir():
        name = Path(default).name if default else "figure.png"
        raise ValueError(f"--out {out} is a folder; give a file name in it, e.g. {Path(out) / name}")
    path = Path(out) if figure_suffix(out) else Path(out).with_suffix(".png")
    check_writable(path)
    if not path.exists():
        return str(path)
    if out != default:
        raise ValueError(f"{path} exists; seqlab does not overwrite files: remove it or choose another --out")
    n = 2
    while (numbered := path.with_name(f"{path.stem}-{n}{path.suffix}")).exists():
        n += 1
    return str(numbered)


def fresh_folder(out: str, default: str, writes: tuple[str, ...]) -> Path:
    """The folder to write a command's files in (``writes``: glob patterns of their names), checked before any
    work: a folder already holding such files is refused (the default one: the next free numbered folder beside
    it, ``attention-2``); a file where the folder should be is an error."""
    if not out.strip():
        raise ValueError("--out is empty: give a folder, e.g. runs/viz/attention")

    def taken(folder: Path) -> bool:
        return folder.is_dir() and any(any(folder.glob(p)) for p in writes)

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file; this command writes a folder of figures")
    check_writable(path)
    if not taken(path):
        return path
    if out != default:
        raise ValueError(
            f"{path} already holds figures this command writes ({', '.join(writes)}); seqlab does not overwrite "
            "files: remove them or choose another --out"
        )
    n = 2
    while taken(numbered := path.with_name(f"{path.name}-{n}")) or numbered.is_file():
        n += 1
    return numbered
