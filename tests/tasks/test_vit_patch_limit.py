"""Image sides a ViT cannot train on in reasonable time: a patch-token count past task.max_patches refused before
step 1 with the count and what lowers it; a folder's least image side told at once, before any image is read."""

from __future__ import annotations

import pytest
from PIL import Image

from seqlab.cli import main
from seqlab.run import build_run
from seqlab.tasks import create_task


def _image_folder(root, per_class=5) -> str:
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (6, 5), (i * 40, 0, 0)).save(root / c / f"{i}.png")
    return str(root)


def _vit_run(data_dir, **task) -> dict:
    task = {"name": "image_classification", "source": "folder", "data_dir": data_dir, **task}
    return {"model": {"name": "test-vit"}, "task": task, "train": {"steps": 1}}


def test_a_vit_with_62500_patch_tokens_is_refused_before_step_1(tmp_path):
    """image_size=1000 at patch 4 trained without a word, a step running for minutes."""
    with pytest.raises(ValueError) as e:
        build_run(_vit_run(_image_folder(tmp_path), image_size=1000))
    said = str(e.value)
    assert (
        "task.image_size=1000 in patches of model.patch_size=4 is a 250x250 grid: 62,500 patch tokens" in said
    )
    assert "more than task.max_patches=4,096" in said and "3.9 billion per image in each layer" in said
    assert "at most 256 at this patch size" in said and "raise model.patch_size (e.g. 20)" in said


def test_max_patches_is_the_limit_the_refusal_names(tmp_path):
    folder = _image_folder(tmp_path)
    with pytest.raises(ValueError, match=r"256 patch tokens per image, more than task.max_patches=100"):
        build_run(_vit_run(folder, image_size=64, max_patches=100))
    _, task, _ = build_run(_vit_run(folder, image_size=64, max_patches=256))
    assert task.describe()["max_patches"] == 256


def test_a_captioner_with_a_vit_encoder_has_the_same_limit():
    run = {
        "model": {"name": "test-vit-captioner"},
        "task": {"name": "captioning", "image_size": 512, "n_train": 4, "n_eval": 2},
        "train": {"steps": 1},
    }
    with pytest.raises(
        ValueError, match=r"128x128 grid: 16,384 patch tokens per image, more than task.max_pa"
    ):
        build_run(run)
    run["model"] = {"name": "test-show-attend-tell"}  # a CNN's regions: no pairwise attention among them
    build_run(run)


def test_seqlab_train_says_the_patch_count(tmp_path, capsys):
    """Small sizes under a lowered limit: were the check lost, this test would train one quick step, not minutes."""
    argv = ["train", "--model.name=test-vit", "--task.name=image_classification", "--task.source=folder"]
    argv += [
        f"--task.data_dir={_image_folder(tmp_path / 'data')}",
        "--task.image_size=64",
        "--task.max_patches=100",
    ]
    assert main([*argv, "--train.steps=1", "--train.progress=false", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert (
        "error: task.image_size=64 in patches of model.patch_size=4 is a 16x16 grid: 256 patch tokens" in err
    )
    assert not list((tmp_path / "run").glob("checkpoints/step-*"))


@pytest.fixture
def no_image_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an image was read before the settings were checked")

    monkeypatch.setattr("seqlab.tasks.image_files.load_images", refuse)


def test_a_folders_least_image_side_counts_the_shift(tmp_path, no_image_read):
    """image_size=3 with shift=5 was told '>= 4', then image_size=4 that the shift was too large."""
    folder = _image_folder(tmp_path)
    with pytest.raises(
        ValueError, match=r"task\.image_size must be an integer >= 10 \(twice task\.shift=5, "
    ):
        create_task("image_classification", source="folder", data_dir=folder, image_size=3, shift=5)
    with pytest.raises(ValueError, match=r"task\.image_size must be an integer >= 4, got 3"):
        create_task("image_classification", source="folder", data_dir=folder, image_size=3)


def test_a_folders_shift_is_checked_before_its_images_are_read(tmp_path, no_image_read):
    with pytest.raises(
        ValueError, match=r"shift=5 must be at most half the image side \(8 // 2 = 4 pixels\)"
    ):
        create_task(
            "image_classification", source="folder", data_dir=_image_folder(tmp_path), image_size=8, shift=5
        )
