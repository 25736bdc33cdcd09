"""Image classification for image models: splits without overlap, augmentation, evaluation that counts every
image once, the folder source and its errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

from seqlab.models import create
from seqlab.tasks import create_task
from seqlab.tasks.images import FASHION_MNIST_DIR


@pytest.fixture(scope="module")
def digits():
    return create_task("image_classification", source="digits", n_val=200, batch_size=64)


def test_digits_splits_are_disjoint_and_standardized(digits):
    assert digits.model_overrides() == {"n_classes": 10, "in_channels": 1, "image_size": 8}
    sizes = {s: len(digits._splits[s][1]) for s in ("train", "val", "test")}
    assert sum(sizes.values()) == 1797 and sizes["test"] == 1797 // 5 and sizes["val"] == 200
    flat = {s: {tuple(x.flatten().tolist()) for x in digits._splits[s][0]} for s in sizes}
    # the digits hold a few exact duplicate images; splitting by row can put twins on both sides, nothing else
    assert len(flat["train"] & flat["test"]) <= 5 and len(flat["train"] & flat["val"]) <= 5
    batch = digits.get_batch("train", 0)
    x = torch.cat([digits.get_batch("train", i)["images"] for i in range(10)])
    assert batch["images"].shape == (64, 1, 8, 8) and abs(x.mean().item()) < 0.2


def test_augmentation_shifts_within_bounds_and_is_reproducible(digits):
    a, b = digits.get_batch("train", 5), digits.get_batch("train", 5)
    assert torch.equal(a["images"], b["images"])
    plain = create_task("image_classification", source="digits", n_val=200, batch_size=64, augment=False)
    c = plain.get_batch("train", 5)
    assert torch.equal(a["y"], c["y"]) and not torch.equal(a["images"], c["images"])
    # a shift moves the image: its total ink is kept up to what slides past the border (zero padding)
    ink = lambda t: (t * plain._std + plain._mean).sum((1, 2, 3))  # noqa: E731
    assert (ink(a["images"]) <= ink(c["images"]) + 1e-4).all()
    assert not digits.flip  # digits are not mirror-symmetric: no flips by default


def test_evaluate_counts_every_image_once(digits):
    torch.manual_seed(0)
    model = create("vit-digits", d_model=16, n_layers=1, n_heads=2)
    n_test = len(digits._splits["test"][1])
    metrics = digits.evaluate(model, digits.eval_batches("test"), "test")
    images, labels = digits._splits["test"]
    model.eval()
    with torch.no_grad():
        logits = model((images.float() / 255 - digits._mean) / digits._std)
    assert metrics["test_accuracy"] == pytest.approx((logits.argmax(-1) == labels).float().mean().item())
    assert digits.eval_batches("test") == -(-n_test // 64)


def test_a_folder_of_class_folders(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("cats", "dogs"):
        (tmp_path / name).mkdir()
        for i in range(10):
            pixels = rng.integers(0, 255, (20, 14, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / name / f"{i}.png")
    (tmp_path / "dogs" / "notes.txt").write_text("not an image", encoding="utf-8")
    task = create_task(
        "image_classification", source="folder", data_dir=str(tmp_path), image_size=16, n_val=2
    )
    assert task.classes == ["cats", "dogs"] and task.in_channels == 3
    assert task.get_batch("val", 0)["images"].shape == (128, 3, 16, 16)


def test_a_folder_too_small_for_a_test_split_is_refused_before_training(tmp_path):
    for name in ("cats", "dogs"):
        (tmp_path / name).mkdir()
        for i in range(2):
            Image.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
    with pytest.raises(ValueError, match=r"holds 4 images: its 20% test split needs at least 5; add images"):
        create_task("image_classification", source="folder", data_dir=str(tmp_path), image_size=8, n_val=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "folder"}, "needs data_dir"),
        ({"source": "folder", "data_dir": "/nonexistent"}, "not a folder of class sub-folders"),
        ({"source": "digits", "n_val": 5000}, "leaves no training images"),
        ({"source": "mnist"}, "source must be one of"),
    ],
)
def test_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        create_task("image_classification", **kwargs)


def test_a_model_of_the_wrong_shape_is_named(digits):
    model = create("vit-digits", n_classes=3, d_model=16, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="n_classes=10"):
        digits.loss(model, digits.get_batch("train", 0))


@pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR),
    reason="Fashion-MNIST not installed: apt-get install -y dataset-fashion-mnist",
)
def test_fashion_mnist_keeps_its_own_test_set():
    task = create_task("image_classification", source="fashion_mnist")
    assert len(task._splits["test"][1]) == 10000 and task.n_train == 55000
    assert task.classes[0] == "T-shirt/top" and task.flip


def test_settings_a_source_would_ignore_are_refused(tmp_path):
    """image_size=0 or 30 and data_dir=nodir were accepted and ignored with the built-in digits."""
    with pytest.raises(ValueError, match=r"source='digits' has 8x8 images \(got image_size=30\)"):
        create_task("image_classification", source="digits", image_size=30)
    with pytest.raises(ValueError, match="data_dir belongs to source='folder'"):
        create_task("image_classification", source="digits", data_dir=str(tmp_path / "nodir"))
    assert create_task("image_classification", source="digits", image_size=8).image_size == 8


def test_a_folder_is_split_by_class_every_class_kept_in_training(tmp_path, caplog):
    """Each class in its share of the test split and of test + val to within one image, every class in
    training, and a class too small for the evaluation splits named."""
    rng = np.random.default_rng(1)
    sizes = {"ants": 15, "bees": 15, "cats": 15, "dogs": 15, "eels": 2, "yaks": 1}
    for name, n in sizes.items():
        (tmp_path / name).mkdir()
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
                tmp_path / name / f"{i}.png"
            )
    with caplog.at_level("WARNING", logger="seqlab.tasks"):
        task = create_task(
            "image_classification", source="folder", data_dir=str(tmp_path), image_size=8, n_val=6
        )
    counts = {s: torch.bincount(task._splits[s][1], minlength=6).double() for s in ("train", "val", "test")}
    rest = torch.tensor(list(sizes.values())).double() - 1  # one image of each class is kept for training
    for held in (counts["test"], counts["test"] + counts["val"]):
        assert torch.all((held - rest * held.sum() / rest.sum()).abs() < 1), counts
    assert torch.all(counts["train"] >= 1), counts
    assert "class(es) have no test image" in caplog.text and "'yaks'" in caplog.text
