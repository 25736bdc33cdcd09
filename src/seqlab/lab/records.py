"""One record type for every number the lab measures: a trained metric, a decode latency, a throughput."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PUBLIC_FIELDS = ("mixer", "task", "setting", "metric", "value", "params", "train_tokens_per_s", "seconds")
"""The fields of each row of results.json, in order."""


@dataclass(frozen=True)
class Record:
    """One measured number: ``mixer``'s ``metric`` on ``task`` at ``setting``.

    Examples::

        r = Record("lstm", "adding", "T=50", "val_mse", 0.012, params=61_200, seconds=40.0)
        r.public()["value"]       # 0.012
    """

    mixer: str
    task: str
    """A suite task, or one of the systems measurements: 'decode', 'throughput', 'memory'."""
    setting: str
    """The table's label of the setting, e.g. 'T=50' or 'context=1024'."""
    metric: str
    value: float
    params: int
    seconds: float
    """Wall time of the run (or of the systems profile) that produced the number."""
    train_tokens_per_s: float | None = None
    x_value: float | None = None
    """Where the setting sits on a plot's x axis (sequence length, context); None: not plotted against one."""
    higher_is_better: bool = True
    curve: list[list[float]] = field(default_factory=list)
    """[step, train loss] pairs of a training run."""

    def public(self) -> dict[str, Any]:
        """The row written to results.json."""
        return {k: getattr(self, k) for k in PUBLIC_FIELDS}


def write_results(out: Path, records: list[Record]) -> Path:
    """``out/results.json``: one row of :data:`PUBLIC_FIELDS` per record."""
    from seqlab.training.checkpoint import write_text_atomic

    path = Path(out) / "results.json"
    write_text_atomic(path, json.dumps([r.public() for r in records], indent=1))
    return path


def select(records: list[Record], **match) -> list[Record]:
    """The records whose fields equal ``match``, e.g. ``select(rs, mixer='lstm', task='decode')``."""
    return [r for r in records if all(getattr(r, k) == v for k, v in match.items())]


def first_value(records: list[Record], default: Any = None, **match) -> Any:
    """The value of the first record matching ``match``, else ``default``."""
    hit = select(records, **match)
    return hit[0].value if hit else default


class RunCache:
    """``DIR/runs/<key>.json``: one file per finished run or measurement, written the moment it finishes and
    reused while the settings stored in it equal the ones asked for (so an interrupted compare resumes)."""

    def __init__(self, out: Path):
        self.dir = Path(out) / "runs"
        self.dir.mkdir(parents=True, exist_ok=True)

    def get(self, key: str, settings: dict[str, Any]) -> dict[str, Any] | None:
        settings = json.loads(json.dumps(settings))  # compare as stored: tuples become lists
        f = self.dir / f"{key}.json"
        if f.is_file():
            data = json.loads(f.read_text(encoding="utf-8"))
            if data.get("settings") == settings:
                return data
        return None

    def put(self, key: str, data: dict[str, Any]) -> None:
        from seqlab.training.checkpoint import write_text_atomic

        write_text_atomic(self.dir / f"{key}.json", json.dumps(data, indent=1))


def slug(*parts: str) -> str:
    """A cache key from names and settings: 'lstm', 'adding', 'T=50' -> 'lstm__adding__T-50'."""
    return "__".join("".join(ch if ch.isalnum() or ch in "-." else "-" for ch in p) for p in parts)


__all__ = ["PUBLIC_FIELDS", "Record", "RunCache", "first_value", "select", "slug", "write_results"]
