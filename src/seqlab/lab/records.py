"""One record type for every number the lab measures: a trained metric, a decode latency, a throughput; and
the spread of a timing, measured in interleaved rounds until it is small or a time cap is hit."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import platform
import shutil
import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqlab.lab.workers import check_not_stopped, stop_after_interrupt, stop_pool_on_interrupt

log = logging.getLogger("seqlab.lab")

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
    spread: float | None = None
    """The interquartile range of a timing's repeats, in the units of ``value``; None: not a timing."""
    noisy: bool = False
    """True when that spread stayed above :data:`SPREAD_LIMIT` of the median until the time cap."""

    def public(self) -> dict[str, Any]:
        """The row written to results.json."""
        return {k: getattr(self, k) for k in PUBLIC_FIELDS}


def write_results(out: Path, records: list[Record]) -> Path:
    """``out/results.json``: one row of :data:`PUBLIC_FIELDS` per record."""
    return write_output(Path(out) / "results.json", json.dumps([r.public() for r in records], indent=1))


def select(records: list[Record], **match) -> list[Record]:
    """The records whose fields equal ``match``, e.g. ``select(rs, mixer='lstm', task='decode')``."""
    return [r for r in records if all(getattr(r, k) == v for k, v in match.items())]


def first_value(records: list[Record], default: Any = None, **match) -> Any:
    """The value of the first record matching ``match``, else ``default``."""
    hit = select(records, **match)
    return hit[0].value if hit else default


SPREAD_LIMIT = 0.10
"""A timing is trusted once its interquartile range is below this fraction of its median."""


@dataclass(frozen=True)
class Spread:
    """The repeats of one timing: median and interquartile range (inclusive quartiles).

    Examples::

        s = Spread((1.0, 1.1, 0.9, 1.0, 5.0))
        s.median, s.iqr, s.noisy()    # 1.0, 0.1, False: one outlier does not move the quartiles
    """

    samples: tuple[float, ...]

    def quartiles(self) -> tuple[float, float, float]:
        if len(self.samples) < 2:
            v = self.samples[0] if self.samples else float("nan")
            return v, v, v
        q1, q2, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q2, q3

    @property
    def median(self) -> float:
        return self.quartiles()[1]

    @property
    def iqr(self) -> float:
        q1, _, q3 = self.quartiles()
        return q3 - q1

    @property
    def relative(self) -> float:
        """IQR / median; infinite for fewer than 2 repeats or a zero median."""
        m = self.median
        return self.iqr / m if len(self.samples) >= 2 and m > 0 else float("inf")

    def noisy(self, limit: float = SPREAD_LIMIT) -> bool:
        return not self.relative < limit


