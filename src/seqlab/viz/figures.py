"""The two steps every seqlab plot shares: pyplot on a file-only backend, and writing a finished figure."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (PNG files, no display), imported on first use: matplotlib is the
    ``lab`` extra, so importing seqlab never needs it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` (creating the folder) and close it; returns the path."""
    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
