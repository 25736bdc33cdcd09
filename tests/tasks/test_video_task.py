"""The video task: batches are pure functions of their index, the three labels' losses and metrics, the three
heads train on the test tier, a user's folder of clips, clear errors."""

import csv

import numpy as np
import pytest
import torch

from seqlab.models import create
from seqlab.tasks import create_task
from seqlab.tasks.clips import ACTIONS, EVENTS

SMALL = {"n_frames": 8, "frame_size": 16, "n_train": 256, "n_eval": 64, "batch_size": 32}


def _model(task, preset):
    return create(preset, **task.model_overrides())


def _train(task, model, steps, lr=3e-3):
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for i in range(steps):
        loss, _, _ = task.loss(model, task.get_batch("train", i))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return task.evaluate(model, max_batches=2)


def test_batches_are_pure_functions_of_the_index_and_standardized():
    a, b = create_task("video", **SMALL), create_task("video", **SMALL)
    x, y = a.get_batch("train", 5), b.get_batch("train", 5)
    assert torch.equal(x["clips"], y["clips"]) and torch.equal(x["y"], y["y"])
    assert x["clips"].shape == (32, 8, 1, 16, 16) and x["y"].shape == (32,)
    assert not torch.equal(a.get_batch("train", 6)["index"], x["index"])
    pixels = torch.cat([a.get_batch("train", i)["clips"] for i in range(8)])
    assert abs(pixels.mean().item()) < 0.1 and abs(pixels.std().item() - 1) < 0.1
    assert a.model_overrides() == {
        "head": "action",
        "n_frames": 8,
        "frame_size": 16,
        "in_channels": 1,
        "n_classes": 8,
    }
    assert a.class_names == ACTIONS and create_task("video", label="frames", **SMALL).class_names == EVENTS


def test_splits_differ_and_evaluation_reads_each_clip_once():
    task = create_task("video", **SMALL)
    assert not torch.equal(task.clips["val"].frames[:4], task.clips["test"].frames[:4])
    model = _model(task, "test-video").eval()
    out = task.evaluate(model, max_batches=100, split="test")  # 64 clips, not 100 batches
    preds = task.predict(model, task.clips["test"].frames)
    expected = (preds == task.clips["test"].actions).float().mean().item()
    assert out["test_acc"] == pytest.approx(expected)


def test_action_head_trains():
    task = create_task("video", **SMALL)
    out = _train(task, _model(task, "test-video"), 120)
    assert out["val_acc"] > 0.5, out  # 8 classes: chance 0.125


def test_frames_head_trains_and_reports_macro_f1():
    task = create_task("video", label="frames", **SMALL)
    out = _train(task, _model(task, "test-video-frames"), 120)
    assert out["val_acc"] > task.majority + 0.1, (out, task.majority)
    assert 0.3 < out["val_macro_f1"] <= 1.0, out


def test_caption_head_trains_and_scores_with_bleu():
    task = create_task("video", label="caption", **SMALL)
    model = _model(task, "test-video-caption")
    before = task.evaluate(model, max_batches=2)
    out = _train(task, model, 120)
    assert out["val_nll"] < before["val_nll"] - 1.0, (before, out)
    assert out["val_bleu4"] > before["val_bleu4"] and 0.0 <= out["val_exact"] <= 1.0
    assert task.decode([*task.encode("the circle moves left"), 2, 0]) == "the circle moves left"


def test_caption_vocabulary_is_the_grammars_not_the_samples():
    a = create_task("video", label="caption", **SMALL)
    b = create_task("video", label="caption", **{**SMALL, "n_train": 40, "seed": 3})
    assert a.describe()["vocabulary"] == b.describe()["vocabulary"]


def test_long_setting_labels_only_the_four_directions():
    task = create_task("video", setting="long", n_frames=12, frame_size=24, n_train=128, n_eval=32)
    assert set(task.clips["train"].actions.tolist()) <= {
        ACTIONS.index(d) for d in ("left", "right", "up", "down")
    }


