"""Ctrl-C during training: finish the step, save, stop; a second Ctrl-C stops at once. SIGTERM and SIGHUP (kill,
a job scheduler's cancel, a closed terminal) are taken the same way: the steps since the last save are kept.

A KeyboardInterrupt raised in the middle of a step could land inside the optimizer's update and leave the
weights half-updated, which no checkpoint should hold. So while :meth:`Trainer.fit` runs, the first SIGINT only
sets a flag that the loop reads after each complete step; the loop then writes a checkpoint and returns.
A step of several batches (``train.grad_accum``) in one process reads the flag between its batches too and is
dropped there, before any update (``StopFlag.drops_steps``): a stop never waits for hundreds of batches. An
evaluation, which changes no weight, ends at the signal (``StopFlag.raising``): the step is saved with its
evaluation pending, and the resume records it first. The same signal again within ``REPEAT_S`` is the same stop.
The handler is installed only in the main thread (where Python delivers signals) and restored on the way out.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("seqlab.train")

__all__ = [
    "REPEAT_S",
    "STOP_SIGNALS",
    "StopDuringEval",
    "StopFlag",
    "repeats",
    "resume_hint",
    "signal_name",
    "stop_on_interrupt",
    "stops_taken",
]


STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # the ones this platform has are handled
_HINTS = ["continue with the same command and --resume"]  # how a stopped run with a run folder continues
REPEAT_S = 1.0
"""A stop signal this soon after the first is the same stop, not a second one: ``timeout`` sends its SIGTERM to
the command and then to its process group, systemd and job schedulers to every process of the job."""
# every stop signal a training loop of this process took: (signum, monotonic)
_TAKEN: list[tuple[int, float]] = []


def signal_name(signum: int | None) -> str:
    """How a stop signal is named to the user: 'Ctrl-C' (SIGINT, or None), 'SIGTERM', 'SIGHUP'."""
    return "Ctrl-C" if signum in (None, signal.SIGINT) else signal.Signals(signum).name


def repeats(first_at: float) -> bool:
    """Whether a stop signal now is the same stop as one taken at ``first_at`` (``time.monotonic()``)."""
    return time.monotonic() - first_at < REPEAT_S


def stops_taken() -> tuple[tuple[int, float], ...]:
    """The stop signals the training loops of this process took, in order, with the ``time.monotonic()`` each
    came at, even one that came during the last step (the run then ends as finished): a compare's worker that
    saw one starts no other run."""
    return tuple(_TAKEN)


@contextlib.contextmanager
def resume_hint(text: str) -> Iterator[None]:
    """Within it, a stopped run says ``text`` for how to continue it (a compare reruns, it has no --resume)."""
    _HINTS.append(text)
    try:
        yield
    finally:
        _HINTS.pop()


class StopDuringEval(BaseException):
    """Raised by the first stop signal inside :meth:`StopFlag.raising` (an evaluation: it changes no weight, so
    it may end anywhere). A BaseException, as KeyboardInterrupt is: no ``except Exception`` swallows it."""


class StopFlag:
    """Set by the first stop signal; read by the training loop between steps."""

    def __init__(self) -> None:
        self.set = False
        self.signum: int | None = None
        self.one_process = False  # a stop may cut work short only where no other rank must agree
        self.grad_accum = 1  # batches per step of the loop that reads the flag
        self._raising = False  # inside raising(): the first signal raises StopDuringEval

    @property
    def drops_steps(self) -> bool:
        """Whether the loop drops a step of several batches half-way rather than finish it."""
        return self.one_process and self.grad_accum > 1

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Within it (one process), a stop ends the work at once (StopDuringEval), one that came before it too."""
        if not self.one_process:
            yield
            return
        if self.set:
            raise StopDuringEval
        self._raising = True
        try:
            yield
        finally:
            self._raising = False

    @property
    def name(self) -> str:
        """How the stop is named to the user: 'Ctrl-C', 'SIGTERM', 'SIGHUP'."""
        return signal_name(self.signum)

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

    def second_stop(signum, frame) -> None:
        if signum == flag.signum and repeats(_TAKEN[-1][1]):
            return  # the same stop again (timeout's to the process group): not the second one
        for s, handler in previous.items():  # a second signal stops at once, as it would have
            signal.signal(s, handler)
        signal.raise_signal(signum)

    def first_stop(signum, frame) -> None:
        flag.set, flag.signum = True, signum
        _TAKEN.append((signum, time.monotonic()))
        for s in previous:
            signal.signal(s, second_stop)
        again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
        now = "dropping this step after its current batch" if flag.drops_steps else "finishing this step"
        if flag._raising:
            log.warning(
                f"{flag.name}: ending this evaluation, then saving a checkpoint (--resume evaluates first)"
            )
            raise StopDuringEval
        log.warning(f"{flag.name}: {now}, then saving a checkpoint ({again} again to stop at once)")

    for s in signums:
        signal.signal(s, first_stop)
    try:
        yield flag
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
