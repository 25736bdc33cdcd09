"""The run directory across runs: another run's checkpoint never continues into a directory that holds a run,
a save cut short leaves a directory that can start afresh, a directory of the user's where a checkpoint will go
is found before the training, a fresh start sets an earlier run's TensorBoard events aside, and a task rebuilt
from changed data is refused by eval and --resume."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from seqlab.cli import main
from seqlab.models import create
from seqlab.tasks.text import CharLMTask
from seqlab.training import TrainConfig, Trainer, manifest
from seqlab.training import checkpoint as ckpt


def _trainer(corpus, out, steps=4, **train):
    torch.manual_seed(0)
    task = CharLMTask(source=str(corpus), seq_len=8, batch_size=2, sampling="random")
    model = create("test-lstm-lm", vocab_size=task.tokenizer.vocab_size)
    settings = {"warmup_steps": 1, "eval_every": 0, "save_every": 2, "progress": False, **train}
    return Trainer(model, task, TrainConfig(steps=steps, **settings), out)


def test_another_runs_checkpoint_never_continues_into_a_directory_holding_a_run(corpus, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _trainer(corpus, a).fit()
    _trainer(corpus, b).fit()
    before = sorted(p.name for p in (b / "checkpoints").iterdir())
    with pytest.raises(ValueError, match=r"belongs to another run: continuing it here would prune"):
        _trainer(corpus, b).fit(resume=a / "checkpoints" / "step-00000002")
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == before
    _trainer(corpus, tmp_path / "c").fit(resume=a / "checkpoints" / "step-00000002")  # a new directory: fine
    _trainer(corpus, b).fit(resume=b / "checkpoints" / "step-00000002")  # its own checkpoint: fine


def test_a_first_save_cut_short_leaves_a_directory_that_starts_afresh(corpus, tmp_path, monkeypatch):
    out = tmp_path / "r"

    real_replace = ckpt.os.replace

    def cut(src, dst):  # the checkpoint's rename into place, after the manifest was written
        if str(src).rsplit("/", 1)[-1].startswith(".tmp-step-"):
            assert "step-00000002" in manifest.read_manifest(out / "checkpoints")
            raise KeyboardInterrupt("a second Ctrl-C")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        _trainer(corpus, out).fit()
    monkeypatch.undo()
    assert manifest.read_manifest(out / "checkpoints") == {}  # the entry written before the rename is gone
    assert not manifest.holds_run(out)
    _trainer(corpus, out).fit()
    assert ckpt.resolve_checkpoint(out).name == "step-00000004"


def test_a_manifest_naming_only_missing_checkpoints_is_no_run(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    manifest.write_manifest(root, {"step-00000002": {"step": 2, "files": {}}})  # as a kill mid-save leaves it
    assert not manifest.holds_run(tmp_path)
    (root / "step-00000002").mkdir()
    assert manifest.holds_run(tmp_path)


def test_a_directory_of_the_users_where_a_checkpoint_will_go_is_found_before_training(corpus, tmp_path):
    out = tmp_path / "r"
    (out / "checkpoints" / "step-00000004").mkdir(parents=True)
    (out / "checkpoints" / "step-00000003").mkdir()  # no checkpoint goes there: it stays, and is no obstacle
    with pytest.raises(ValueError, match=r"step-00000004, which seqlab did not write"):
        _trainer(corpus, out).fit()
    assert not (out / "metrics.jsonl").exists()  # refused before the first step
    _trainer(corpus, out, steps=2).fit()
    assert (out / "checkpoints" / "step-00000003").is_dir()


def test_a_fresh_start_sets_earlier_tensorboard_events_aside(corpus, tmp_path):
    out = tmp_path / "r"
    (out / "tb").mkdir(parents=True)
    (out / "tb" / "events.out.tfevents.1").write_text("earlier", encoding="utf-8")
    _trainer(corpus, out, steps=2, save_every=0, loggers=["jsonl"]).fit()
    assert (out / "tb.stale-1" / "events.out.tfevents.1").read_text(encoding="utf-8") == "earlier"


def test_device_mps_without_mps_is_refused_in_one_line():
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with pytest.raises(ValueError, match=r"train.device='mps', but this machine .* has no MPS device"):
        TrainConfig(device="mps")


def test_a_warmup_longer_than_the_run_is_said(caplog):
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        TrainConfig(steps=20, warmup_steps=100, lr=0.002)
    assert (
        "train.warmup_steps=100 is more than train.steps=20" in caplog.text
        and "reaches 0.0004" in caplog.text
    )


def test_eval_and_resume_refuse_a_task_whose_data_changed(corpus, tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["--model.name=test-lstm-lm", "--task.name=text", f"--task.source={corpus}", "--task.seq_len=8",
            "--task.batch_size=2", "--train.steps=2", "--train.eval_every=0", "--train.progress=false"]  # fmt: skip
    assert main(["train", *args, "--out", out]) == 0
    assert main(["eval", "--checkpoint", out, "--batches", "1"]) == 0
    corpus.write_text(
        corpus.read_text(encoding="utf-8").upper(), encoding="utf-8"
    )  # other characters: another vocabulary
    capsys.readouterr()
    assert main(["eval", "--checkpoint", out, "--batches", "1"]) == 2
    assert "another vocabulary than the one it was trained with" in capsys.readouterr().err
    assert main(["train", *args, "--train.steps=4", "--out", out, "--resume"]) == 2
    assert "its data" in capsys.readouterr().err


def test_resuming_a_run_saved_without_its_settings_says_how(corpus, tmp_path, capsys):
    out = tmp_path / "api"
    _trainer(corpus, out, steps=2).fit()
    assert json.loads((ckpt.resolve_checkpoint(out) / "config.json").read_text()).get("run") in ({}, None)
    code = main(["train", "--model.name=test-lstm-lm", "--task.name=adding", "--out", str(out), "--resume"])
    assert code == 2 and "saved without its run settings" in capsys.readouterr().err


def test_resume_true_without_a_run_directory_says_so(corpus):
    with pytest.raises(
        ValueError, match=r"resume=True continues the run in the Trainer's out_dir, and it has none"
    ):
        _trainer(corpus, None).fit(resume=True)


def test_each_rank_restores_its_own_cuda_generator():
    from seqlab.training.distributed import World, cuda_rng_to_restore

    state = {"rng_cuda": ["dev0 by rank 0", "dev1 by rank 0 (never used)"], "rng_cuda_ranks": ["r0", "r1"]}
    cuda1 = torch.device("cuda", 1)
    assert cuda_rng_to_restore(state, World(rank=1, size=2, local_rank=1), cuda1, 2) == {1: "r1"}
    # another world size: rank 0's view of every device, only those this machine has
    assert cuda_rng_to_restore(state, World(rank=0, size=1), torch.device("cuda", 0), 1) == {
        0: "dev0 by rank 0"
    }
    older = {"rng_cuda": ["a", "b", "c"]}  # a checkpoint without per-rank states, from a machine with 3 GPUs
    assert cuda_rng_to_restore(older, World(), torch.device("cpu"), 2) == {0: "a", 1: "b"}


def _free(monkeypatch, free: int) -> None:
    from seqlab.training import run_dir

    real = run_dir.shutil.disk_usage
    monkeypatch.setattr(run_dir.shutil, "disk_usage", lambda p: real(p)._replace(free=free))


def test_a_checkpoint_estimate_covers_what_a_save_writes(corpus, tmp_path):
    from seqlab.training.run_dir import checkpoint_bytes

    trainer = _trainer(corpus, tmp_path / "r", steps=2)
    trainer.fit()
    ckpt_dir = ckpt.resolve_checkpoint(tmp_path / "r")
    written = sum(p.stat().st_size for p in ckpt_dir.rglob("*") if p.is_file())
    estimate = checkpoint_bytes(trainer.model)
    assert written <= estimate <= written + 2**20  # within the 1 MiB allowed for configs and state


def test_a_disk_without_room_for_one_checkpoint_is_refused_before_step_1(corpus, tmp_path, monkeypatch):
    _free(monkeypatch, 10_000)
    with pytest.raises(
        ValueError,
        match=r"disk has 0\.0 MiB free; one checkpoint of this model .* takes about 1\.\d MiB: .*nothing was",
    ):
        _trainer(corpus, tmp_path / "r").fit()
    assert not ckpt.holds_run(tmp_path / "r")
    assert not (tmp_path / "r" / "metrics.jsonl").exists()  # no step ran


def test_a_disk_that_will_fill_at_a_later_save_is_warned_about(corpus, tmp_path, monkeypatch, caplog):
    from seqlab.training.run_dir import checkpoint_bytes

    one = checkpoint_bytes(_trainer(corpus, tmp_path / "probe").model)
    _free(monkeypatch, int(1.5 * one))  # room for one checkpoint; keeping 2 holds 3 at once
    with caplog.at_level(logging.WARNING, logger="seqlab.train"):
        _trainer(corpus, tmp_path / "r", steps=6).fit()
    assert "the 3 checkpoint(s) this run will hold at once" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqlab.train"):
        _trainer(corpus, tmp_path / "s", steps=6, keep_checkpoints=1).fit()
    assert "checkpoint(s) this run will hold at once" in caplog.text  # 2 at once with 1 kept
    caplog.clear()
    _free(monkeypatch, 10 * one)
    with caplog.at_level(logging.WARNING, logger="seqlab.train"):
        _trainer(corpus, tmp_path / "t", steps=6).fit()
    assert "will hold at once" not in caplog.text


def test_a_gradient_norm_that_is_not_finite_stops_before_the_update(corpus, tmp_path):
    """The loss was finite, the norm inf: clipping made every gradient NaN and the update wrote NaN into the
    weights, which the final save kept, with exit status 0."""
    trainer = _trainer(corpus, tmp_path / "r", steps=2, grad_clip=1.0)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    first = next(iter(trainer.model.parameters()))
    first.register_hook(lambda g: torch.full_like(g, float("inf")))
    with pytest.raises(
        FloatingPointError, match=r"the gradient norm is inf at step 1 \(the loss was finite\)"
    ):
        trainer.fit()
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
