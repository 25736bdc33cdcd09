"""A resumed run's metrics.jsonl equals the uninterrupted run's (timings aside), whatever killed it and whatever
log_every and save_every are; a fresh start never appends to an earlier run's log; no record holds NaN."""

import json
import math

import pytest

from seqlab.cli import main
from seqlab.training import checkpoint as ckpt


@pytest.mark.parametrize(
    ("log_every", "save_every", "killed_at"), [(1, 5, 13), (3, 5, 13), (4, 6, 11), (5, 2, 9)]
)
def test_a_killed_and_resumed_run_logs_what_the_uninterrupted_run_logs(
    train, records, die_before_saving, tmp_path, log_every, save_every, killed_at
):
    settings = {"log_every": log_every, "save_every": save_every, "eval_every": 4}
    train(tmp_path / "a", 16, **settings)
    out = tmp_path / "b"
    killed = die_before_saving(killed_at)
    with pytest.raises(KeyboardInterrupt):
        train(out, 16, **settings)
    killed.undo()
    assert any(r["step"] > ckpt.load_trainer_state(out)["step"] for r in records(out))  # logged past it
    train(out, 16, resume=True, **settings)
    assert records(out) == records(tmp_path / "a")


def _interrupted_at_8(train, die_before_saving, tmp_path):
    """An uninterrupted run of 12 steps in a/ and one killed at step 8 in b/ (returned), past its checkpoint."""
    train(tmp_path / "a", 12)
    out = tmp_path / "b"
    killed = die_before_saving(8)
    with pytest.raises(KeyboardInterrupt):
        train(out, 12)
    killed.undo()
    return out


def test_a_torn_last_line_is_dropped_on_resume(train, records, die_before_saving, tmp_path, caplog):
    out = _interrupted_at_8(train, die_before_saving, tmp_path)
    with open(out / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 9, "split": "tr\xc3')  # a kill in the middle of a line and of a character
    train(out, 12, resume=True)
    assert records(out) == records(tmp_path / "a")
    assert "dropped its last line, torn by an interrupted write" in caplog.text
    assert not list(out.glob("metrics.jsonl.unreadable-*"))


def test_lines_that_are_not_records_are_copied_aside_before_a_resume_leaves_them_out(
    train, records, die_before_saving, tmp_path, caplog
):
    out = _interrupted_at_8(train, die_before_saving, tmp_path)
    before = (out / "metrics.jsonl").read_bytes()
    lines = before.splitlines(keepends=True)
    edited = b"".join([*lines[:2], b"my note about this run\n", *lines[2:]])
    (out / "metrics.jsonl").write_bytes(edited)
    train(out, 12, resume=True)
    assert records(out) == records(tmp_path / "a")
    assert (out / "metrics.jsonl.unreadable-1").read_bytes() == edited  # nothing the user wrote is lost
    assert "1 line(s) are not seqlab records (line 3; not a torn write" in caplog.text


def test_a_pause_between_two_records_keeps_the_logging_window(train, records, tmp_path):
    train(tmp_path / "a", 12, log_every=3)
    train(tmp_path / "b", 12, until=7, log_every=3)  # stops and saves at step 7, without a record there
    assert max(r["step"] for r in records(tmp_path / "b")) == 6
    train(tmp_path / "b", 12, resume=True, log_every=3)
    assert records(tmp_path / "b") == records(tmp_path / "a")  # the record at 9 is the mean over 7, 8 and 9


def test_a_fresh_start_sets_an_earlier_runs_metrics_aside(
    train, records, die_before_saving, tmp_path, caplog
):
    train(tmp_path / "a", 6)
    out = tmp_path / "b"
    killed = die_before_saving(1)  # dies before its first checkpoint
    with pytest.raises(KeyboardInterrupt):
        train(out, 6)
    killed.undo()
    dead = (out / "metrics.jsonl").read_text(encoding="utf-8")
    (out / "metrics.jsonl.stale-1").write_text("the user's own\n", encoding="utf-8")
    train(out, 6)
    assert records(out) == records(tmp_path / "a")  # step 1 once, not twice
    assert (out / "metrics.jsonl.stale-2").read_text(encoding="utf-8") == dead
    assert (out / "metrics.jsonl.stale-1").read_text(encoding="utf-8") == "the user's own\n"
    assert "moved it to metrics.jsonl.stale-2" in caplog.text


def test_non_finite_metrics_are_written_as_null(train, records, tmp_path, monkeypatch):
    from seqlab.tasks.text import CharLMTask

    monkeypatch.setattr(
        CharLMTask, "evaluate", lambda self, model, n: {"val_loss": math.inf, "val_x": math.nan}
    )
    trainer = train(tmp_path / "r", 5)
    val = [r for r in records(tmp_path / "r") if r["split"] == "val"]
    assert val and all(r["val_loss"] is None and r["val_x"] is None for r in val)
    assert trainer.history[-1]["val_loss"] is None


# ---- through the command line ---------------------------------------------------------------------------------


def _train(corpus, out, *extra):
    args = [
        "train",
        "--model.name=test-gru-lm",
        "--task.name=text",
        f"--task.source={corpus}",
        "--task.seq_len=16",
        "--task.batch_size=4",
        "--train.eval_every=3",
        "--train.eval_batches=2",
        "--train.progress=false",
        "--train.warmup_steps=2",
        "--out",
        str(out),
    ]
    return main([*args, *extra])


def _summary(capsys):
    def refuse(name):
        raise ValueError(f"the summary holds {name}")

    return json.loads(capsys.readouterr().out.strip().splitlines()[-1], parse_constant=refuse)


def test_resume_with_more_steps_continues_to_the_new_total(corpus, records, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(corpus, out, "--train.steps=4") == 0
    first = _summary(capsys)
    assert _train(corpus, out, "--train.steps=4", "--resume") == 0  # nothing left to do: the same summary
    again = _summary(capsys)
    assert again["step"] == 4 and again["train_loss"] == first["train_loss"] and again["val_loss"] is not None
    assert _train(corpus, out, "--resume", "--train.steps=8") == 0
    assert _summary(capsys)["step"] == 8
    assert [r["step"] for r in records(out) if r["split"] == "train"] == [4, 8]  # log_every=10: the ends
    assert ckpt.load_config(out)["train"]["steps"] == 8 and ckpt.load_config(out)["step"] == 8
    assert _train(corpus, out, "--resume", "--train.steps=6") == 2
    assert "train.steps=6 is below the step 8" in capsys.readouterr().err


def test_resume_through_the_cli_survives_a_corrupt_latest(corpus, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    assert _train(corpus, out, "--train.steps=6", "--train.save_every=3") == 0
    capsys.readouterr()
    (ckpt.resolve_checkpoint(out) / "model.safetensors").write_bytes(b"\0" * 64)
    assert _train(corpus, out, "--train.steps=6", "--resume") == 0
    assert _summary(capsys)["step"] == 6
    assert "resuming from" in caplog.text and "step-00000003" in caplog.text
    ckpt.check_complete(ckpt.resolve_checkpoint(out))  # step 6 written again
