"""Ctrl-C during a compare's parallel runs: the queued runs never start, and a worker whose run a Ctrl-C
stopped starts no other (before, the pool's exit trained every queued run to its end)."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from seqlab.lab.records import check_not_stopped, stop_after_interrupt, stop_pool_on_interrupt


def test_ctrl_c_cancels_the_queued_runs_and_waits_for_the_running_one(tmp_path):
    pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    with pytest.raises(KeyboardInterrupt), pool, stop_pool_on_interrupt(pool):
        running = pool.submit(subprocess.call, ["sh", "-c", f"sleep 3; mkdir {tmp_path / 'running'}"])
        queued = [pool.submit(os.mkdir, str(tmp_path / f"queued{i}")) for i in range(4)]
        while not running.running():
            time.sleep(0.05)
        raise KeyboardInterrupt
    assert (
        tmp_path / "running"
    ).is_dir()  # a running run saves and stops on the same Ctrl-C: it is waited for
    started = sum((tmp_path / f"queued{i}").exists() for i in range(4))
    assert started <= 1, started  # the pool hands its worker one call ahead; the runs' check stops that one
    assert sum(f.cancelled() for f in queued) >= 3


def test_a_worker_whose_run_was_stopped_starts_no_other_run():
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        assert pool.submit(check_not_stopped).result() is None  # a fresh worker may start runs
        assert isinstance(pool.submit(stop_after_interrupt).exception(), KeyboardInterrupt)
        assert isinstance(pool.submit(check_not_stopped).exception(), KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        stop_after_interrupt()
    check_not_stopped()  # in the parent process (jobs=1, or a library user) a stop is not remembered