def interleave(
    units: dict[Hashable, Callable[[], float]],
    min_rounds: int = 5,
    max_rounds: int = 60,
    time_cap_s: float = 30.0,
    limit: float = SPREAD_LIMIT,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[Hashable, Spread]:
    """Run every unit of work once per round, round-robin (the order reversed every other round), so that a
    busy phase of a shared machine falls on every contender alike; each unit returns the seconds it timed.
    One warm-up round is discarded.

    Rounds go on until every contender's IQR is below ``limit`` of its median (after ``min_rounds``), or
    ``time_cap_s`` has passed on ``clock``, or ``max_rounds`` were run.
    """
    names = list(units)
    for name in names:
        units[name]()
    times: dict[Hashable, list[float]] = {name: [] for name in names}
    start = clock()
    for r in range(max_rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(units[name]())
        if r + 1 >= min_rounds:
            quiet = all(not Spread(tuple(t)).noisy(limit) for t in times.values())
            if quiet or clock() - start >= time_cap_s:
                break
    return {name: Spread(tuple(t)) for name, t in times.items()}


class RunCache:
    """``DIR/runs/<key>.json``: one file per finished run or measurement, written the moment it finishes and
    reused while the settings stored in it equal the ones asked for (so an interrupted compare resumes)."""

    def __init__(self, out: Path):
        self.dir = Path(out) / "runs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.used: set[str] = set()  # the keys this compare read back or wrote: its report shows only these

    def get(self, key: str, settings: dict[str, Any]) -> dict[str, Any] | None:
        settings = json.loads(json.dumps(settings))  # compare as stored: tuples become lists
        f = self.dir / f"{key}.json"
        if f.is_file():
            data = json.loads(f.read_text(encoding="utf-8"))
            if data.get("settings") == settings:
                self.used.add(key)
                return data
        return None

    def put(self, key: str, data: dict[str, Any]) -> None:
        """Write ``<key>.json``; a file it replaces is kept as ``<key>.json.prev`` (then ``.prev-2``, ``.prev-3``,
        ...: nothing stored is lost, however often a run is replaced)."""
        from seqlab.training.checkpoint import write_text_atomic

        self.used.add(key)
        path = self.dir / f"{key}.json"
        set_aside(path)
        write_text_atomic(path, json.dumps(data, indent=1))


def set_aside(path: Path) -> Path | None:
    """Copy the file at ``path`` to ``NAME.prev`` (``.prev-2``, ``.prev-3``, ... when that is taken) before it is
    written again: nothing stored is lost. The copy's path; None when there was no file."""
    if not path.is_file():
        return None
    kept, n = path.with_name(f"{path.name}.prev"), 1
    while kept.exists():
        n += 1
        kept = path.with_name(f"{path.name}.prev-{n}")
    shutil.copyfile(path, kept)
    return kept


def write_output(path: str | Path, text: str) -> Path:
    """Write one of a compare's report files (table.md, report.html, results.json) through :func:`write_kept`:
    an earlier file there with other contents (an earlier compare's, or one the user edited) is kept."""
    from seqlab.training.checkpoint import write_text_atomic

    return write_kept(path, lambda where: write_text_atomic(where, text))


def write_figure(fig, path: str | Path, **kw: Any) -> Path:
    """``viz.figures.save_figure`` for a compare's plots, through :func:`write_kept`."""
    from seqlab.viz.figures import save_figure

    return write_kept(path, lambda where: save_figure(fig, where, **kw))


def write_kept(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """A compare's file written by ``write(where)`` (a report, a plot): an earlier file at ``path`` that differs
    is kept as ``NAME.prev`` first (:func:`set_aside`), and the log says so; one the same is left as it is."""
    import os

    path = Path(path)
    if not path.is_file():
        write(path)
        return path
    fresh = path.with_name(f".new-{path.name}")  # the same suffix: the same format
    try:
        write(fresh)
    except BaseException:
        fresh.unlink(missing_ok=True)
        raise
    if fresh.read_bytes() == path.read_bytes():
        fresh.unlink()
    else:
        log.info("kept the earlier %s as %s", path.name, set_aside(path).name)
        os.replace(fresh, path)
    return path


def slug(*parts: str) -> str:
    """A cache key from names and settings: 'lstm', 'adding', 'T=50' -> 'lstm__adding__T-50'."""
    return "__".join("".join(ch if ch.isalnum() or ch in "-." else "-" for ch in p) for p in parts)


__all__ = [
    "PUBLIC_FIELDS",
    "SPREAD_LIMIT",
    "Record",
    "RunCache",
    "Spread",
    "check_not_stopped",
    "check_out_folder",
    "first_value",
    "interleave",
    "select",
    "set_aside",
    "slug",
    "stop_after_interrupt",
    "stop_pool_on_interrupt",
    "write_figure",
    "write_kept",
    "write_output",
    "write_results",
]


class _Collect(logging.Handler):
    """Keeps the formatted log lines of a worker process, to be written by the parent above its progress bar."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@contextlib.contextmanager
def collect_logs(enabled: bool):
    """In a worker: warnings and log lines of WARNING and above are kept (not written) while a run trains."""
    if not enabled:
        yield None
        return
    handler, root = _Collect(), logging.getLogger()
    logging.captureWarnings(True)
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        logging.captureWarnings(False)


def check_out_folder(out: str | Path) -> Path:
    """``seqlab compare --out``: a new or empty folder, or one an earlier compare made (it holds ``runs/``: its
    finished runs are reused). A folder of other files is refused before any work, since a compare writes
    table.md, results.json, report.html and plots there; a file in the way is named."""
    if not str(out).strip():
        raise ValueError("--out is empty: give a folder, e.g. runs/compare")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"--out {out} is a file; a compare writes a folder (table.md, report.html, plots, runs/)"
        )
    from seqlab.outfiles import nearest_existing

    if not (parent := nearest_existing(path)).is_dir():
        raise ValueError(f"--out {out}: {parent} is a file, not a folder")
    if path.is_dir() and any(path.iterdir()) and not (path / "runs").is_dir():
        raise ValueError(
            f"--out {out} holds files but no earlier compare (no runs/ folder); a compare writes table.md, "
            "results.json, report.html and plots there, and seqlab never writes over a user's files: choose a "
            f"new or empty folder (e.g. {path.with_name(path.name + '-compare')})"
        )
    return path


def write_settings(
    out_dir: str | Path, suite, mixers: list[str] | None = None, jobs: int | None = None
) -> Path:
    """``settings.json``: the suite (a :class:`seqlab.lab.suite.Suite`), mixers, jobs and this machine."""
    import torch

    from seqlab.lab.report import cpu_name
    from seqlab.training.checkpoint import write_text_atomic

    machine = {
        "CPU": cpu_name(),
        "threads (speed and memory)": torch.get_num_threads(),
        "torch": torch.__version__,
        "Python": platform.python_version(),
        "platform": platform.platform(),
    }
    meta = {"suite": dataclasses.asdict(suite), "mixers": mixers, "jobs": jobs, "machine": machine}
    path = Path(out_dir) / "settings.json"
    write_text_atomic(path, json.dumps({k: v for k, v in meta.items() if v is not None}, indent=1))
    return path
