"""The kernel cache's superseded builds: what ``seqlab doctor`` reports and ``seqlab doctor --prune-kernels`` removes.

Every kernel is built into a folder named after its source and flags (``seqlab_<stem>_<isa>_<python and
torch>_<digest>``, ``build.py``), so a seqlab with other kernel sources builds beside the old folders, and
nothing removes those. A folder is *superseded* when it holds one of this seqlab's kernels, for this
instruction set, Python and torch, but built from other sources than this seqlab's: no process of this
environment loads it again. Builds for another Python or torch (another environment sharing the cache may use
them) and folders seqlab did not name are never touched. Removing a build costs at most its rebuild, 10-60 s,
if an older seqlab in this same environment comes back.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from seqlab.kernels import (
    activations,
    additive_score,
    attention,
    build,
    causal_conv,
    decode,
    gated_norm,
    layer_norm,
    linear_attention,
    mingru_scan,
    recurrent,
)

__all__ = ["EXTENSIONS", "current_names", "folder_bytes", "prune", "superseded"]

# every pybind kernel (the selective scan, a library of torch operators, has build.py's own loader)
EXTENSIONS = tuple(
    m.EXTENSION
    for m in (
        recurrent,
        causal_conv,
        mingru_scan,
        linear_attention,
        decode,
        activations,
        layer_norm,
        gated_norm,
        attention,
        additive_score,
    )
)

_NAMED = re.compile(r"^(seqlab_\w+_)[0-9a-f]{10}$")  # a build name: its prefix, then the digest


def current_names() -> list[str]:
    """The build name of every kernel of this seqlab on this machine (their folders in ``build.cache_root()``)."""
    return [build._build_name_and_flags()[0], *(e.name_and_flags()[0] for e in EXTENSIONS)]


def superseded(root: Path | None = None) -> list[Path]:
    """The superseded build folders in the cache (the module docstring), oldest name first."""
    root = build.cache_root() if root is None else root
    if not root.is_dir():
        return []
    current = set(current_names())
    prefixes = {name[:-10] for name in current}  # seqlab_<stem>_<isa>_<python and torch>_
    found = []
    for folder in sorted(root.iterdir()):
        named = _NAMED.match(folder.name)
        ours = named is not None and named.group(1) in prefixes and folder.name not in current
        if ours and folder.is_dir() and not folder.is_symlink():
            found.append(folder)
    return found


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder``."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def prune(folders: list[Path]) -> list[tuple[Path, int]]:
    """Remove these build folders; each removed one with the bytes it held."""
    removed = []
    for folder in folders:
        size = folder_bytes(folder)
        shutil.rmtree(folder)
        removed.append((folder, size))
    return removed
