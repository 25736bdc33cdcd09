"""Helpers for the checkpoint and resume tests: a tiny char-LSTM trained a few steps on a small text."""

import json

import pytest
import torch

from seqlab.models import create
from seqlab.tasks.text import CharLMTask
from seqlab.training import TrainConfig, Trainer
from seqlab.training import checkpoint as ckpt

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))
TIMINGS = ("tokens_per_s", "elapsed_s")


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


@pytest.fixture
def train(corpus):
    """``train(out, steps, resume=False, until=None, **train_fields)``: a fitted Trainer."""

    def run(out, steps, resume=False, until=None, **fields):
        torch.manual_seed(0)
        task = CharLMTask(source=str(corpus), seq_len=16, batch_size=4, sampling="stream")
        model = create("test-lstm-lm", vocab_size=task.tokenizer.vocab_size, dropout=0.2)
        settings = {
            "lr": 3e-3,
            "warmup_steps": 3,
            "eval_every": 5,
            "eval_batches": 2,
            "log_every": 1,
            "save_every": 5,
        }
        cfg = TrainConfig(steps=steps, **{"progress": False, **settings, **fields})
        trainer = Trainer(model, task, cfg, out)
        trainer.fit(resume=resume, until=until)
        return trainer

    return run


@pytest.fixture
def die_before_saving(monkeypatch):
    """``die_before_saving(step)``: the next saves of that step or later raise KeyboardInterrupt, as if the
    process were killed after logging the step and before its checkpoint; ``.undo()`` on the returned
    monkeypatch restores saving."""

    def arm(step):
        real = ckpt.save_checkpoint

        def save(run_dir, at, *args, **kwargs):
            if at >= step:
                raise KeyboardInterrupt(f"killed before saving step {at}")
            return real(run_dir, at, *args, **kwargs)

        monkeypatch.setattr(ckpt, "save_checkpoint", save)
        return monkeypatch

    return arm


@pytest.fixture
def records():
    """``records(out)``: the records of ``out/metrics.jsonl`` read as strict JSON (NaN or Infinity fail),
    timings left out."""

    def refuse(name):
        raise ValueError(f"metrics.jsonl holds {name}")

    def read(out, drop=TIMINGS):
        lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return [
            {k: v for k, v in json.loads(ln, parse_constant=refuse).items() if k not in drop} for ln in lines
        ]

    return read