def _folder(tmp_path, n=12, t=5, events=True, actions=("wave", "jump")):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        np.save(tmp_path / f"clip{i}.npy", rng.integers(0, 255, (t, 16, 16), dtype=np.uint8))
        row = {"clip": f"clip{i}", "action": actions[i % len(actions)], "caption": f"a person does {i % 3}"}
        if events:
            row["events"] = " ".join(EVENTS[(i + k) % 5] for k in range(t))
        rows.append(row)
    with open(tmp_path / "labels.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return tmp_path


def test_a_users_folder_of_clips(tmp_path):
    folder = _folder(tmp_path)
    task = create_task("video", source="folder", path=str(folder), n_frames=5, frame_size=16, batch_size=4)
    assert task.class_names == ("jump", "wave") and task.n_clips == {"train": 9, "val": 1, "test": 2}
    model = _model(task, "test-video")
    loss, metrics, _ = task.loss(model, task.get_batch("train", 0))
    assert torch.isfinite(loss) and 0 <= metrics["acc"] <= 1
    frames = create_task(
        "video", label="frames", source="folder", path=str(folder), n_frames=5, frame_size=16
    )
    assert frames.get_batch("val", 0)["y"].shape == (32, 5)


def test_a_folder_is_split_by_action_every_action_in_training(tmp_path):
    """50 clips, 'clap' in 5 and 'nod' in 1: each action in its share of val + test to within one clip, and
    the lone 'nod' in training (a random cut left it out of training one time in five)."""
    folder = _folder(tmp_path, n=50, actions=("wave", "jump", "kick", "wave", "jump", "kick", "wave", "clap"))
    rows = list(csv.DictReader((folder / "labels.csv").read_text(encoding="utf-8").splitlines()))
    rows[-1]["action"] = "nod"
    with open(folder / "labels.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    task = create_task("video", source="folder", path=str(folder), n_frames=5, frame_size=16)
    k = len(task.class_names)
    counts = {s: torch.bincount(c.actions, minlength=k).double() for s, c in task.clips.items()}
    rest = sum(counts.values()) - 1  # one clip of each action leads the order, in training
    held = counts["val"] + counts["test"]
    assert torch.all((held - rest * held.sum() / rest.sum()).abs() < 1), counts
    assert torch.all(counts["train"] >= 1), counts


def test_folder_errors(tmp_path):
    folder = _folder(tmp_path, events=False)
    with pytest.raises(ValueError, match=r"have 5 frames, not task\.n_frames=8"):
        create_task("video", source="folder", path=str(folder), n_frames=8, frame_size=16)
    with pytest.raises(ValueError, match="needs an event for every frame"):
        create_task("video", label="frames", source="folder", path=str(folder), n_frames=5, frame_size=16)
    with pytest.raises(ValueError, match="source='folder' needs path"):
        create_task("video", path=str(folder))
    with pytest.raises(ValueError, match="source='folder' needs path"):
        create_task("video", source="folder")


def test_bad_settings_and_a_model_of_the_wrong_shape():
    with pytest.raises(ValueError, match="label must be one of"):
        create_task("video", label="pose", **SMALL)
    with pytest.raises(ValueError, match="split must be one of"):
        create_task("video", **SMALL).get_batch("heldout", 0)
    task = create_task("video", **SMALL)
    wrong = create("test-video", n_classes=5, frame_size=16)
    with pytest.raises(ValueError, match=r"logits \(b, K\) of shape \(32, 8\)"):
        task.loss(wrong, task.get_batch("train", 0))


def test_sizes_are_reported_as_given():
    """n_frames=0 was reported as "got 1" and frame_size=0 as "got 8" (the fallbacks, not the values given)."""
    from seqlab.tasks import create_task

    for field, value, message in [("n_frames", 0, ">= 1, got 0"), ("frame_size", 0, ">= 8, got 0")]:
        with pytest.raises(ValueError, match=f"{field} must be an integer {message}"):
            create_task("video", **{field: value})
