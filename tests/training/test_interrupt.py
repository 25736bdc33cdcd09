"""Ctrl-C during `seqlab train`: the step finishes, a checkpoint is written, the command exits with 130 and says
how to continue; --resume then gives the uninterrupted run's loss records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from seqlab.cli import main

ARGS = [
    "train",
    "--model.name=test-lstm-lm",
    "--task.name=adding",
    "--task.seq_len=8",
    "--task.batch_size=4",
    "--train.log_every=3",
    "--train.eval_every=0",
    "--train.eval_batches=1",
    "--train.save_every=100000",
    "--train.warmup_steps=2",
    "--train.threads=1",
    "--train.progress=false",
]


STEPS = 400  # long enough that the interrupt lands in the middle (it comes after about 10 steps)


def _losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["split"] == "train"]


def _training(out):
    """A `seqlab train` process into ``out``, returned once it has logged three train records."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqlab.cli", *ARGS, f"--train.steps={STEPS}", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and len(_losses(out)) >= 3):
        time.sleep(0.05)
    return proc


def test_ctrl_c_saves_and_resume_continues_exactly(tmp_path, capsys):
    out = tmp_path / "run"
    proc = _training(out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "stopped by Ctrl-C at step" in err and "--resume" in err
    assert "Traceback" not in err
    step = int((out / "latest").read_text().strip().rsplit("-", 1)[1])
    assert 9 <= step < STEPS
    assert main([*ARGS, f"--train.steps={STEPS}", "--out", str(out), "--resume"]) == 0
    fresh = tmp_path / "fresh"
    assert main([*ARGS, f"--train.steps={STEPS}", "--out", str(fresh)]) == 0
    assert _losses(out) == _losses(fresh)  # the interrupt left no trace in the log


def test_sigterm_and_sighup_save_like_ctrl_c(tmp_path):
    """kill, a job scheduler's cancel or a closed terminal: the steps since the last save are kept, the command
    says so, and exits 128 + the signal's number."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        out = tmp_path / sig.name
        proc = _training(out)
        proc.send_signal(sig)
        summary, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig, err
        assert f"stopped by {sig.name} at step" in err and "--resume" in err and "Traceback" not in err
        assert json.loads(summary.strip().splitlines()[-1])["signal"] == sig.name
        step = int((out / "latest").read_text().strip().rsplit("-", 1)[1])
        assert 9 <= step < STEPS  # saved there, not at the start (save_every is 100,000)


def test_a_stopped_run_says_how_to_continue_it_where_it_runs(tmp_path, caplog):
    import logging

    from seqlab.training.interrupt import StopFlag, resume_hint

    flag = StopFlag()
    with caplog.at_level(logging.WARNING, logger="seqlab.train"):
        flag.say_stopped(7, tmp_path)
        with resume_hint("the same seqlab compare continues it"):
            flag.say_stopped(8, tmp_path)
        flag.say_stopped(9, None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"stopped by Ctrl-C at step 7, saved in {tmp_path}; continue with the same command and --resume",
        f"stopped by Ctrl-C at step 8, saved in {tmp_path}; the same seqlab compare continues it",
        "stopped by Ctrl-C at step 9",
    ]
