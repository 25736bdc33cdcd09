"""A stop signal in the middle of a step of many batches (train.grad_accum): the step is dropped at its next
batch, not finished, and the run resumes exactly as if never stopped (dropout's random draws included)."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from seqlab.cli import main
from seqlab.tasks.synthetic import AddingTask

ACCUM = 40
ARGS = [
    "train",
    "--model.name=test-gpt",
    "--model.tie_weights=false",
    "--model.dropout=0.3",
    "--task.name=adding",
    "--task.seq_len=8",
    "--task.batch_size=4",
    f"--train.grad_accum={ACCUM}",
    "--train.steps=4",
    "--train.log_every=1",
    "--train.eval_every=2",
    "--train.eval_batches=1",
    "--train.warmup_steps=1",
    "--train.threads=1",
    "--train.progress=false",
]


def _records(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)


def _close(a, b) -> bool:
    """Two records alike, their floats to a relative 1e-5."""
    near = (v == pytest.approx(b[k], rel=1e-5) if isinstance(v, float) else v == b[k] for k, v in a.items())
    return a.keys() == b.keys() and all(near)


@pytest.mark.parametrize("device", ["cpu", CUDA])  # on CUDA dropout draws from the GPU's generator
@pytest.mark.parametrize("save_every", [1, 100])  # step 2 saved before the stop, or by it
def test_a_stop_drops_a_long_step_and_resume_redoes_it_exactly(
    save_every, device, tmp_path, monkeypatch, caplog
):
    fresh, out = tmp_path / "fresh", tmp_path / "run"
    args = [*ARGS, f"--train.save_every={save_every}", "--device", device]
    assert main([*args, "--out", str(fresh)]) == 0
    drawn, original = [], AddingTask.get_batch

    def get_batch(self, split, index):
        if split == "train":
            drawn.append(index)
            if index == 2 * ACCUM + 5:  # the sixth batch of the third step
                os.kill(os.getpid(), signal.SIGINT)
        return original(self, split, index)

    monkeypatch.setattr(AddingTask, "get_batch", get_batch)
    assert main([*args, "--out", str(out)]) == 130
    assert max(drawn) == 2 * ACCUM + 5  # stopped at the next batch, not after the 40th
    assert "dropping this step after its current batch" in caplog.text
    assert "stopped by Ctrl-C at step 2" in caplog.text
    assert (out / "latest").read_text().strip().endswith("step-00000002")
    monkeypatch.setattr(AddingTask, "get_batch", original)
    assert main([*args, "--out", str(out), "--resume"]) == 0
    if device == "cpu":
        assert _records(out) == _records(fresh)
    else:  # a GPU's sums may round differently from run to run; a wrong dropout mask moves the loss by far more
        resumed, uncut = _records(out), _records(fresh)
        assert len(resumed) == len(uncut) and all(map(_close, resumed, uncut)), (resumed, uncut)


def test_the_same_signal_twice_at_once_is_one_stop(tmp_path, monkeypatch, caplog):
    """`timeout` sends its SIGTERM to the command and again to its process group: the repeat killed the run
    before it saved. A repeat within interrupt.REPEAT_S is the same stop; the run saves and says so."""
    out, original = tmp_path / "run", AddingTask.get_batch

    def get_batch(self, split, index):
        if split == "train" and index == 2 * ACCUM + 5:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, split, index)

    monkeypatch.setattr(AddingTask, "get_batch", get_batch)
    assert main([*ARGS, "--train.save_every=100", "--out", str(out)]) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM at step 2" in caplog.text
    assert (out / "latest").read_text().strip().endswith("step-00000002")


def test_a_stop_during_an_evaluation_ends_it_and_the_resume_evaluates_first(tmp_path, monkeypatch, caplog):
    """A long evaluation (train.eval_batches) made a stop wait for all of it. Now it ends at once, unrecorded,
    the step is saved with its evaluation pending, and the resume records it: the same records as never cut."""
    args = [*ARGS, "--train.grad_accum=1", "--train.eval_batches=50", "--train.save_every=100"]
    fresh, out = tmp_path / "fresh", tmp_path / "run"
    assert main([*args, "--out", str(fresh)]) == 0
    drawn, original = [], AddingTask.get_batch

    def get_batch(self, split, index):
        if split == "val" and len(drawn) < 99:  # the evaluation at step 2, its fourth batch
            drawn.append(index)
            if len(drawn) == 4:
                os.kill(os.getpid(), signal.SIGINT)
        return original(self, split, index)

    monkeypatch.setattr(AddingTask, "get_batch", get_batch)
    assert main([*args, "--out", str(out)]) == 130
    assert len(drawn) == 4  # not 50
    assert "ending this evaluation, then saving a checkpoint" in caplog.text
    assert (out / "latest").read_text().strip().endswith("step-00000002")
    monkeypatch.setattr(AddingTask, "get_batch", original)
    assert main([*args, "--out", str(out), "--resume"]) == 0
    assert _records(out) == _records(fresh)
