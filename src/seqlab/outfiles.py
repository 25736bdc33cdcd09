"""The single files the CLI's figure commands write (``viz ...``, ``forecast --out``): never one that exists.

A command declares its file with :func:`add_out_file`; before the command does any work, the dispatcher turns
``args.out`` into the path to write with :func:`fresh_file`:

* a path the user gave that exists is refused (a user's notes.pdf was replaced by a figure before), and so are
  an empty path, a folder, and a path under a file;
* the command's default path (under ``runs/viz/``) that exists from an earlier call gets the next free number,
  ``positions-2.png``, and the command prints the name it wrote;
* a name without a suffix gets ``.png`` (what matplotlib wrote there anyway), so the printed name is the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_out_file", "fresh_file", "nearest_existing"]


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists: where a new file or folder at ``path`` would be made (a file
    there means ``path`` lies under a file and cannot be made)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


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
    path = Path(out)
    if path.suffix == "":
        path = path.with_suffix(".png")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:  # found now, not after the figure's work
        raise ValueError(
            f"--out {out}: {path.suffix} is not a figure format; use one of {', '.join(sorted(formats))}"
        )
    if not (parent := nearest_existing(path.parent)).is_dir():
        raise ValueError(f"--out {out}: {parent} is a file, not a folder")
    if Path(out).is_dir():
        name = Path(default).name if default else "figure.png"
        raise ValueError(f"--out {out} is a folder; give a file name in it, e.g. {Path(out) / name}")
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
    if not (parent := nearest_existing(path)).is_dir():
        raise ValueError(f"--out {out}: {parent} is a file, not a folder")
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
