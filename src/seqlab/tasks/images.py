r"""Sequence classification from images read one step at a time: sequential Fashion-MNIST and MNIST-1D.

Reading an image as a sequence turns it into a long-range classification problem: the model sees the image
one row (or one pixel) at a time and must give the class at the end. Row by row it is 28 steps of 28
features; pixel by pixel it is 784 steps of 1 feature, the "sequential MNIST" setting of Le, Jaitly & Hinton
(2015, "A Simple Way to Initialize Recurrent Networks of Rectified Linear Units", arXiv:1504.00941), here
on Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747), which is harder than the digits.
MNIST-1D (Greydanus & Kobak 2020, arXiv:2011.14439) is a procedurally generated 1-D analogue: 40 steps of
1 feature, 4,000 training and 1,000 test sequences, small enough to train in seconds on a CPU.

Data (read from installed packages, never downloaded):

    fashion_mnist   Debian ``dataset-fashion-mnist``:  apt-get install -y dataset-fashion-mnist
                    IDX files in /usr/share/datasets/fashion-mnist; 60,000 train, 10,000 test images
    mnist1d         PyPI ``mnist1d`` (needs ``requests``):  pip install mnist1d requests
                    built offline with make_dataset(get_dataset_args()), the package's standard seed 42

Notation: ``b`` batch, ``t`` time (steps), ``f`` features per step, ``N`` examples in a split.

The decoded arrays are cached in memory per process (``functools.lru_cache``). Features are standardized
with the mean and standard deviation of the training split (one scalar each). The validation and test
splits both read the held-out test set of the source, in order.
"""

from __future__ import annotations

import gzip
import math
import os
import random
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import (
    Batch,
    MissingDependencyError,
    Task,
    check_choice,
    check_index,
    check_int,
    check_output,
    check_split,
    epoch_rows,
    model_device,
)

__all__ = ["FASHION_MNIST_DIR", "SequentialImageTask", "read_idx"]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_INSTALL = "apt-get install -y dataset-fashion-mnist"
MNIST1D_INSTALL = "pip install mnist1d requests"

N_CLASSES = 10
Source = Literal["fashion_mnist", "mnist1d"]
Mode = Literal["rows", "pixels"] | None

