"""Sequential image classification: the IDX reader, batching, features and loss on tiny synthetic files,
and the real Fashion-MNIST and MNIST-1D where their packages are installed."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import struct
import sys

import numpy as np
import pytest
import torch
from torch import nn

from seqlab.tasks import create_task
from seqlab.tasks.images import FASHION_MNIST_DIR, SequentialImageTask, _load_mnist1d, read_idx

N_TRAIN, N_TEST, H, W = 40, 12, 4, 5  # a non-square image tells rows from columns


def write_idx(path, array: np.ndarray, type_code: int, compress: bool) -> None:
    """An IDX file written by hand: 0, 0, type code, ndim, big-endian uint32 sizes, big-endian data."""
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    with open(path, "wb") as f:
        f.write(gzip.compress(payload) if compress else payload)


@pytest.fixture(scope="module")
def tiny_fashion(tmp_path_factory):
    """A Fashion-MNIST-shaped folder: image i has first pixel i (its identity) and label i % 10."""
    folder = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    for prefix, n, offset in (("train", N_TRAIN, 0), ("t10k", N_TEST, 100)):
        images = rng.integers(0, 256, size=(n, H, W), dtype=np.uint8)
        images[:, 0, 0] = np.arange(offset, offset + n)
        labels = (np.arange(offset, offset + n) % 10).astype(np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images, 0x08, compress=True)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, 0x08, compress=False)  # plain also works
    return str(folder)


def identities(task: SequentialImageTask, x: torch.Tensor) -> list[int]:
    """Undo the standardization of the first pixel: which stored image each row of the batch is."""
    first = x[:, 0, 0] * task.describe()["feature_std"] + task.describe()["feature_mean"]
    return torch.round(first * 255).long().tolist()


def stream(task: SequentialImageTask, split: str, batches) -> list[int]:
    """Identities of the examples in the given batches of a split, concatenated."""
    return [i for index in batches for i in identities(task, task.get_batch(split, index)["x"])]


class LastStepOracle(nn.Module):
    """Knows the tiny data's rule (label = identity % 10) and answers at the last step only."""

    def __init__(self, task: SequentialImageTask, at_last: bool = True):
        super().__init__()
        self.task, self.at_last = task, at_last

    def forward(self, x):
        b, t, _ = x.shape
        labels = torch.tensor(identities(self.task, x)) % 10
        out = torch.zeros(b, t, 10)
        out[:, -1 if self.at_last else 0] = 50.0 * nn.functional.one_hot(labels, 10).float()
        return out


class LastStepLinear(nn.Module):
    def __init__(self, d_input: int):
        super().__init__()
        self.proj = nn.Linear(d_input, 10)

    def forward(self, x):
        return self.proj(x)


# ---- the IDX reader --------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_round_trips_images_and_labels(tmp_path, compress):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "images", images, 0x08, compress)
    write_idx(tmp_path / "labels", np.array([7, 3], dtype=np.uint8), 0x08, compress)
    got = read_idx(tmp_path / "images")
    assert got.dtype == torch.uint8 and got.shape == (2, 3, 4)
    assert torch.equal(got, torch.from_numpy(images))
    assert read_idx(tmp_path / "labels").tolist() == [7, 3]
    raw = (tmp_path / "images").read_bytes()
    if not compress:  # the documented header sizes: 16 bytes for 3 dimensions, 8 for 1
        assert len(raw) == 16 + 24 and len((tmp_path / "labels").read_bytes()) == 8 + 2


def test_read_idx_handles_big_endian_multibyte_types(tmp_path):
    values = np.array([[1, -2, 300], [-32768, 32767, 0]], dtype=np.int16)
    write_idx(tmp_path / "shorts", values, 0x0B, compress=False)
    assert read_idx(tmp_path / "shorts").tolist() == values.tolist()
    floats = np.array([0.5, -1.25, 3e5], dtype=np.float32)
    write_idx(tmp_path / "floats", floats, 0x0D, compress=True)
    assert read_idx(tmp_path / "floats").tolist() == floats.tolist()


