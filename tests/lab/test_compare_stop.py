"""Stopping a compare: no worker outlives it, the runs save, and the signal is named; the compare's own refusals
(--remeasure with nothing to keep, --minutes out of range) and its report files set aside, never overwritten."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from seqlab.lab import records, translation

# A compare's training in miniature: translation.train_all (the pool every timed suite trains through) with a
# planner of tiny runs, each long enough to be stopped half-way.
SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from seqlab.lab.translation import train_all

    def planned(label, fields, minutes, seed):
        train = {"steps": 100000, "log_every": 2, "eval_every": 0, "save_every": 100000, "warmup_steps": 2,
                 "eval_batches": 1, "progress": False, "device": "cpu", "seed": seed}
        task = {"name": "adding", "seq_len": 8, "batch_size": 4, "seed": seed}
        return {"model": {"name": "test-lstm-lm"}, "task": task, "train": train}

    if __name__ == "__main__":
        try:
            train_all({"a": {}, "b": {}, "c": {}}, Path(sys.argv[1]), 0.0, 0, 2, planned)
        except KeyboardInterrupt as e:
            print("stopped by", getattr(e, "signal_name", "Ctrl-C"), flush=True)
            raise SystemExit(getattr(e, "exit_status", 130))
    """
)


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, state) of every process /proc shows."""
    found = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(d.name)] = (int(fields[1]), fields[19], fields[0])
    return found


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every process below ``root`` (its workers and their helpers)."""
    table, found, todo = _processes(), {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, start, _) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _alive(procs: dict[int, str]) -> list[int]:
    table = _processes()
    return [pid for pid, start in procs.items() if pid in table and table[pid][1:] != (start, "Z")]


def _alive_after(procs: dict[int, str], seconds: float) -> list[int]:
    """Those of ``procs`` still running once they all ended or ``seconds`` passed."""
    deadline = time.time() + seconds
    while _alive(procs) and time.time() < deadline:
        time.sleep(0.1)
    return _alive(procs)


def _training(out: Path, label: str) -> bool:
    metrics = out / "runs" / label / "metrics.jsonl"
    return metrics.is_file() and len(metrics.read_text().splitlines()) >= 2


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """The miniature compare, returned once both its workers train."""
    (tmp_path / "stopme.py").write_text(SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "stopme.py", str(out)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group of its own, as `timeout` makes
    )
    deadline = time.time() + 60
    while (
        time.time() < deadline and proc.poll() is None and not (_training(out, "a") and _training(out, "b"))
    ):
        time.sleep(0.1)
    assert proc.poll() is None and _training(out, "a") and _training(out, "b"), proc.communicate()[0]
    return proc, out


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the process table from /proc")
def test_sigterm_stops_every_worker_and_the_compare_exits_after_them(tmp_path):
    """`timeout` sends SIGTERM to the compare and then to its process group. Before, the compare died at once
    and a worker stayed alive for good (blocked on the dead parent's pipe, holding its run's .lock)."""
    proc, out = _start(tmp_path)
    below = _descendants(proc.pid)
    assert len(below) >= 2, below  # the two workers (and the resource tracker)
    try:
        proc.send_signal(signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGTERM)
        text = proc.communicate(timeout=60)[0]
        left = _alive_after(below, 10)  # the resource tracker ends once the compare has: a moment
        assert not left, f"left running: {left}\n{text}"
    finally:
        for pid in _alive(below):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in text, text
    for label in ("a", "b"):  # each running run finished its step and saved
        assert (out / "runs" / label / "latest").is_file(), text
    assert not (out / "runs" / "c" / "latest").exists()  # the queued run never started
    assert text.count("SIGTERM: stopping the compare") == 1  # the signal sent twice is one stop


def test_a_stop_carries_its_signal():
    from seqlab.lab.workers import Stopped, stop_after_interrupt

    with pytest.raises(Stopped) as stop:
        stop_after_interrupt({"interrupted": True, "signal": "SIGTERM"})
    assert stop.value.signal_name == "SIGTERM" and stop.value.exit_status == 143
    assert isinstance(stop.value, KeyboardInterrupt)  # what stops a compare, whatever the signal
    with pytest.raises(Stopped) as stop:
        stop_after_interrupt({"interrupted": True})
    assert stop.value.signal_name == "Ctrl-C" and stop.value.exit_status == 130


def test_remeasure_systems_refuses_a_folder_without_that_compare(tmp_path):
    from seqlab.lab.runner import Compare
    from seqlab.lab.suite import SUITES

    new = tmp_path / "new"
    with pytest.raises(ValueError, match=r"holds no earlier compare.*without --remeasure first"):
        Compare(new, SUITES["quick"], mixers=["gru"], remeasure=("systems",))
    assert not new.exists()  # refused before anything is written
    (tmp_path / "other" / "runs").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no run this compare trained"):
        Compare(tmp_path / "other", SUITES["quick"], mixers=["gru"], remeasure=("systems",))


