"""Checkpoints cannot lose or invent data: seqlab deletes only what it wrote, leftovers of a kill go at the next
start, every file is verified against the manifest, and ``latest`` never leaves its run directory."""

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile

import pytest
import torch
from safetensors.torch import load_file, save_file

from seqlab.cli import main
from seqlab.models import create
from seqlab.training import checkpoint as ckpt
from seqlab.training import manifest


def _user_files(out):
    """A user's own things in --out and in checkpoints/, some named like seqlab's checkpoints."""
    files = {
        out / "notes.txt": "mine",
        out / ".hidden": "mine too",
        out / "checkpoints" / "notes.txt": "about the checkpoints",
        out / "checkpoints" / "step-0-my-notes" / "README": "kept by hand",
        out / "checkpoints" / "step-00000003" / "model.safetensors": "not seqlab's",
        out / "checkpoints" / ".tmp-notes" / "x": "a temporary name that seqlab never makes",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return files


def test_pruning_removes_only_the_checkpoints_seqlab_wrote(train, tmp_path):
    out = tmp_path / "r"
    mine = _user_files(out)
    train(out, 20, save_every=5, keep_checkpoints=2)
    assert all(p.read_text(encoding="utf-8") == text for p, text in mine.items())
    names = sorted(p.name for p in (out / "checkpoints").iterdir() if re.fullmatch(r"step-\d{8}", p.name))
    assert names == ["step-00000003", "step-00000015", "step-00000020"]  # the user's step-00000003 stays
    seqlab_dirs = names[1:]
    entries = manifest.read_manifest(out / "checkpoints")
    assert sorted(entries) == seqlab_dirs
    for name, entry in entries.items():  # a sha256 and a size per file, as written
        files = sorted(p.name for p in (out / "checkpoints" / name).iterdir())
        assert sorted(entry["files"]) == files
        for f in files:
            data = (out / "checkpoints" / name / f).read_bytes()
            assert entry["files"][f] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_a_directory_seqlab_did_not_write_is_never_replaced(tmp_path):
    model = create("test-lstm-lm", vocab_size=7)
    theirs = tmp_path / "checkpoints" / "step-00000001"
    theirs.mkdir(parents=True)
    (theirs / "model.safetensors").write_text("theirs", encoding="utf-8")
    with pytest.raises(FileExistsError, match="seqlab did not write it"):
        ckpt.save_checkpoint(tmp_path, 1, model, {"family": "lm", "model": {}})
    assert (theirs / "model.safetensors").read_text(encoding="utf-8") == "theirs"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000001"]


def test_a_resave_of_the_same_step_replaces_seqlabs_own_checkpoint(tmp_path):
    model = create("test-lstm-lm", vocab_size=7)
    cfg = {"family": model.family, "model": vars(model.config)}
    ckpt.save_checkpoint(tmp_path, 1, model, cfg)
    with torch.no_grad():
        model.head.weight.add_(1.0)
    ckpt.save_checkpoint(tmp_path, 1, model, cfg)
    assert torch.equal(ckpt.load_model(tmp_path).head.weight, model.head.weight)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["manifest.json", "step-00000001"]


def test_leftovers_of_a_killed_save_go_at_the_next_start_and_nothing_else(train, tmp_path):
    out = tmp_path / "r"
    train(out, 5)
    mine = _user_files(out)
    root = out / "checkpoints"
    # what a kill leaves, made the way seqlab makes it
    leftovers = [
        tempfile.mkdtemp(dir=root, prefix=".tmp-step-00000010-"),
        tempfile.mkstemp(dir=root, prefix=".manifest.json.tmp-")[1],
        tempfile.mkstemp(dir=out, prefix=".latest.tmp-")[1],
        tempfile.mkstemp(dir=out, prefix=".metrics.jsonl.tmp-")[1],
    ]
    (root / ".old-step-00000005").mkdir()
    (root / ".old-step-00000005" / "model.safetensors").write_bytes(b"x")
    train(out, 6, resume=True)
    assert not any(os.path.exists(p) for p in leftovers)
    assert not (root / ".old-step-00000005").exists()
    assert all(p.read_text(encoding="utf-8") == text for p, text in mine.items())


def _tear(step_dir):
    bad = step_dir / "trainer_state.safetensors"
    bad.write_bytes(bad.read_bytes()[:-8])  # torn by a failing disk


def _move_aside(step_dir):
    step_dir.rename(step_dir.with_name(".old-" + step_dir.name))  # a kill while the step is saved again


@pytest.mark.parametrize("damage", [_tear, _move_aside])
def test_resume_falls_back_to_the_newest_verified_checkpoint(train, tmp_path, caplog, damage):
    full = train(tmp_path / "a", 15, save_every=5, keep_checkpoints=3)
    out = tmp_path / "b"
    train(out, 15, until=10, save_every=5, keep_checkpoints=3)
    damage(out / "checkpoints" / "step-00000010")
    with caplog.at_level(logging.WARNING, logger="seqlab.train"):
        resumed = train(out, 15, resume=True, save_every=5, keep_checkpoints=3)
    warning = next(r.getMessage() for r in caplog.records if "cannot resume from" in r.getMessage())
    assert "step-00000010" in warning and "step-00000005" in warning
    assert "trainer_state.safetensors" in warning if damage is _tear else "is missing" in warning
    assert resumed.history[0]["step"] == 6  # it continued from step 5 ...
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # ... to the same weights as the uninterrupted run
    for name in manifest.read_manifest(out / "checkpoints"):  # step 10 was written again, and verifies
        ckpt.check_complete(out / "checkpoints" / name)


def test_no_verified_checkpoint_to_resume_is_a_clear_error(train, tmp_path):
    out = tmp_path / "r"
    train(out, 5)
    (out / "checkpoints" / "step-00000005" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(
        ckpt.CorruptCheckpointError, match=r"no checkpoint .* is complete and verified.*model"
    ):
        train(out, 10, resume=True)


def test_overwritten_weights_are_detected_not_loaded(train, tmp_path):
    out = tmp_path / "r"
    train(out, 5)
    weights = ckpt.resolve_checkpoint(out) / "model.safetensors"
    state = load_file(str(weights))
    save_file({k: torch.zeros_like(v) for k, v in state.items()}, str(weights))  # a valid file, other values
    with pytest.raises(ValueError, match=r"model\.safetensors does not match the sha256"):
        ckpt.load_model(out)
    config = weights.parent / "config.json"
    config.write_text(config.read_text().replace('"dropout": 0.2', '"dropout": 0.3'), encoding="utf-8")
    with pytest.raises(ValueError, match=r"config\.json does not match"):
        ckpt.load_config(out)


def test_a_run_without_its_manifest_loads_unverified_and_says_so_once(tmp_path, caplog):
    model = create("test-lstm-lm", vocab_size=7)
    ckpt.save_checkpoint(tmp_path, 1, model, {"family": model.family, "model": vars(model.config)})
    (tmp_path / "checkpoints" / "manifest.json").unlink()  # deleted, or a run of seqlab 0.1
    with caplog.at_level(logging.DEBUG, logger="seqlab.train"):
        loaded = ckpt.load_model(tmp_path)
        ckpt.load_config(tmp_path)
    assert torch.equal(loaded.head.weight, model.head.weight)
    said = [r for r in caplog.records if "without checking its files' sha256" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "there is no" in said[0].getMessage() and "manifest.json" in said[0].getMessage()


def test_a_checkpoint_copied_out_of_its_run_loads_unverified_at_debug_level(tmp_path, caplog):
    model = create("test-lstm-lm", vocab_size=7)
    ckpt.save_checkpoint(tmp_path / "run", 1, model, {"family": model.family, "model": vars(model.config)})
    copy = tmp_path / "kept" / "step-1"
    shutil.copytree(ckpt.resolve_checkpoint(tmp_path / "run"), copy)
    with caplog.at_level(logging.DEBUG, logger="seqlab.train"):
        loaded = ckpt.load_model(copy)
    assert torch.equal(loaded.head.weight, model.head.weight)
    assert any(
        "no checksum to verify" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records
    )
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)


def test_an_unreadable_manifest_is_a_clear_error_and_is_kept(tmp_path):
    model = create("test-lstm-lm", vocab_size=7)
    ckpt.save_checkpoint(tmp_path, 1, model, {"family": model.family, "model": vars(model.config)})
    (tmp_path / "checkpoints" / "manifest.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not a seqlab checkpoint manifest"):
        ckpt.save_checkpoint(tmp_path, 2, model, {"family": model.family, "model": vars(model.config)})
    assert (tmp_path / "checkpoints" / "manifest.json").read_text(encoding="utf-8") == "{not json"


@pytest.mark.parametrize(
    "text",
    ["/etc", "../other/checkpoints/step-00000001", "checkpoints/step-00000001/../../../x", "checkpoints"],
)
def test_latest_can_only_name_a_checkpoint_inside_its_run(tmp_path, capsys, text):
    model = create("test-lstm-lm", vocab_size=7)
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 1, model, {"family": model.family, "model": vars(model.config)})
    (run / "latest").write_text(text + "\n", encoding="utf-8")
    for load in (ckpt.resolve_checkpoint, ckpt.load_model, ckpt.resumable_checkpoint):
        with pytest.raises(ValueError, match="can only name a checkpoint inside its run directory") as e:
            load(run)
        assert repr(text) in str(e.value)
    assert main(["generate", "--checkpoint", str(run), "--prompt", "a"]) == 2
    assert f"holds {text!r}" in capsys.readouterr().err


def test_manifest_is_strict_json_written_atomically(tmp_path):
    model = create("test-lstm-lm", vocab_size=7)
    ckpt.save_checkpoint(tmp_path, 1, model, {"family": model.family, "model": vars(model.config)}, keep=0)
    ckpt.save_checkpoint(tmp_path, 2, model, {"family": model.family, "model": vars(model.config)}, keep=0)
    data = json.loads((tmp_path / "checkpoints" / "manifest.json").read_text(encoding="utf-8"))
    assert data["format"] == manifest.FORMAT and list(data["checkpoints"]) == [
        "step-00000001",
        "step-00000002",
    ]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")) == []


def test_a_run_without_latest_is_still_a_run(train, tmp_path):
    """With 'latest' gone (deleted, left out of a copy) the manifest still lists the checkpoints: a fresh run
    there would re-save step 5 and prune the rest, so it is refused, and a resume takes the newest verified."""
    out = tmp_path / "r"
    train(out, 15, save_every=5, keep_checkpoints=3)
    (out / "latest").unlink()
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="already holds a run's checkpoints"):
        train(out, 10)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before
    assert main(["train", "--model.name=test-lstm-lm", "--task.name=adding", "--out", str(out)]) == 2
    resumed = train(out, 20, resume=True)
    assert resumed.step == 20 and ckpt.latest_target(out).name == "step-00000020"