# IDX type codes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"); multi-byte types are big-endian.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> Tensor:
    """Read an IDX file (gzip-compressed or not) into a tensor of its declared shape and type.

    Layout: 2 zero bytes, a type code (0x08 = uint8), the number of dimensions n, then n big-endian uint32
    sizes and the data, row-major. So an image file (n = 3) has a 16-byte header, a label file (n = 1) 8.
    """
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":  # gzip magic
        data = gzip.decompress(data)
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file: bad magic number {data[:4].hex()!r}")
    dtype, ndim = np.dtype(_IDX_DTYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(
            f"{path}: IDX header declares {ndim} dimensions but the file ends at byte {len(data)}"
        )
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(f"{path}: IDX shape {shape} needs {expected} bytes, the file has {len(data)}")
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return torch.from_numpy(array.astype(dtype.newbyteorder("="), copy=True))


def _idx_path(data_dir: str, stem: str) -> str:
    for name in (f"{stem}.gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    raise MissingDependencyError(
        f"Fashion-MNIST not found: no {stem}.gz in {data_dir}. Install it with: {FASHION_MNIST_INSTALL}"
    )


@lru_cache(maxsize=4)
def _load_fashion_mnist(data_dir: str) -> dict[str, Any]:
    """uint8 images (N, 28, 28) and int64 labels (N,) for 'train' and 'test', and the training pixel stats."""
    data: dict[str, Any] = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_idx_path(data_dir, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_idx_path(data_dir, f"{prefix}-labels-idx1-ubyte")).long()
        if images.ndim != 3 or labels.shape != images.shape[:1]:
            raise ValueError(
                f"Fashion-MNIST {split} files in {data_dir} disagree: images {tuple(images.shape)}, "
                f"labels {tuple(labels.shape)}"
            )
        if labels.min() < 0 or labels.max() >= N_CLASSES:
            raise ValueError(f"Fashion-MNIST {split} labels in {data_dir} fall outside 0..{N_CLASSES - 1}")
        data[split] = (images, labels)
    # Exact pixel mean and standard deviation from the 256-bin histogram (no float copy of 47M pixels).
    counts = torch.bincount(data["train"][0].flatten(), minlength=256).double()  # (256,)
    levels = torch.arange(256, dtype=torch.float64) / 255.0  # (256,)
    n, mean = counts.sum(), (counts * levels).sum() / counts.sum()
    std = ((counts * (levels - mean) ** 2).sum() / (n - 1)).sqrt()
    data["scale"], data["mean"], data["std"] = 1.0 / 255.0, mean.item(), std.item()
    return data


@lru_cache(maxsize=1)
def _load_mnist1d() -> dict[str, Any]:
    """float32 signals (N, 40) and int64 labels (N,) for 'train' (4,000) and 'test' (1,000), and the stats."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as e:
        raise MissingDependencyError(
            f"MNIST-1D needs the mnist1d package. Install it with: {MNIST1D_INSTALL}"
        ) from e
    # make_dataset reseeds Python's and NumPy's global generators (mnist1d.utils.set_seed); put them back.
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        raw = make_dataset(get_dataset_args())  # offline; get_dataset() would download
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    data: dict[str, Any] = {
        "train": (
            torch.as_tensor(raw["x"], dtype=torch.float32),
            torch.as_tensor(raw["y"], dtype=torch.long),
        ),
        "test": (
            torch.as_tensor(raw["x_test"], dtype=torch.float32),
            torch.as_tensor(raw["y_test"], dtype=torch.long),
        ),
    }
    signals = data["train"][0].double()
    data["scale"], data["mean"], data["std"] = 1.0, signals.mean().item(), signals.std().item()
    return data


class SequentialImageTask(Task):
    r"""Classify an image read as a sequence; the class is read from the output at the last step.

    Input ``x`` (b, t, f), float, standardized with the training split's mean and standard deviation:

        source="fashion_mnist", mode="rows"    t = 28,  f = 28   (one image row per step)
        source="fashion_mnist", mode="pixels"  t = 784, f = 1    (raster order, "sequential MNIST")
        source="mnist1d"                       t = 40,  f = 1    (mode "pixels", its only mode)

    Target ``y`` (b,), the class in 0..9. The model maps ``x`` to (b, t, 10); the logits at the last step
    give the prediction (a causal model has then seen the whole image), the loss is their cross-entropy.

    Batches: training batch ``i`` holds positions ``i*b .. i*b+b-1`` of an endless sequence of epochs, each
    a fresh permutation of the training set (seeded by the task's seed and the epoch), so every example is
    seen once per epoch. ``n_train`` keeps a fixed random subset (seeded by ``seed``) of the training set.
    Validation batch ``i`` holds test examples ``i*b ..`` in file order (wrapping around), so
    ``evaluate(model, max_batches=task.n_val_batches)`` covers the whole test set once.

    Chance baseline: a uniform prediction scores ``baseline_loss = log(10) ≈ 2.303``; both test sets are
    class-balanced (1,000 and ~100 per class), so guessing scores accuracy 0.1.

    Metrics: ``loss`` and ``accuracy``.
    """

    name = "seq_image"
    derived = ("n_val", "n_steps", "n_features", "feature_mean", "feature_std", "baseline_loss")

    baseline_loss = math.log(N_CLASSES)
    """Cross-entropy of the uniform prediction over the 10 classes."""

    def __init__(
        self,
        source: Source = "fashion_mnist",
        mode: Mode = None,
        batch_size: int = 32,
        seed: int = 0,
        n_train: int | None = None,
        data_dir: str | None = None,
    ):
        check_choice("source", source, Source)
        check_choice("mode", mode, Mode)  # None: the source's default
        if source == "mnist1d" and mode == "rows":
            raise ValueError(
                "mnist1d is a 1-D signal read one value per step: mode must be 'pixels' (or None)"
            )
        if source == "mnist1d" and data_dir is not None:
            raise ValueError(
                "data_dir applies to source='fashion_mnist' only; mnist1d is built by its package"
            )
        self.source = source
        self.mode: str = mode or ("rows" if source == "fashion_mnist" else "pixels")
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.data_dir = (data_dir or FASHION_MNIST_DIR) if source == "fashion_mnist" else None
        data = _load_fashion_mnist(self.data_dir) if self.data_dir is not None else _load_mnist1d()
        self._data = data
        n_all = data["train"][0].shape[0]
        if n_train is not None:
            check_int("n_train", n_train, 1)
            if n_train > n_all:
                raise ValueError(f"n_train={n_train} exceeds the {n_all} training examples of {source}")
        self.n_train = n_all if n_train is None else n_train
        subset_g = torch.Generator().manual_seed(self.seed)
        self._train_rows = (
            torch.arange(n_all) if n_train is None else torch.randperm(n_all, generator=subset_g)[:n_train]
        )

    @property
    def n_steps(self) -> int:
        item_shape = self._data["train"][0].shape[1:]
        return item_shape[0] if self.mode == "rows" else math.prod(item_shape)

    @property
    def n_features(self) -> int:
        return self._data["train"][0].shape[2] if self.mode == "rows" else 1

    @property
    def max_seq_len(self) -> int:
        return self.n_steps

    @property
    def n_val(self) -> int:
        return self._data["test"][0].shape[0]

    @property
    def n_val_batches(self) -> int:
        """Validation batches that cover the test set once: ceil(n_val / batch_size)."""
        return -(-self.n_val // self.batch_size)

    def model_overrides(self) -> dict[str, Any]:
        return {"d_input": self.n_features, "d_output": N_CLASSES}

    def _features(self, raw: Tensor) -> Tensor:
        """Raw examples (b, ...) -> standardized float32 sequences (b, t, f)."""
        x = (raw.float() * self._data["scale"] - self._data["mean"]) / self._data["std"]
        return x.reshape(raw.shape[0], self.n_steps, self.n_features)  # (b, t, f)

    def get_batch(self, split: str, index: int) -> Batch:
        index, split = check_index(index), check_split(split)
        b = self.batch_size
        if split == "train":
            images, labels = self._data["train"]
            rows = self._train_rows[epoch_rows(self.seed, self.n_train, index, b)]
        else:
            images, labels = self._data["test"]
            rows = torch.arange(index * b, index * b + b) % images.shape[0]  # in order, wrapping around
        return {"x": self._features(images[rows]), "y": labels[rows].clone()}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        device = model_device(model)
        x, y = batch["x"].to(device), batch["y"].to(device)
        b, t, _ = x.shape
        out = check_output(
            "SequentialImageTask", model(x), (b, t, N_CLASSES), f"(b, t, d_output={N_CLASSES})"
        )
        logits = out[:, -1].float()  # (b, 10) the class is read at the last step
        loss = F.cross_entropy(logits, y)
        with torch.no_grad():
            accuracy = (logits.argmax(dim=-1) == y).float().mean()
        return loss, {"loss": loss.item(), "accuracy": accuracy.item()}, None

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        """Loss and accuracy over the first ``max_batches`` batches of the held-out images, each image counted
        once (fewer batches when they cover them all; the last batch's wrap-around repeats left out)."""
        check_int("max_batches", max_batches, 1)
        check_split(split)
        n = min(self.n_val, max_batches * self.batch_size)
        was_training = getattr(model, "training", False)
        model.eval()
        try:
            totals: dict[str, float] = {}
            for index in range(-(-n // self.batch_size)):
                batch = self.get_batch(split, index)
                keep = min(self.batch_size, n - index * self.batch_size)
                _, metrics, _ = self.loss(model, {k: v[:keep] for k, v in batch.items()})
                totals = {k: totals.get(k, 0.0) + v * keep for k, v in metrics.items()}
        finally:
            model.train(was_training)
        return {f"{split}_{k}": v / n for k, v in totals.items()}

    @property
    def feature_mean(self) -> float:
        return self._data["mean"]

    @property
    def feature_std(self) -> float:
        return self._data["std"]

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        if info["data_dir"] is None:
            del info["data_dir"]  # mnist1d is built by its package
        return info