def test_read_idx_rejects_broken_files(tmp_path):
    (tmp_path / "text").write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "text")
    write_idx(tmp_path / "short", np.zeros((3, 2), dtype=np.uint8), 0x08, compress=False)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"shape \(3, 2\) needs 18 bytes, the file has 17"):
        read_idx(tmp_path / "short")


# ---- the task on the tiny synthetic folder ---------------------------------------------------------------


def test_rows_and_pixels_read_the_image_in_raster_order(tiny_fashion):
    rows = SequentialImageTask(mode="rows", batch_size=6, data_dir=tiny_fashion)
    pixels = SequentialImageTask(mode="pixels", batch_size=6, data_dir=tiny_fashion)
    assert (rows.n_steps, rows.n_features, rows.max_seq_len) == (H, W, H)
    assert (pixels.n_steps, pixels.n_features) == (H * W, 1)
    assert rows.model_overrides() == {"d_input": W, "d_output": 10}
    assert pixels.model_overrides() == {"d_input": 1, "d_output": 10}
    xr, yr = rows.get_batch("val", 0).values()
    xp, yp = pixels.get_batch("val", 0).values()
    assert xr.shape == (6, H, W) and xp.shape == (6, H * W, 1) and xr.dtype == torch.float32
    assert yr.dtype == torch.long and torch.equal(yr, yp)
    torch.testing.assert_close(xr.reshape(6, -1), xp.reshape(6, -1), rtol=0, atol=0)
    images = read_idx(os.path.join(tiny_fashion, "t10k-images-idx3-ubyte.gz"))[:6].double() / 255
    train = read_idx(os.path.join(tiny_fashion, "train-images-idx3-ubyte.gz")).double() / 255
    expected = (images - train.mean()) / train.std()  # standardized with the training split's statistics
    torch.testing.assert_close(xr.double(), expected, rtol=1e-5, atol=1e-5)


def test_validation_reads_the_test_set_in_order_and_wraps(tiny_fashion):
    task = SequentialImageTask(batch_size=5, data_dir=tiny_fashion)
    assert task.n_val == N_TEST and task.n_val_batches == 3
    assert stream(task, "val", range(3)) == [100 + i % N_TEST for i in range(15)]
    assert task.get_batch("test", 1)["y"].tolist() == [(100 + i) % 10 for i in range(5, 10)]


def test_evaluation_counts_each_test_image_once(tiny_fashion):
    """It drew max_batches batches, wrapping around: 1,000 batches weighted some test images 4 times over."""
    task = SequentialImageTask(batch_size=5, data_dir=tiny_fashion)  # 12 test images: 3 batches, one short

    def model(x):  # logits that always name class 3
        return torch.zeros(x.shape[0], x.shape[1], 10).index_fill_(2, torch.tensor([3]), 1.0)

    model.eval = model.train = lambda *a: None
    labels = torch.tensor([(100 + i) % 10 for i in range(N_TEST)])
    for max_batches in (1, 3, 1000):
        n = min(N_TEST, 5 * max_batches)
        scores = task.evaluate(model, max_batches, split="val")
        assert scores["val_accuracy"] == pytest.approx((labels[:n] == 3).float().mean().item())