def test_two_trainings_cannot_share_a_run_directory(train, tmp_path):
    """The second would set the first's metrics aside, interleave checkpoints in one manifest and prune them."""
    out = tmp_path / "r"
    out.mkdir()
    held = manifest.lock_run(out)  # another process (or Trainer) in the middle of its fit
    try:
        with pytest.raises(
            manifest.RunInUseError, match=rf"in use by another seqlab training \(process {os.getpid()}\)"
        ):
            train(out, 5)
        assert not (out / "metrics.jsonl").exists() and not list((out / "checkpoints").iterdir())
    finally:
        manifest.unlock_run(held)
    assert train(out, 5).step == 5  # free again: the lock goes with its holder
    assert train(out, 10, resume=True).step == 10  # and a finished fit released its own


def test_weights_that_do_not_fit_their_config_are_named_not_a_traceback(train, tmp_path):
    """A checkpoint folder whose config.json was edited (or copied from another run) beside its weights."""
    out = tmp_path / "r"
    train(out, 5)
    step = ckpt.latest_target(out)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in step.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    config["model"]["d_model"] = 48
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"do not fit the model its config\.json describes: .* of another shape"
    ):
        ckpt.load_model(copy)
    config["model"]["n_layers"] = 3
    config["model"]["d_model"] = 32
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match=r"describes: \d+ \(.*\) missing, 0 unexpected"):
        ckpt.load_model(copy)
