"""What the benchmarks share: contenders timed alternately in one process, the malloc setting they run under,
and where a result file goes."""

from __future__ import annotations

import argparse
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


def add_keep_heap(p: argparse.ArgumentParser, kind: str) -> None:
    """The ``--keep-heap`` option of a benchmark comparing libraries in one process."""
    p.add_argument(
        "--keep-heap",
        action="store_true",
        help="both libraries keep freed memory (seqlab.training.allocator: what seqlab train sets; glibc's "
        f"defaults re-map freed temporaries at every step); writes {kind}-keep-heap-<cpu>-...md",
    )


def keep_heap(p: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """Apply ``--keep-heap`` if given (an error where glibc's mallopt is missing); the result file's line saying
    which malloc setting the run had."""
    from seqlab.training.allocator import keep_freed_memory

    if not args.keep_heap:
        return "malloc: glibc's defaults (freed memory returned to the OS, re-faulted on reuse)."
    if not keep_freed_memory():
        p.error("--keep-heap needs Linux with glibc (mallopt)")
    return "malloc: freed memory kept for both libraries (`--keep-heap`, what `seqlab train` sets)."
