"""A checkpoint that its still-training run prunes while a command reads it is said to be gone, not damaged."""

from __future__ import annotations

import pytest

import seqlab.training.checkpoint as ckpt
from seqlab.cli import main
from seqlab.training.manifest import read_manifest, verify, write_manifest

GONE = "was removed while it was being read: its run is still training"


@pytest.fixture
def run(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be, that is the question\n" * 40, encoding="utf-8")
    argv = [
        "train",
        "--model.name=test-gpt",
        "--task.name=text",
        f"--task.source={text}",
        "--task.seq_len=16",
        "--task.sampling=random",
    ]
    argv += ["--task.batch_size=2", "--train.steps=2", "--train.progress=false", "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    return tmp_path / "r"


def test_a_checkpoint_pruned_before_its_files_are_verified(run):
    where = ckpt.resolve_checkpoint(run)
    where.rename(where.parent / f".old-{where.name}")  # what prune does first, then the manifest forgets it
    with pytest.raises(ValueError, match=GONE):  # it said "... is missing; manifest.json records it"
        verify(where, ("model.safetensors",))
    entries = read_manifest(where.parent)
    del entries[where.name]
    write_manifest(where.parent, entries)
    with pytest.raises(ValueError, match=GONE):  # it warned the files went unchecked, then failed to read
        verify(where, ("model.safetensors",))
    with pytest.raises(FileNotFoundError, match="keeps its newest only: give the run's folder"):
        ckpt.load_model(where)  # found again from its path: gone, and the way to the newest said


def test_a_checkpoint_pruned_between_its_check_and_its_read(run, monkeypatch):
    where, verify = ckpt.resolve_checkpoint(run), ckpt.verify

    def verify_then_prune(ckpt_dir, names=None):
        done = verify(ckpt_dir, names)
        ckpt_dir.rename(ckpt_dir.parent / f".old-{ckpt_dir.name}")
        return done

    monkeypatch.setattr(ckpt, "verify", verify_then_prune)
    with pytest.raises(ValueError, match=GONE):  # it said "cannot be read as safetensors ... damaged"
        ckpt.load_model(where)
