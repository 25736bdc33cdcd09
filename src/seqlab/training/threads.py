"""Fewer threads while other processes hold cores: CPU training that stays fast on a busy machine.

torch runs each CPU operator on an OpenMP team of ``torch.get_num_threads()`` threads that meet at a barrier
when it ends, and a thread that arrives first spins there. When another process holds one of the cores, a team
member is off the CPU and every operator waits for the scheduler to bring it back: measured on a 2-core Intel
Xeon with one busy process beside it (``benchmarks/bench_busy_machine.py``), steps took 3.6-17× their quiet
time on two threads, and 0.9-1.1× on one thread. A team no larger than the idle cores does not wait.

:class:`ThreadGovernor` watches, every ``interval`` seconds, how much CPU the *other* processes use (the
machine's busy time from ``/proc/stat``, steal time included, less this process's own) and sets torch's thread
count to the cores they leave, between 1 and the count the run started with; a change takes two readings in a
row, and each is logged. The trainer ticks it between steps when ``train.threads`` is unset on a CPU run of one
process. A reduction sum split over fewer threads may differ in its last bits: pin ``train.threads`` for runs
that must repeat bit for bit under any load.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

__all__ = ["ThreadGovernor", "cpu_seconds", "governor_for"]

log = logging.getLogger("seqlab.train")


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds the whole machine has been busy, steal time included; CPU seconds of this process), or None
    where /proc cannot tell (another OS)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as f:
            mine = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, ValueError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    busy = sum(fields[:8]) - idle  # user, nice, system, idle, iowait, irq, softirq, steal (guest is in user)
    return busy / ticks, (int(mine[11]) + int(mine[12])) / ticks  # utime, stime of every thread


class ThreadGovernor:
    """Sets torch's thread count to the cores other processes leave (module docstring); :meth:`tick` between
    steps. ``sample`` and ``clock`` are for tests."""

    def __init__(
        self,
        threads: int | None = None,
        interval: float = 2.0,
        sample: Callable[[], tuple[float, float] | None] = cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
    ):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(
                f"threads must be a positive integer or None (torch's count now), got {threads!r}"
            )
        self.most = threads or torch.get_num_threads()
        self.now, self.interval, self.sample, self.clock = self.most, interval, sample, clock
        self.last = (clock(), sample())
        self.pending: int | None = None  # a new count seen once: set when the next reading agrees

    def restore(self) -> None:
        """Back to the count the run started with (the process goes on after training: eval, the lab)."""
        if self.now != self.most:
            torch.set_num_threads(self.most)
            self.now = self.most

    @property
    def active(self) -> bool:
        """Whether it can do anything: more than one thread to give up, and /proc to read."""
        return self.most > 1 and self.last[1] is not None

    def tick(self) -> int:
        """Read the machine when ``interval`` has passed and adjust; the thread count now."""
        t = self.clock()
        if not self.active or t - self.last[0] < self.interval:
            return self.now
        reading = self.sample()
        (t0, before), self.last = self.last, (t, reading)
        if reading is None or before is None:
            return self.now
        others = ((reading[0] - before[0]) - (reading[1] - before[1])) / (t - t0)  # cores busy with others
        want = max(1, min(self.most, self.most - round(others)))
        if want == self.now:
            self.pending = None
        elif want != self.pending:
            self.pending = want  # one reading is a moment: wait for the next to agree
        else:
            log.info(
                "other processes use %.1f core(s): training on %d thread(s) of %d (train.threads pins a count)",
                others,
                want,
                self.most,
            )
            torch.set_num_threads(want)
            self.now, self.pending = want, None
        return self.now


def governor_for(threads: int | None, device: torch.device, world_size: int) -> ThreadGovernor:
    """The trainer's governor: one that adapts when ``train.threads`` is unset on a CPU run of one process, else
    one that never changes anything (a pinned count, a GPU run, or ranks that share the cores by design)."""
    if threads or device.type != "cpu" or world_size > 1:
        return ThreadGovernor(threads=1)
    return ThreadGovernor()
