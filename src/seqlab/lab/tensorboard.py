"""The lab's runs as TensorBoard runs: one per mixer × task × setting, from the suite's own run cache.

Every finished run of ``seqlab compare`` is stored in ``DIR/runs/<key>.json`` (its settings, the training
curve and the final metrics). ``write_lab_events(DIR)`` turns each into an event file under
``DIR/tb/<task>/<setting>/<mixer>/``, so that

    tensorboard --logdir DIR/tb

shows the training curves of all mixers of one task side by side (TensorBoard groups runs by folder) and
the final metrics as scalars at the last step. Rebuilding replaces only seqlab's own ``tb/`` folder (marked by a file; another ``tb/`` is never touched), written
into a temporary folder first and swapped in, so a reader never sees half of it.

    python -m seqlab.lab.tensorboard DIR
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from seqlab.lab.records import slug
from seqlab.training.tensorboard import check_available

__all__ = ["write_lab_events"]

MARK = ".seqlab-lab-events"


def _runs(out: Path) -> list[dict[str, Any]]:
    """The cached training runs (systems measurements have no curve and are left out)."""
    found = []
    for f in sorted((out / "runs").glob("*.json")):
        data = json.loads(f.read_text(encoding="utf-8"))
        entry = data.get("settings", {}).get("entry")
        if entry and data.get("curve"):
            found.append({"file": f, "entry": entry, **data})
    return found


def _mixer(run: dict[str, Any]) -> str:
    """The mixer of a cached run: its settings name it, else its file name does (``mixer__task__setting``)."""
    return run["settings"].get("mixer") or run["file"].stem.split("__")[0]


def write_lab_events(out: str | Path) -> Path:
    """Write ``out/tb`` from ``out/runs``; returns the folder. A ValueError when there is nothing to write."""
    check_available()
    from torch.utils.tensorboard import SummaryWriter

    out = Path(out)
    runs = _runs(out)
    if not runs:
        raise ValueError(f"{out / 'runs'} holds no finished training runs of `seqlab compare`")
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".tb-"))
    try:
        for run in runs:
            entry = run["entry"]
            where = tmp / slug(entry["task"]) / slug(entry.get("setting", "default")) / slug(_mixer(run))
            writer = SummaryWriter(str(where))
            for step, loss in run["curve"]:
                writer.add_scalar("train/loss", loss, int(step))
            last = int(run["summary"].get("step", run["curve"][-1][0]))
            for key, value in run["summary"].items():
                if key.startswith("val_") and isinstance(value, int | float) and not isinstance(value, bool):
                    writer.add_scalar(f"val/{key.removeprefix('val_')}", value, last)
            writer.add_scalar("train/tokens_per_s", run["train_tokens_per_s"], last)
            writer.close()
        (tmp / MARK).write_text("written by seqlab.lab.tensorboard from ../runs; rebuilt on every compare\n")
        final = out / "tb"
        if final.exists():
            if not (final / MARK).is_file():  # not seqlab's: never removed
                raise ValueError(
                    f"{final} exists and seqlab did not write it; move it away to write the events"
                )
            shutil.rmtree(final)  # seqlab's own folder, rebuilt from the runs it was made from
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m seqlab.lab.tensorboard RESULT_DIR")
    print(write_lab_events(sys.argv[1]))
