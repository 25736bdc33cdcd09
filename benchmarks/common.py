"""What the benchmarks share: contenders timed alternately in one process, and where a result file goes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from seqlab.lab.report import cpu_name, hardware_slug

RESULTS = Path(__file__).resolve().parent / "results"


def alternate(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function, ``repeats`` times, after one warm-up call each; the contenders' order
    reversed every other repeat, so that none always runs first (on a colder or warmer cache)."""
    names = list(fns)
    for f in fns.values():  # warm-up (and any kernel's first load)
        f()
    times = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t)
    return times


def result_file(kind: str) -> Path:
    """benchmarks/results/<kind>-<cpu>-torch<version>.md, its folder made if missing: one file per CPU."""
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / f"{kind}-{hardware_slug(cpu_name(), 2)}-torch{torch.__version__.split('+')[0]}.md"


def report(kind: str, text: str, quick: bool) -> None:
    """Print a benchmark's markdown; unless ``quick`` (a smoke run), also write it to ``result_file(kind)``."""
    print(text)
    if not quick:
        out = result_file(kind)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
