"""Ctrl-C during training: finish the step, save, stop; a second Ctrl-C stops at once.

A KeyboardInterrupt raised in the middle of a step could land inside the optimizer's update and leave the
weights half-updated, which no checkpoint should hold. So while :meth:`Trainer.fit` runs, the first SIGINT only
sets a flag that the loop reads after each complete step; the loop then writes a checkpoint and returns.
The handler is installed only in the main thread (where Python delivers signals) and restored on the way out.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger("seqlab.train")

__all__ = ["StopFlag", "stop_on_interrupt"]


class StopFlag:
    """Set by the first Ctrl-C; read by the training loop between steps."""

    def __init__(self) -> None:
        self.set = False


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[StopFlag]:
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGINT)

    def first_interrupt(signum, frame) -> None:
        flag.set = True
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C interrupts at once
        log.warning("Ctrl-C: finishing this step, then saving a checkpoint (Ctrl-C again to stop at once)")

    signal.signal(signal.SIGINT, first_interrupt)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