def test_training_epochs_are_permutations(tiny_fashion):
    task = SequentialImageTask(batch_size=8, seed=3, data_dir=tiny_fashion)
    epoch = stream(task, "train", range(N_TRAIN // 8))
    assert sorted(epoch) == list(range(N_TRAIN)) and epoch != list(range(N_TRAIN))  # once each, shuffled
    next_epoch = stream(task, "train", range(5, 10))
    assert sorted(next_epoch) == list(range(N_TRAIN)) and next_epoch != epoch
    straddling = SequentialImageTask(batch_size=7, seed=3, data_dir=tiny_fashion)
    ids = stream(straddling, "train", range(12))
    assert sorted(ids[:N_TRAIN]) == list(range(N_TRAIN))  # batches that span two epochs still cover them
    assert sorted(ids[N_TRAIN : 2 * N_TRAIN]) == list(range(N_TRAIN))
    assert straddling.get_batch("train", 5)["y"].tolist() == [i % 10 for i in ids[35:42]]  # labels follow


def test_n_train_keeps_a_fixed_subset(tiny_fashion):
    task = SequentialImageTask(batch_size=4, n_train=10, data_dir=tiny_fashion)
    ids = stream(task, "train", range(10))
    subset = sorted(set(ids))
    assert len(subset) == 10  # four epochs over the same ten examples, each once per epoch
    assert all(sorted(ids[e * 10 : e * 10 + 10]) == subset for e in range(4))
    again = SequentialImageTask(batch_size=4, n_train=10, data_dir=tiny_fashion)
    assert torch.equal(task.get_batch("train", 4)["x"], again.get_batch("train", 4)["x"])
    other = SequentialImageTask(batch_size=4, n_train=10, seed=1, data_dir=tiny_fashion)
    other_ids = stream(other, "train", range(10))
    assert set(other_ids) != set(ids)
    assert task.describe()["n_train"] == 10 and task.n_val == N_TEST  # validation is never subsampled


def test_determinism_and_splits_differ(tiny_fashion):
    a = SequentialImageTask(batch_size=6, seed=4, data_dir=tiny_fashion)
    b = SequentialImageTask(batch_size=6, seed=4, data_dir=tiny_fashion)
    assert torch.equal(a.get_batch("train", 2)["x"], b.get_batch("train", 2)["x"])
    assert not torch.equal(a.get_batch("train", 2)["x"], a.get_batch("val", 2)["x"])
    assert not torch.equal(a.get_batch("train", 2)["x"], a.get_batch("train", 3)["x"])
    c = SequentialImageTask(batch_size=6, seed=5, data_dir=tiny_fashion)
    assert not torch.equal(a.get_batch("train", 0)["x"], c.get_batch("train", 0)["x"])


def test_loss_reads_the_last_step(tiny_fashion):
    task = SequentialImageTask(mode="pixels", batch_size=6, data_dir=tiny_fashion)
    batch = task.get_batch("train", 0)
    _, metrics, state = task.loss(LastStepOracle(task), batch)
    assert state is None and metrics["accuracy"] == 1.0 and metrics["loss"] < 1e-6
    _, metrics, _ = task.loss(LastStepOracle(task, at_last=False), batch)  # right answer, wrong step
    assert metrics["loss"] == pytest.approx(math.log(10), rel=1e-5)  # all-zero logits at the end
    assert metrics["loss"] == pytest.approx(task.baseline_loss, rel=1e-5)
    result = task.evaluate(LastStepOracle(task), max_batches=task.n_val_batches)
    assert result == pytest.approx({"val_loss": 0.0, "val_accuracy": 1.0}, abs=1e-6)


def test_loss_backpropagates_and_rejects_wrong_output(tiny_fashion):
    task = SequentialImageTask(batch_size=4, data_dir=tiny_fashion)
    model = LastStepLinear(task.n_features)
    loss, metrics, _ = task.loss(model, task.get_batch("train", 0))
    assert loss.ndim == 0 and metrics["loss"] == pytest.approx(loss.item())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(ValueError, match=r"\(4, 4, 10\).*model_overrides"):
        task.loss(lambda x: torch.zeros(4, 4, 9), task.get_batch("train", 0))


def test_describe_and_registry(tiny_fashion):
    task = create_task("seq_image", mode="pixels", batch_size=3, seed=2, data_dir=tiny_fashion)
    info = json.loads(json.dumps(task.describe()))
    assert info["name"] == "seq_image" and info["source"] == "fashion_mnist" and info["mode"] == "pixels"
    assert (info["n_steps"], info["n_features"], info["n_train"], info["n_val"]) == (
        H * W,
        1,
        N_TRAIN,
        N_TEST,
    )
    assert info["data_dir"] == tiny_fashion and info["baseline_loss"] == pytest.approx(math.log(10))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": "mnist"}, r"source must be one of \('fashion_mnist', 'mnist1d'\), got 'mnist'"),
        ({"mode": "columns"}, r"mode must be one of \('rows', 'pixels', None\), got 'columns'"),
        ({"source": "mnist1d", "mode": "rows"}, "mnist1d is a 1-D signal.*mode must be 'pixels'"),
        ({"source": "mnist1d", "data_dir": "/tmp"}, "data_dir applies to source='fashion_mnist' only"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"n_train": 0}, "n_train must be an integer >= 1, got 0"),
        ({"n_train": N_TRAIN + 1}, f"n_train={N_TRAIN + 1} exceeds the {N_TRAIN} training examples"),
    ],
)
def test_argument_errors(tiny_fashion, kwargs, message):
    kwargs = {"data_dir": tiny_fashion, **kwargs}
    with pytest.raises(ValueError, match=message):
        SequentialImageTask(**kwargs)


