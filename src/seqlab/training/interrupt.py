"""Ctrl-C during training: finish the step, save, stop; a second Ctrl-C stops at once. SIGTERM and SIGHUP (kill,
a job scheduler's cancel, a closed terminal) are taken the same way: the steps since the last save are kept.

A KeyboardInterrupt raised in the middle of a step could land inside the optimizer's update and leave the
weights half-updated, which no checkpoint should hold. So while :meth:`Trainer.fit` runs, the first SIGINT only
sets a flag that the loop reads after each complete step; the loop then writes a checkpoint and returns.
A step of several batches (``train.grad_accum``) in one process reads the flag between its batches too and is
dropped there, before any update (``StopFlag.drops_steps``): a stop never waits for hundreds of batches.
The handler is installed only in the main thread (where Python delivers signals) and restored on the way out.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger("seqlab.train")

__all__ = ["STOP_SIGNALS", "StopFlag", "resume_hint", "stop_on_interrupt"]


STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # the ones this platform has are handled
_HINTS = ["continue with the same command and --resume"]  # how a stopped run with a run folder continues


@contextlib.contextmanager
def resume_hint(text: str) -> Iterator[None]:
    """Within it, a stopped run says ``text`` for how to continue it (a compare reruns, it has no --resume)."""
    _HINTS.append(text)
    try:
        yield
    finally:
        _HINTS.pop()


class StopFlag:
    """Set by the first stop signal; read by the training loop between steps."""

    def __init__(self) -> None:
        self.set = False
        self.signum: int | None = None
        self.drops_steps = False  # the loop drops a step of several batches half-way rather than finish it

    @property
    def name(self) -> str:
        """How the stop is named to the user: 'Ctrl-C', 'SIGTERM', 'SIGHUP'."""
        return "Ctrl-C" if self.signum in (None, signal.SIGINT) else signal.Signals(self.signum).name

    def say_stopped(self, step: int, out_dir) -> None:
        saved = f", saved in {out_dir}; {_HINTS[-1]}" if out_dir else ""
        log.warning("stopped by %s at step %d%s", self.name, step, saved)

    def summary(self) -> dict:
        """The run summary's fields: interrupted, and the signal unless Ctrl-C (the command exits 128 + its
        number, as a shell reports a command a signal stopped)."""
        return {"interrupted": True} | ({} if self.name == "Ctrl-C" else {"signal": self.name})


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[StopFlag]:
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    signums = [getattr(signal, n) for n in STOP_SIGNALS if hasattr(signal, n)]
    previous = {s: signal.getsignal(s) for s in signums}

    def first_stop(signum, frame) -> None:
        flag.set, flag.signum = True, signum
        for s, handler in previous.items():  # a second signal stops at once
            signal.signal(s, handler)
        again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
        now = "dropping this step after its current batch" if flag.drops_steps else "finishing this step"
        log.warning(f"{flag.name}: {now}, then saving a checkpoint ({again} again to stop at once)")

    for s in signums:
        signal.signal(s, first_stop)
    try:
        yield flag
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
