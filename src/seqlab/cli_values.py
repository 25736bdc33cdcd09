"""Command-line value types the CLI modules share beyond :mod:`seqlab.run`'s: a bounded integer."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["int_in"]


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``, both included, refused at parse time otherwise
    (a size with no upper bound ran for minutes, or out of memory, before saying anything)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"must be an integer from {low:,} to {high:,}, got {text!r}")
        if value < low:  # worded as run.int_at_least's
            raise argparse.ArgumentTypeError(f"must be an integer >= {low:,}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be an integer <= {high:,}, got {text!r}")
        return value

    return parse
