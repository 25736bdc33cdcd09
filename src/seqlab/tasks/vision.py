r"""Image classification for image models (the Vision Transformer): Fashion-MNIST, scikit-learn's digits, or a
folder of images sorted into one sub-folder per class.

Notation: ``b`` batch, ``c`` channels, ``S`` image side, ``K`` classes, ``N`` examples in a split.

Data (read from installed packages or the user's files, never downloaded):

    fashion_mnist   Debian ``dataset-fashion-mnist`` (apt-get install -y dataset-fashion-mnist): 60,000
                    training and 10,000 test images, 28×28 grey, 10 classes (Xiao et al. 2017, arXiv 1708.07747)
    digits          PyPI ``scikit-learn``: 1,797 images, 8×8 grey, 10 classes (``load_digits``)
    folder          ``data_dir/<class name>/<image>`` (PNG, JPEG, ... any mode), every image fitted into
                    ``image_size``×``image_size`` with its aspect kept; classes are the sorted sub-folder names

Splits, with no image in two of them: 'test' is the source's own test set (Fashion-MNIST's 10,000), or for
the sources without one a fixed random 20% (the same for every seed); 'val' is ``n_val`` images held out of the
training set (5,000 for Fashion-MNIST, else a tenth; the same for every seed, so validation numbers compare
across runs); 'train' is the rest. The digits' and a folder's splits are stratified
(``base.stratified_order``): each class in its share of every split, and every class in training.
Pixels are scaled to [0, 1] and standardized with the training split's mean and standard deviation per
channel. Training batches are augmented when ``augment`` is set: a random shift of up to ``shift`` pixels
(padded with the background: black for the datasets, the white canvas for folder images) and, with ``flip``,
a horizontal flip with probability 1/2. Before step 1 (``check_model``) a ViT with more than ``max_patches``
patch tokens per image ((image_size / patch_size)², 4,096 unless raised) is refused: attention's cost grows with
their square.

Batch: ``images`` (b, c, S, S) float, ``y`` (b,) long. The model maps images to logits (b, K); the loss is
the cross-entropy, the metrics ``loss`` and ``accuracy``. ``tokens_in`` counts images, so the trainer's
throughput reads images per second. Batch ``i`` of 'train' holds positions ``i b .. i b + b - 1`` of an endless
sequence of epochs, each a fresh permutation seeded by (seed, epoch); 'val' and 'test' batches run through
their split in order and wrap around: ``evaluate(model, task.eval_batches(split), split)`` sees each once.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import (
    Batch,
    MissingDependencyError,
    Task,
    channel_stats,
    check_bool,
    check_choice,
    check_index,
    check_int,
    check_output,
    check_split,
    epoch_rows,
    generator_for,
    model_device,
    stratified_order,
)
from seqlab.tasks.images import FASHION_MNIST_DIR, _load_fashion_mnist

__all__ = ["DARK_SOURCES", "MAX_PATCHES", "ImageClassificationTask", "check_patches"]

Source = Literal["fashion_mnist", "digits", "folder"]
_AUGMENT_STREAM = 1 << 40
log = logging.getLogger("seqlab.tasks")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"
)  # fmt: skip
DARK_SOURCES = ("digits", "fashion_mnist")
"""Sources whose images are light strokes on black; a folder's images sit on the white canvas of letterboxing."""
MIN_FOLDER_SIZE = 4
"""The smallest side a folder's images are fitted into (and at least twice ``shift``)."""
MAX_PATCHES = 4096
"""The most patch tokens per image a ViT trains on unless ``max_patches`` says more: a 64x64 grid (256 pixels at
patch 4, 1024 at patch 16). The ViTs of the literature take 196-1,369 (224/16 ... 518/14); attention's cost grows
with the square of the count, and on 2 CPU cores vit-tiny-p4 takes ~2 minutes for 8 images at 4,096 (6 s at
1,024), a single step of 62,500 (image_size=1000 at patch 4) far longer."""
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@lru_cache(maxsize=1)
def _load_digits() -> tuple[Tensor, Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise MissingDependencyError("the digits need scikit-learn: pip install scikit-learn") from e
    d = load_digits()
    images = torch.as_tensor(d.images * (255.0 / 16.0)).round().to(torch.uint8)  # (N, 8, 8), 0..16 -> 0..255
    return images.unsqueeze(1), torch.as_tensor(d.target, dtype=torch.long)  # (N, 1, 8, 8), (N,)


def _load_folder(root: str, image_size: int) -> tuple[Tensor, Tensor, list[str]]:
    from seqlab.tasks.image_files import load_images

    base = Path(root)
    if not base.is_dir():
        raise ValueError(f"data_dir {root!r} is not a folder of class sub-folders (data_dir/<class>/<image>)")
    classes = sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))  # no .git
    files = [
        (f, k)
        for k, name in enumerate(classes)
        for f in sorted((base / name).iterdir())
        if f.suffix.lower() in IMAGE_SUFFIXES
    ]
    empty = [name for k, name in enumerate(classes) if not any(c == k for _, c in files)]
    if empty and files:  # a class no image can teach (and a wrong class count for the model)
        raise ValueError(
            f"{root!r}: the class sub-folder(s) {empty} hold no image ({', '.join(sorted(IMAGE_SUFFIXES))}); "
            "add images or move them out of data_dir"
        )
    if len(classes) < 2 or not files:
        raise ValueError(
            f"{root!r} holds {len(classes)} class sub-folder(s) and {len(files)} image(s): image "
            "classification needs at least two sub-folders of images (data_dir/<class>/<image>.png)"
        )
    images = load_images([f for f, _ in files], image_size)  # (N, 3, S, S) uint8
    return images, torch.tensor([k for _, k in files]), classes