def test_get_batch_errors(tiny_fashion):
    task = SequentialImageTask(data_dir=tiny_fashion)
    with pytest.raises(ValueError, match="split must be"):
        task.get_batch("dev", 0)
    with pytest.raises(ValueError, match="non-negative integer, got -2"):
        task.get_batch("val", -2)


def test_missing_data_says_how_to_install(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="apt-get install -y dataset-fashion-mnist"):
        SequentialImageTask(data_dir=str(tmp_path))
    monkeypatch.setitem(sys.modules, "mnist1d", None)  # makes `import mnist1d` raise ImportError
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(RuntimeError, match="pip install mnist1d requests"):
        _load_mnist1d.__wrapped__()  # bypass the cache


# ---- the real data, where installed ----------------------------------------------------------------------

HAVE_FASHION = os.path.isfile(os.path.join(FASHION_MNIST_DIR, "t10k-labels-idx1-ubyte.gz"))


@pytest.mark.skipif(not HAVE_FASHION, reason="needs: apt-get install -y dataset-fashion-mnist")
def test_real_fashion_mnist():
    task = SequentialImageTask(batch_size=16)
    assert task.n_train == 60_000 and task.n_val == 10_000
    assert (task.n_steps, task.n_features) == (28, 28)
    info = task.describe()
    assert info["feature_mean"] == pytest.approx(0.2860, abs=1e-3)
    assert info["feature_std"] == pytest.approx(0.3530, abs=1e-3)
    x, y = task.get_batch("train", 0).values()
    assert x.shape == (16, 28, 28) and y.shape == (16,) and ((y >= 0) & (y < 10)).all()
    labels = torch.cat([task.get_batch("val", i)["y"] for i in range(task.n_val_batches)])[: task.n_val]
    assert torch.bincount(labels, minlength=10).tolist() == [1000] * 10  # balanced: chance accuracy 0.1
    pixels = SequentialImageTask(mode="pixels", batch_size=2)
    assert pixels.get_batch("val", 0)["x"].shape == (2, 784, 1)


def test_real_mnist1d_is_built_offline_and_leaves_global_rngs_alone():
    pytest.importorskip("mnist1d", reason="needs: pip install mnist1d requests")
    _load_mnist1d.cache_clear()  # build here, so the generator check below sees the build
    random.seed(123)
    np.random.seed(123)
    task = SequentialImageTask(source="mnist1d", batch_size=8)
    assert (random.random(), np.random.rand()) == (
        random.Random(123).random(),
        np.random.RandomState(123).rand(),
    )
    assert (task.n_train, task.n_val, task.n_steps, task.n_features, task.mode) == (
        4000,
        1000,
        40,
        1,
        "pixels",
    )
    assert task.model_overrides() == {"d_input": 1, "d_output": 10}
    x, y = task.get_batch("train", 0).values()
    assert x.shape == (8, 40, 1) and x.dtype == torch.float32 and ((y >= 0) & (y < 10)).all()
    train = torch.cat([task.get_batch("train", i)["x"] for i in range(500)])  # one epoch
    assert abs(train.mean().item()) < 1e-3 and abs(train.std().item() - 1) < 1e-3
