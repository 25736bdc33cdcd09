"""A compare's worker processes, and how a stop signal reaches them.

A compare trains its runs in spawned worker processes (a ``ProcessPoolExecutor`` started with
:func:`start_worker`). Each worker runs in a session of its own, so that a Ctrl-C at the terminal, the SIGTERM
that ``timeout`` or a job scheduler sends to the process group, or a closed terminal's SIGHUP reaches the
compare's process only. That process hands the signal on to every worker, once (:func:`stop_pool_on_interrupt`;
a worker that got it twice, from the group and from its parent, would stop at once and lose its steps since
the last save; a repeat within :data:`~seqlab.training.interrupt.REPEAT_S` is taken as the same stop). A
worker then stops as ``seqlab train`` does: its run finishes the step, saves where its suite saves, and stops;
a run still being set up stops at once, and a worker between runs starts no other. The compare waits until
every worker has exited and then raises :class:`Stopped`. The same signal again ends the workers at once
(SIGKILL).

A compare process that dies without a word (SIGKILL, the OOM killer) cannot hand anything on: each worker
watches its parent and, once it is gone, stops its run the same way and exits. No worker outlives its compare
(before, one blocked for good on the dead parent's pipe, holding its run's ``.lock`` and the caller's output).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from typing import Any, NoReturn

from seqlab.training.interrupt import STOP_SIGNALS, repeats, signal_name, stops_taken

log = logging.getLogger("seqlab.lab")

PARENT_GONE_GRACE_S = 120.0
"""Once its compare is gone, the seconds a worker gives its run to finish the step and save before it exits."""

_SIGNALS = tuple(getattr(signal, n) for n in STOP_SIGNALS if hasattr(signal, n))
_stopped_by: int | None = None  # in a worker: the signal that stopped it; no run starts there any more
_stopped_at = 0.0  # and when (time.monotonic())
_in_pool_worker = False  # this process is a compare's worker, started by start_worker
_idle = threading.Event()  # in a worker: no run is being set up or trained
_idle.set()


class Stopped(KeyboardInterrupt):
    """A compare (or one of its runs) stopped by a signal: ``signal_name`` is 'Ctrl-C', 'SIGTERM' or 'SIGHUP',
    and ``exit_status`` what a shell reports for a command that signal stopped (128 + its number)."""

    def __init__(self, signum: int | None = None):
        self.signum = int(signum or signal.SIGINT)
        super().__init__(f"stopped by {self.signal_name}")

    @property
    def signal_name(self) -> str:
        return signal_name(self.signum)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def __reduce__(self):  # back from a worker process with its signal
        return Stopped, (self.signum,)


def check_not_stopped() -> None:
    """At the start of a run in a compare's worker: :class:`Stopped` once a stop signal has reached it. (The
    pool hands a worker one run beyond those running before the parent can cancel it; it must not train.)"""
    if _stopped_by is not None:
        raise Stopped(_stopped_by)


def stop_after_interrupt(summary: dict[str, Any] | None = None) -> NoReturn:
    """A run's trainer stopped on a signal (``summary["signal"]``, absent for Ctrl-C): the compare stops too,
    this run unfinished; in a worker process, no later run starts there."""
    global _stopped_by
    name = (summary or {}).get("signal")
    signum = signal.Signals[name] if name else signal.SIGINT
    if multiprocessing.parent_process() is not None:
        _stopped_by = signum
    raise Stopped(signum)


# ---- in a worker --------------------------------------------------------------------------------------------


def start_worker(then: Callable[[], None] | None = None) -> None:
    """A compare pool's initializer: this worker in a session of its own (a stop signal comes from its parent
    only), its stop signals handled as below, a thread watching the parent; then ``then()``."""
    global _in_pool_worker
    _in_pool_worker = True
    with contextlib.suppress(OSError):  # already a session leader
        os.setsid()
    _handle(_between_runs)
    threading.Thread(target=_watch_parent, name="seqlab-watch-parent", daemon=True).start()
    if then is not None:
        then()


def _handle(handler) -> None:
    for s in _SIGNALS:
        signal.signal(s, handler)


def _repeat() -> bool:
    """Whether a stop signal now repeats the last one this worker took (:data:`REPEAT_S`): the same stop."""
    taken = stops_taken()
    return repeats(max(_stopped_at, taken[-1][1] if taken else 0.0))


def _between_runs(signum: int, frame) -> None:
    """A stop signal while no trainer runs: no run starts here any more, and one being set up (its data, its
    calibration: nothing to save yet) stops now; a second one (not a repeat) ends the worker at once."""
    global _stopped_by, _stopped_at
    if _repeat():
        return
    if _stopped_by is not None:
        os._exit(128 + signum)
    _stopped_by, _stopped_at = signum, time.monotonic()
    if not _idle.is_set():
        raise Stopped(signum)


def _at_once(signum: int, frame) -> None:
    """A stop signal after the one the trainer took (it restores this handler): the run stops now, unsaved
    (a repeat of the trainer's signal is the same stop)."""
    global _stopped_by, _stopped_at
    if _repeat():
        return
    _stopped_by, _stopped_at = signum, time.monotonic()
    raise Stopped(signum)


@contextlib.contextmanager
def worker_run() -> Iterator[None]:
    """Around one run's whole work (set-up and training): a worker stopped before it starts none, and a worker
    whose parent is gone waits for the run to stop. Any process: a stop is only checked."""
    check_not_stopped()
    _idle.clear()
    try:
        yield
    finally:
        _idle.set()


@contextlib.contextmanager
def quiet_train_log() -> Iterator[None]:
    """The trainer's log (``seqlab.train``) at WARNING for the duration, then back at its level: a suite shows
    one progress line per run, not each run's evaluation lines."""
    train_log = logging.getLogger("seqlab.train")
    level = train_log.level
    train_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        train_log.setLevel(level)


@contextlib.contextmanager
def training() -> Iterator[None]:
    """Around a trainer's ``fit`` in a worker (a no-op elsewhere): a stop signal during the set-up stops the
    run here, before its first step; the trainer takes the first one that comes while it trains (finish the
    step, save, stop), the next stops the run at once; and a stop the trainer took ends this worker's runs,
    even one that came during the last step."""
    global _stopped_by
    if not _in_pool_worker:
        yield
        return
    check_not_stopped()
    taken = len(stops_taken())
    _handle(_at_once)
    try:
        yield
    finally:
        _handle(_between_runs)
        if (new := stops_taken()[taken:]) and _stopped_by is None:
            _stopped_by = new[0][0]


def _watch_parent() -> None:
    """Wait for the compare process to end; if it ends while this worker lives, the worker was never told:
    stop the run as a SIGTERM would (finish the step, save), then exit."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()  # returns once the parent's end of the sentinel pipe is closed: it exited
    if not _idle.is_set():
        os.kill(os.getpid(), signal.SIGTERM)
        _idle.wait(PARENT_GONE_GRACE_S)
    os._exit(1)


# ---- in the compare's process -------------------------------------------------------------------------------


def _workers(pool) -> list[multiprocessing.Process]:
    """The pool's worker processes (read before its shutdown forgets them)."""
    return list((pool._processes or {}).values())


def _hand_on(workers: list[multiprocessing.Process], signum: int) -> None:
    for p in workers:
        with contextlib.suppress(ProcessLookupError, TypeError):  # gone already, or not started
            os.kill(p.pid, signum)


@contextlib.contextmanager
def _stop_handlers(handler) -> Iterator[None]:
    """``handler`` for the stop signals while the block runs, in the main thread (where Python takes them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    _handle(handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def stop_pool_on_interrupt(pool):
    """While a compare's worker pool (started with :func:`start_worker`) trains: the first stop signal is
    handed on to every worker, the queued runs never start, the running ones finish their step, save where
    their suite saves and stop, and this process waits until every worker has exited before :class:`Stopped`
    goes on; the same signal again ends the workers at once. A run that stopped in a worker (a signal sent to
    it alone) stops the others the same way. (The pool's own exit would wait for every queued run to train to
    its end, and a process killed by SIGTERM without a handler left its workers running for good.)"""
    got: list[int] = []
    first_at = [0.0]

    def on_signal(signum: int, frame) -> None:
        if got and repeats(first_at[0]):
            return  # the same stop, sent twice (timeout: to this process, then to its group)
        got.append(signum)
        first_at[0] = time.monotonic()
        workers = _workers(pool)
        if len(got) > 1:
            log.warning("%s again: ending %d worker(s) at once", signal_name(signum), len(workers))
            for p in workers:
                p.kill()
            return
        again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
        log.warning(
            "%s: stopping the compare: the running runs finish their step and stop, the queued ones never "
            "start (%s again to stop them at once)",
            signal_name(signum),
            again,
        )
        _hand_on(workers, signum)
        raise Stopped(signum)

    with _stop_handlers(on_signal):
        try:
            yield pool
        except KeyboardInterrupt as stop:
            workers = _workers(pool)
            if not got and isinstance(stop, Stopped):  # a run stopped in one worker: the others stop too
                _hand_on(workers, stop.signum)
            try:
                pool.shutdown(wait=True, cancel_futures=True)
            except KeyboardInterrupt:  # a second Ctrl-C where the handler is not this one's
                for p in workers:
                    p.kill()
            _wait_for(workers)
            if got:
                raise Stopped(got[0]) from None
            raise


def _wait_for(workers: list[multiprocessing.Process]) -> None:
    """Return once every one of ``workers`` has exited (its sentinel is ready)."""
    pending = [p.sentinel for p in workers]
    while pending:
        done = wait(pending)
        pending = [s for s in pending if s not in done]


__all__ = [
    "Stopped",
    "check_not_stopped",
    "start_worker",
    "stop_after_interrupt",
    "stop_pool_on_interrupt",
    "training",
    "worker_run",
]
