"""TensorBoard event files beside ``metrics.jsonl``: the same records, as scalars a dashboard reads.

Each numeric field of a record becomes the scalar ``{split}/{field}`` at the record's step (``train/loss``,
``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``, ``val/acc``, ...), written by
``torch.utils.tensorboard.SummaryWriter`` into ``RUN/tb/``. A resumed run opens the writer with
``purge_step`` at its checkpoint's next step, so TensorBoard drops what an interrupted process logged after
the checkpoint, as ``metrics.jsonl`` is cut back to it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["INSTALL", "TensorBoardLog", "check_available"]

INSTALL = "pip install tensorboard"
SKIP = ("step", "split", "elapsed_s")


def check_available() -> None:
    """A ValueError naming the install line when the tensorboard package is missing (checked before training)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ValueError(f"train.loggers asks for 'tensorboard', which is not installed: {INSTALL}")


class TensorBoardLog:
    """Writes metric records as scalars; ``purge_step`` discards events at or after it from an earlier process."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        check_available()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def write(self, rec: dict[str, Any]) -> None:
        split, step = rec.get("split", "train"), int(rec["step"])
        for key, value in rec.items():
            if key not in SKIP and isinstance(value, int | float) and not isinstance(value, bool):
                name = key.removeprefix(f"{split}_")  # an evaluation's 'val_acc' -> 'val/acc'
                self.writer.add_scalar(f"{split}/{name}", value, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
