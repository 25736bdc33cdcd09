"""seqlab.training.threads: fewer threads while other processes hold cores, from /proc readings (injected here)."""

from __future__ import annotations

import pytest
import torch

from seqlab.training.threads import ThreadGovernor, cpu_seconds, governor_for


class Machine:
    """A fake clock and /proc: ``run(seconds, others, mine)`` advances time and both busy counters."""

    def __init__(self):
        self.t, self.busy, self.mine = 0.0, 0.0, 0.0

    def run(self, seconds: float, others: float, mine: float = 2.0) -> None:
        self.t += seconds
        self.busy += seconds * (others + mine)
        self.mine += seconds * mine

    def sample(self):
        return self.busy, self.mine


def test_two_agreeing_readings_change_the_count_and_quiet_restores_it(monkeypatch):
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    m = Machine()
    g = ThreadGovernor(threads=2, interval=2.0, sample=m.sample, clock=lambda: m.t)
    assert g.active and g.tick() == 2
    m.run(1.0, others=1.0)
    assert g.tick() == 2 and set_to == []  # before the interval: no reading
    m.run(1.5, others=1.0)
    assert g.tick() == 2 and set_to == []  # one reading of a busy core: a moment, not yet a change
    m.run(2.0, others=1.0)
    assert g.tick() == 1 and set_to == [1]  # two: one thread
    m.run(2.0, others=0.3)  # under half a core: a core is free again (one reading: not yet)
    assert g.tick() == 1
    m.run(2.0, others=0.2)
    assert g.tick() == 2 and set_to == [1, 2]
    m.run(2.0, others=1.0)
    m.run(0.0, others=0.0)
    assert g.tick() == 2  # a single busy reading between quiet ones changes nothing
    m.run(2.0, others=0.0)
    assert g.tick() == 2 and set_to == [1, 2]
    m.run(2.0, others=5.0)
    g.tick()
    m.run(2.0, others=5.0)
    assert g.tick() == 1  # never below one thread
    g.restore()
    assert set_to[-1] == 2 and g.now == 2


def test_inactive_where_there_is_nothing_to_give_up_or_nothing_to_read(monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (_ for _ in ()).throw(AssertionError(n)))
    m = Machine()
    for g in (
        ThreadGovernor(threads=1, sample=m.sample, clock=lambda: m.t),  # one thread: nothing to give up
        ThreadGovernor(threads=2, sample=lambda: None, clock=lambda: m.t),  # no /proc
    ):
        for _ in range(4):
            m.run(3.0, others=2.0)
            assert g.tick() == g.most
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="threads must be a positive integer or None"):
            ThreadGovernor(threads=bad, sample=m.sample, clock=lambda: m.t)
    cpu, gpu = torch.device("cpu"), torch.device("meta")
    assert not governor_for(4, cpu, 1).active  # train.threads pins the count
    assert not governor_for(None, gpu, 1).active and not governor_for(None, cpu, 2).active


def test_cpu_seconds_reads_this_machine():
    reading = cpu_seconds()
    if reading is None:  # not Linux
        return
    busy, mine = reading
    x = torch.randn(256, 256)
    for _ in range(200):
        x = torch.tanh(x @ x)
    busy2, mine2 = cpu_seconds()
    assert mine2 > mine and busy2 >= busy and busy2 > 0


def test_more_threads_than_the_machine_has_are_refused_with_its_count(monkeypatch):
    import os

    from seqlab.training import TrainConfig

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert TrainConfig(threads=4).threads == 4
    with pytest.raises(ValueError, match=r"train.threads=1000 is more than this machine's 4 CPU threads"):
        TrainConfig(threads=1000)


def test_a_seed_past_64_bits_is_refused_by_name():
    import argparse

    from seqlab.run import seed
    from seqlab.training import TrainConfig

    assert TrainConfig(seed=2**63 - 1).seed == 2**63 - 1 and seed("7") == 7
    for bad in (2**63, 10**23, -1):
        with pytest.raises(ValueError, match=r"train.seed must be an integer from 0 to 2\*\*63 - 1"):
            TrainConfig(seed=bad)
        with pytest.raises(argparse.ArgumentTypeError, match="an integer from 0"):
            seed(str(bad))