@pytest.mark.parametrize("minutes", [1e9, 0.0, math.nan, math.inf])
def test_minutes_out_of_range_are_refused_before_any_work(tmp_path, monkeypatch, minutes):
    def no_work(*args, **kwargs):
        raise AssertionError("the suite started")

    monkeypatch.setattr(translation, "plan", no_work)
    with pytest.raises(ValueError, match=r"--minutes is each model's training time: .* at most 1440"):
        translation.compare_translation(tmp_path / "out", minutes=minutes)
    assert not (tmp_path / "out").exists()


def test_the_step_floor_is_said_when_it_applies(caplog):
    with caplog.at_level("WARNING", logger="seqlab.lab"):
        assert translation.floored_steps("Luong", 1e-9, 0.5) == 50
    assert "Luong: 1e-09 min fits 0 steps here (0.50 s a step); it trains the suite's minimum, 50 steps" in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="seqlab.lab"):
        assert translation.floored_steps("Luong", 10, 0.5) == 1200
    assert caplog.text == ""


def test_threads_are_each_runs_torch_threads(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(translation, "_train_one", lambda *args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        translation._run("Luong", {}, tmp_path, 1.0, 0, None, 2)
        translation._run("Luong", {}, tmp_path, 1.0, 0, None)
    finally:
        torch.set_num_threads(before)
    assert seen == [2, 1]  # given, else one thread: the suite's design
    with pytest.raises(ValueError, match="--threads is each run's torch threads"):
        translation.compare_translation(tmp_path / "out", minutes=1.0, threads=0)


def test_a_rewritten_report_file_sets_the_earlier_one_aside(tmp_path, caplog):
    rows = [
        {
            "label": label,
            "fields": {},
            "params": 1,
            "steps": 1,
            "train_minutes": 1.0,
            "bleu": 1.0,
            "chrf": 1.0,
            "buckets": {},
        }
        for label in ("a", "b")
    ]
    table = translation.write_table(tmp_path, rows, 1.0)
    table.write_text(table.read_text() + "\nMY NOTES\n")
    with caplog.at_level("INFO", logger="seqlab.lab"):
        translation.write_table(tmp_path, rows, 2.0)
    assert "MY NOTES" in (tmp_path / "table.md.prev").read_text()
    assert "kept the earlier table.md as table.md.prev" in caplog.text
    assert "2 min of training" in table.read_text()
    translation.write_table(tmp_path, rows, 2.0)  # the same contents: nothing to keep
    translation.write_table(tmp_path, rows, 3.0)
    assert "2 min of training" in (tmp_path / "table.md.prev-2").read_text()
    assert not (tmp_path / "table.md.prev-3").exists()
    path = records.write_output(tmp_path / "report.html", "<p>new</p>")
    assert path.read_text() == "<p>new</p>" and not (tmp_path / "report.html.prev").exists()


def test_a_rerun_keeps_the_earlier_plots_that_differ(tmp_path, caplog):
    """The plots were overwritten by a rerun while the tables beside them were kept: now each plot that comes
    out otherwise is kept as NAME.prev first; one that comes out the same is not copied."""
    from seqlab.viz.figures import pyplot

    def plot(ys):
        fig, ax = pyplot().subplots()
        ax.plot(ys)
        return records.write_figure(fig, tmp_path / "throughput.png")

    first = plot([1, 2, 3]).read_bytes()
    plot([1, 2, 3])
    assert not (tmp_path / "throughput.png.prev").exists()  # the same plot: nothing to keep
    with caplog.at_level("INFO", logger="seqlab.lab"):
        plot([3, 2, 1])
    assert (tmp_path / "throughput.png.prev").read_bytes() == first
    assert (tmp_path / "throughput.png").read_bytes() != first
    assert "kept the earlier throughput.png as throughput.png.prev" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["throughput.png", "throughput.png.prev"]


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the process table from /proc")
def test_workers_of_a_killed_compare_save_and_exit(tmp_path):
    """SIGKILL (the OOM killer) gives the compare no chance to hand anything on: each worker sees its parent
    gone, stops its run as a SIGTERM would (saved), and exits."""
    proc, out = _start(tmp_path)
    below = _descendants(proc.pid)
    try:
        proc.kill()
        proc.wait(timeout=10)
        left = _alive_after(below, 60)
        assert not left, f"left running: {left}"
    finally:
        for pid in _alive(below):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
    for label in ("a", "b"):
        assert (out / "runs" / label / "latest").is_file()
