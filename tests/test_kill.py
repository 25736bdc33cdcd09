"""kill -9 while checkpoints are saved: real ``seqlab train`` processes, SIGKILLed at random moments after a save
has begun, then started again.

After every kill: ``latest`` names a complete checkpoint that loads, every checkpoint the manifest names and
that is on disk verifies, the next start removes every temporary name the kill left and resumes, and a user's
own files in --out and in checkpoints/ are untouched. At the end the run finishes, and its metrics.jsonl equals
an uninterrupted run's (timings aside). The default run kills 3 processes; ``-m slow`` kills 54, over the LSTM,
GPT and Mamba test presets.
"""

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from seqlab.cli import main
from seqlab.training import checkpoint as ckpt
from seqlab.training import manifest

BASE = [
    "train",
    "--task.name=adding",
    "--task.seq_len=8",
    "--task.batch_size=4",
    "--train.save_every=1",
    "--train.log_every=3",
    "--train.eval_every=4",
    "--train.eval_batches=1",
    "--train.warmup_steps=2",
    "--train.keep_checkpoints=2",
    "--train.threads=1",
    "--train.progress=false",
]
MODELS = {"test-lstm-lm": [], "test-gpt": ["--model.tie_weights=false"], "test-mamba": []}
USER_FILES = {
    "notes.txt": "mine",
    "checkpoints/notes.txt": "mine too",
    "checkpoints/step-0-my-notes/README": "kept by hand",
}


def _args(model, steps, out, resume=False, *extra):
    resume_flag = ["--resume"] if resume else []
    return [
        *BASE,
        f"--model.name={model}",
        *MODELS[model],
        f"--train.steps={steps}",
        "--out",
        str(out),
        *resume_flag,
        *extra,
    ]


def _launch(args, log):
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "seqlab.cli", *args], stdout=subprocess.DEVNULL, stderr=err
        )


def _temp_saves(root):
    try:
        return {n for n in os.listdir(root) if n.startswith(".tmp-step-")}
    except FileNotFoundError:
        return set()


def _kill_while_saving(proc, root, rng) -> bool:
    """SIGKILL ``proc`` a random 0-250 ms after one of its saves has begun; False when it finished first."""
    before = _temp_saves(root)
    while proc.poll() is None and not (_temp_saves(root) - before):
        time.sleep(0.002)
    time.sleep(rng.uniform(0.0, 0.25))
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


def _phase(out):
    """Where the kill landed, from what it left: a name for the tally of the slow test."""
    root = out / "checkpoints"
    names = set(os.listdir(root)) if root.is_dir() else set()
    absent = [n for n in manifest.read_manifest(root) if n not in names]
    if any(n.startswith(".tmp-step-") for n in names):
        return "writing files" if not absent else "between manifest and rename"
    if any(n.startswith(".old-step-") for n in names):
        return "replacing or pruning"
    return "between saves" if (out / "latest").exists() else "before the first checkpoint"


def _check_intact(out):
    """latest loads and verifies; every checkpoint the manifest names that is on disk verifies; user files."""
    if (out / "latest").exists():
        ckpt.check_complete(ckpt.resolve_checkpoint(out))
        ckpt.load_model(out)
    for name in manifest.read_manifest(out / "checkpoints"):
        if (out / "checkpoints" / name).exists():
            ckpt.check_complete(out / "checkpoints" / name)
    for rel, text in USER_FILES.items():
        assert (out / rel).read_text(encoding="utf-8") == text, rel


def _leftovers(out):
    return [
        p.name
        for d in (out, out / "checkpoints")
        if d.is_dir()
        for p in d.iterdir()
        if p.name.startswith(".") and p.name != ".lock"  # the run's lock file stays (it only holds a pid)
    ]


def _records(out):
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [
        {k: v for k, v in json.loads(ln).items() if k not in ("tokens_per_s", "elapsed_s")} for ln in lines
    ]


def _kill_and_resume(tmp_path, model, steps, kills, seed):
    """Kill ``kills`` processes of one run while they save, check after each, finish it; the phases hit."""
    rng, out, phases = random.Random(seed), tmp_path / "run", collections.Counter()
    for rel, text in USER_FILES.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text, encoding="utf-8")
    for i in range(kills):
        resume = (out / "latest").exists()
        proc = _launch(_args(model, steps, out, resume), tmp_path / "stderr.txt")
        assert _kill_while_saving(proc, out / "checkpoints", rng), f"kill {i}: the run finished first"
        phases[_phase(out)] += 1
        _check_intact(out)
        if (
            out / "latest"
        ).exists():  # the next start, as a no-op resume: it clears the leftovers and resumes
            step = ckpt.load_trainer_state(out)["step"]
            assert main(_args(model, step, out, True)) == 0
            assert _leftovers(out) == [], f"kill {i}"
            _check_intact(out)
    assert main(_args(model, steps, out, (out / "latest").exists())) == 0  # the last start runs to the end
    _check_intact(out)
    assert _leftovers(out) == []
    assert main(_args(model, steps, tmp_path / "uninterrupted", False, "--train.save_every=0")) == 0
    assert _records(out) == _records(tmp_path / "uninterrupted")
    return phases


def test_kill_during_saves_loses_and_invents_nothing(tmp_path):
    # A kill lands up to 250 ms after a save begins, which is 6-25 steps of this model on 2 cores: 80 steps
    # leave the third process steps to be killed in (24 did not, on a fast machine).
    _kill_and_resume(tmp_path, "test-lstm-lm", steps=80, kills=3, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_kill_during_saves_many_times(tmp_path, model):
    phases = _kill_and_resume(tmp_path, model, steps=150, kills=18, seed=1)
    assert sum(phases.values()) == 18
    assert len(phases) >= 2, phases  # kills landed in different parts of a save
