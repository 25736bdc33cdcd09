"""Captioning settings against the source they meet: the image side's real least value told at once, the file
sources' splits cut by n_train and n_eval, max_objects refused where there are no generated scenes."""

from __future__ import annotations

import logging
import os

import pytest
from test_data_edges import _caption_folder  # the same folder (pytest puts it on sys.path)

from seqlab.tasks import create_task
from seqlab.tasks.image_files import (
    TUXPAINT_DIR,
    TUXPAINT_INSTALL,
    read_captions_file,
    split_captioned,
    tuxpaint_stamps,
)


def _captions_file(folder) -> str:
    """12 captioned images: 9 train, 1 val, 2 test."""
    return _caption_folder(folder, n=12)


@pytest.mark.parametrize("size", [7, 8, 31])
def test_the_scenes_image_size_is_told_its_real_bound_the_first_time(size):
    """image_size=7 was refused with '>= 8', then 8 with '>= 32'."""
    with pytest.raises(
        ValueError, match=rf"task\.image_size must be an integer >= 32 for source='scenes' .*got {size}"
    ):
        create_task("captioning", image_size=size, n_train=4, n_eval=2)


@pytest.mark.parametrize("source", ["tuxpaint", "folder"])
def test_a_file_source_takes_images_down_to_8_pixels(source, tmp_path):
    captions = _captions_file(tmp_path) if source == "folder" else None
    with pytest.raises(
        ValueError, match=rf"task\.image_size must be an integer >= 8 for source='{source}', got 7"
    ):
        create_task("captioning", source=source, captions=captions, image_size=7)
    if source == "folder":
        assert (
            create_task("captioning", source=source, captions=captions, image_size=8).images("val").shape[-1]
            == 8
        )


@pytest.mark.parametrize("source", ["tuxpaint", "folder"])
@pytest.mark.parametrize("max_objects", [1, 3])
def test_max_objects_is_refused_for_a_file_source(source, max_objects, tmp_path):
    """It was accepted and ignored: the stamps have no objects to count. Refused before any file is read."""
    captions = str(tmp_path / "none.csv") if source == "folder" else None
    with pytest.raises(
        ValueError,
        match=rf"task\.max_objects={max_objects} sets how many objects a generated scene holds "
        rf"\(source='scenes'\); source='{source}' reads its images and captions from files",
    ):
        create_task("captioning", source=source, captions=captions, max_objects=max_objects)


def test_n_train_and_n_eval_cut_a_captions_file_to_its_first_images(tmp_path):
    """They were ignored: all 9/1/2 images were used whatever they said."""
    captions = _captions_file(tmp_path)
    full = split_captioned(read_captions_file(captions))
    task = create_task("captioning", source="folder", captions=captions, image_size=16, n_train=3, n_eval=1)
    assert task.n_images == {"train": 3, "val": 1, "test": 1}
    assert task.images("train").shape == (3, 3, 16, 16)
    for split in ("train", "val", "test"):
        assert task.references(split) == [refs for _, refs in full[split][: task.n_images[split]]]


def test_more_images_asked_than_a_file_source_has_are_said(tmp_path, caplog):
    captions = _captions_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        create_task("captioning", source="folder", captions=captions, image_size=8)
    assert "task.n_" not in caplog.text  # the defaults keep every image without a word
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        task = create_task("captioning", source="folder", captions=captions, image_size=8, n_train=50)
    assert task.n_images["train"] == 9
    assert "task.n_train=50 is more than the 9 train images of source='folder': all are used" in caplog.text


@pytest.mark.skipif(
    not os.path.isdir(TUXPAINT_DIR), reason=f"Tux Paint stamps not installed: {TUXPAINT_INSTALL}"
)
def test_tuxpaint_honours_image_size_n_train_and_n_eval():
    """n_train=20, n_eval=5 trained on all 628/78/79 stamps."""
    task = create_task("captioning", source="tuxpaint", image_size=24, n_train=20, n_eval=5)
    assert task.n_images == {"train": 20, "val": 5, "test": 5}
    assert task.images("train").shape == (20, 3, 24, 24) and task.model_overrides()["image_size"] == 24
    full = split_captioned(tuxpaint_stamps())
    assert task.references("train") == [refs for _, refs in full["train"][:20]]