def _check_folder_size(image_size: Any, shift: int) -> int:
    """A folder's ``image_size`` of at least 4; a smaller one is told the real least side (4, or twice ``shift``
    when that is more), so that the shift's own check (:func:`_check_shift`) does not refuse the next try."""
    least = max(MIN_FOLDER_SIZE, 2 * shift)
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < MIN_FOLDER_SIZE:
        why = (
            f" (twice task.shift={shift}, the augmentation's largest shift)"
            if least > MIN_FOLDER_SIZE
            else ""
        )
        raise ValueError(f"task.image_size must be an integer >= {least}{why}, got {image_size!r}")
    return image_size


def _check_shift(shift: int, image_size: int) -> None:
    if shift > image_size // 2:  # a shift past the image leaves only the background
        raise ValueError(
            f"shift={shift} must be at most half the image side ({image_size} // 2 = "
            f"{image_size // 2} pixels): a larger shift blanks many training images"
        )


def _in_words(n: int) -> str:
    return f"{n / 1e9:.1f} billion" if n >= 10**9 else f"{n / 1e6:.1f} million" if n >= 10**6 else f"{n:,}"


def check_patches(model, max_patches: int) -> None:
    """A ViT (or a captioner's ViT encoder) attends over (image_size / patch_size)² patch tokens per image, every
    pair of them in every layer: above ``max_patches`` a ValueError with the count and the settings that lower it
    (a step of 62,500 tokens ran for minutes, unannounced). Reads ``model.config`` only; other models pass."""
    c = getattr(model, "config", None)
    patch, size = getattr(c, "patch_size", None), getattr(c, "image_size", None)
    if not isinstance(patch, int) or not isinstance(size, int) or getattr(c, "encoder", "vit") != "vit":
        return
    n = (size // patch) ** 2
    if n <= max_patches:
        return
    side = math.isqrt(max_patches) * patch  # the largest image_size that keeps the patch size
    bigger = next(p for p in range(patch + 1, size + 1) if size % p == 0 and (size // p) ** 2 <= max_patches)
    raise ValueError(
        f"task.image_size={size} in patches of model.patch_size={patch} is a {size // patch}x{size // patch} "
        f"grid: {n:,} patch tokens per image, more than task.max_patches={max_patches:,}; attention compares "
        f"every pair of them ({_in_words(n * n)} per image in each layer), its time and memory growing with that "
        f"square (62,500 tokens took minutes per step). "
        f"Lower task.image_size (at most {side} at this patch size), raise model.patch_size (e.g. {bigger}), "
        f"or raise task.max_patches if this machine can take it"
    )


class ImageClassificationTask(Task):
    """Classify whole images; see the module docstring. Trains the families that map images to classes."""

    name = "image_classification"
    model_families = ("vit",)
    derived = ("n_classes", "n_train", "image_size", "in_channels", "baseline_loss")

    def __init__(
        self,
        source: Source = "fashion_mnist",
        batch_size: int = 128,
        seed: int = 0,
        n_val: int | None = None,
        augment: bool = True,
        shift: int = 2,
        flip: bool | None = None,
        image_size: int | None = None,
        data_dir: str | None = None,
        max_patches: int = MAX_PATCHES,
    ):
        check_choice("source", source, Source)
        self.source, self.seed = source, check_int("seed", seed, 0)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.augment, self.shift = check_bool("augment", augment), check_int("shift", shift, 0)
        # digits are not mirror-symmetric
        self.flip = source == "fashion_mnist" if flip is None else check_bool("flip", flip)
        self.max_patches = check_int("max_patches", max_patches, 1)
        if source == "folder" and data_dir is None:
            raise ValueError("source='folder' needs data_dir=PATH, a folder with one sub-folder per class")
        if source == "digits" and data_dir is not None:  # it would be ignored: the digits are generated
            raise ValueError(
                "data_dir belongs to source='folder' (or 'fashion_mnist'); the digits are built in"
            )
        given_size, image_size = image_size, 32 if image_size is None else image_size
        if source == "folder":  # both checked before any image is read
            _check_shift(self.shift, _check_folder_size(image_size, self.shift))
        self.data_dir = data_dir or (FASHION_MNIST_DIR if source == "fashion_mnist" else None)
        train, test = self._load(source, image_size)
        self.image_size = train[0].shape[-1] if source != "folder" else image_size
        _check_shift(self.shift, self.image_size)
        if given_size not in (None, self.image_size):  # it would be ignored: these images have their own size
            raise ValueError(
                f"image_size sizes source='folder' images; source={source!r} has {self.image_size}x"
                f"{self.image_size} images (got image_size={given_size})"
            )
        # None: Fashion-MNIST's customary 5,000, else a tenth of the training images
        n_val = (
            (5000 if source == "fashion_mnist" else max(1, len(train[1]) // 10)) if n_val is None else n_val
        )
        self.n_val = check_int("n_val", n_val, 1)
        if self.n_val >= len(train[1]):
            raise ValueError(
                f"n_val={n_val} leaves no training images: {source} has {len(train[1])} for training"
            )
        self._splits = {
            "train": (train[0][self.n_val :], train[1][self.n_val :]),
            "val": (train[0][: self.n_val], train[1][: self.n_val]),
            "test": test,
        }
        self._warn_missing_classes()
        mean, std = channel_stats(self._splits["train"][0], channel_dim=1)  # of (N, c, S, S): (c,) each
        self._mean, self._std = mean.view(1, -1, 1, 1), std.clamp_min(1e-6).view(1, -1, 1, 1)  # (1, c, 1, 1)

    def _load(self, source: str, image_size: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """(train, test) as (images uint8 (N, c, S, S), labels (N,)); sets ``classes``."""
        self.classes = [str(k) for k in range(10)]
        if source == "fashion_mnist":
            self.classes = list(FASHION_MNIST_CLASSES)
            data = _load_fashion_mnist(self.data_dir)
            (x, y), (x_test, y_test) = data["train"], data["test"]
            return (x.unsqueeze(1), y), (x_test.unsqueeze(1), y_test)  # (N, 1, 28, 28)
        if source == "digits":
            images, labels = _load_digits()
        else:
            images, labels, self.classes = _load_folder(self.data_dir, image_size)
        # a fixed 20% test split, the same for every seed, each class in its share; one image of every class
        # at the end, in training (the validation images come from the front of the rest)
        order = stratified_order(labels, 12345).flip(0)
        cut = len(labels) // 5
        if cut == 0:  # an empty test split trained, then failed in eval and viz
            raise ValueError(
                f"{self.data_dir} holds {len(labels)} images: its 20% test split needs at least 5; add images"
            )
        return (images[order[cut:]], labels[order[cut:]]), (images[order[:cut]], labels[order[:cut]])

    def check_model(self, model) -> None:
        """Before step 1: the ViT's patch tokens per image against ``max_patches`` (:func:`check_patches`)."""
        check_patches(model, self.max_patches)

    def _warn_missing_classes(self) -> None:
        """Say which classes have too few images to appear in the validation or test split."""
        for split in ("val", "test"):
            counts = torch.bincount(self._splits[split][1], minlength=len(self.classes))
            missing = [self.classes[k] for k in torch.nonzero(counts == 0).flatten().tolist()]
            if missing:
                shown = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
                log.warning(
                    "%d class(es) have no %s image (too few images to split): %s; its accuracy leaves them out",
                    len(missing),
                    split,
                    shown,
                )

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def n_train(self) -> int:
        return len(self._splits["train"][1])

    @property
    def in_channels(self) -> int:
        return self._splits["train"][0].shape[1]

    @property
    def baseline_loss(self) -> float:
        return math.log(self.n_classes)

    def model_overrides(self) -> dict[str, Any]:
        return {"n_classes": self.n_classes, "in_channels": self.in_channels, "image_size": self.image_size}

    def eval_batches(self, split: str = "val") -> int:
        """Batches that cover a split once: ceil(N / batch_size)."""
        return -(-len(self._splits[check_split(split)][1]) // self.batch_size)

    def tokens_in(self, batch: Batch) -> int:
        return batch["images"].shape[0]

    def _augment(self, x: Tensor, g: torch.Generator) -> Tensor:
        """Random shifts of up to ``shift`` pixels (padded with the images' background) and horizontal flips,
        per image."""
        b, _, h, w = x.shape
        s = self.shift
        if s:
            background = 0.0 if self.source in DARK_SOURCES else 1.0  # the folder images' white canvas
            padded = F.pad(x, (s, s, s, s), value=background)
            dy, dx = torch.randint(0, 2 * s + 1, (2, b), generator=g)
            x = torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(b)])
        if self.flip:
            flip = torch.rand(b, generator=g) < 0.5
            x = torch.where(flip.view(b, 1, 1, 1), x.flip(-1), x)
        return x

    def get_batch(self, split: str, index: int) -> Batch:
        index, split = check_index(index), check_split(split)
        images, labels = self._splits[split]
        n, b = len(labels), self.batch_size
        if split == "train":
            rows = epoch_rows(self.seed, n, index, b)
        else:
            rows = torch.arange(index * b, index * b + b) % n  # in order, wrapping around
        x = images[rows].float() / 255.0  # (b, c, S, S) in [0, 1]
        if split == "train" and self.augment:
            # a stream apart from the epochs' permutations (seeded by (seed, 'train', epoch))
            x = self._augment(x, generator_for(self.seed + _AUGMENT_STREAM, "train", index))
        return {"images": (x - self._mean) / self._std, "y": labels[rows].clone()}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        device = model_device(model)
        x, y = batch["images"].to(device), batch["y"].to(device)
        what = f"(b, n_classes={self.n_classes})"
        logits = check_output("image_classification", model(x), (x.shape[0], self.n_classes), what).float()
        loss = F.cross_entropy(logits, y)
        with torch.no_grad():
            accuracy = (logits.argmax(-1) == y).float().mean()
        return loss, {"loss": loss.item(), "accuracy": accuracy.item()}, None

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        """Loss and accuracy over the first ``max_batches`` batches of ``split``, each image counted once
        (the last batch of a split wraps around: its repeats are left out)."""
        check_int("max_batches", max_batches, 1)
        n = min(len(self._splits[check_split(split)][1]), max_batches * self.batch_size)
        was_training = model.training
        model.eval()
        loss = correct = seen = 0.0
        try:
            for index in range(max_batches):
                batch = self.get_batch(split, index)
                keep = min(self.batch_size, n - int(seen))
                if keep <= 0:
                    break
                x, y = (
                    batch["images"][:keep].to(model_device(model)),
                    batch["y"][:keep].to(model_device(model)),
                )
                logits = model(x).float()
                loss += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(-1) == y).sum().item()
                seen += keep
        finally:
            model.train(was_training)
        return {f"{split}_loss": loss / seen, f"{split}_accuracy": correct / seen}

    def mean_std(self) -> tuple[list[float], list[float]]:
        """The per-channel standardization (training split), to apply to a user's images the same way."""
        return self._mean.flatten().tolist(), self._std.flatten().tolist()

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["classes"] = self.classes
        info["mean"], info["std"] = self.mean_std()
        return info
