"""A missing package or data set stops `seqlab train` and `seqlab compare` before the first training step,
with one error line that names what to install."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from seqlab import commands_doctor
from seqlab.cli import main
from seqlab.training import Trainer

MNIST1D_INSTALL = "pip install mnist1d requests"
FASHION_INSTALL = "apt-get install -y dataset-fashion-mnist"


@pytest.fixture
def steps(monkeypatch) -> list[int]:
    """Counts training steps: a step that runs fails the test's assertion, not the machine's time."""
    ran: list[int] = []

    def train_step(self, *args, **kwargs):
        ran.append(1)
        raise AssertionError("a training step ran")

    monkeypatch.setattr(Trainer, "train_step", train_step)
    return ran


@pytest.fixture
def no_mnist1d(monkeypatch):
    """mnist1d unfindable and unimportable, as on a machine without the `lab` extra."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name.split(".")[0] == "mnist1d" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, "mnist1d", None)
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)


@pytest.fixture
def no_fashion_mnist(monkeypatch, tmp_path):
    """The Debian package's folder absent."""
    where = str(tmp_path / "no-fashion-mnist")
    monkeypatch.setitem(commands_doctor.DATA, "fashion-mnist", (where, FASHION_INSTALL))


def _train(tmp_path, *task: str) -> list[str]:
    return ["train", "--model.name=test-lm-lstm", "--train.steps=2", *task, "--out", str(tmp_path / "run")]


def test_train_on_mnist1d_without_it_names_the_install_line(no_mnist1d, steps, tmp_path, capsys):
    assert main(_train(tmp_path, "--task.name=seq_image", "--task.source=mnist1d")) == 2
    err = capsys.readouterr().err
    assert MNIST1D_INSTALL in err and "the task 'seq_image'" in err and "nothing was trained" in err
    assert steps == []
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_train_on_fashion_mnist_without_the_debian_package(no_fashion_mnist, steps, tmp_path, capsys):
    assert main(_train(tmp_path, "--task.name=seq_image")) == 2  # fashion_mnist is the default source
    assert FASHION_INSTALL in capsys.readouterr().err
    assert steps == []


def test_a_users_own_fashion_mnist_folder_needs_no_debian_package(no_fashion_mnist):
    assert commands_doctor.task_needs("seq_image", {"data_dir": "/data/fmnist"}) == ()
    assert commands_doctor.task_needs("seq_image", {}) == ("fashion-mnist",)


def test_compare_quick_without_mnist1d_stops_before_any_run(no_mnist1d, steps, tmp_path, capsys):
    out = tmp_path / "quick"
    assert main(["compare", "--suite", "quick", "--out", str(out), "--jobs", "1", "--mixers", "lstm"]) == 2
    err = capsys.readouterr().err
    assert "seqlab compare --suite quick" in err and MNIST1D_INSTALL in err
    assert steps == []
    assert not out.exists() or not any(out.rglob("*.json"))


def test_compare_needs_only_what_its_tasks_use(no_mnist1d):
    assert commands_doctor.suite_needs("quick") == ("mnist1d", "requests")
    assert commands_doctor.suite_needs("quick", ["shakespeare", "adding"]) == ()  # the corpus ships inside
    assert commands_doctor.suite_needs("speech")[0] == "espeak-ng"
    assert MNIST1D_INSTALL in commands_doctor.missing(commands_doctor.suite_needs("full"))


def test_the_shakespeare_task_needs_nothing_beyond_seqlab():
    assert commands_doctor.task_needs("shakespeare", {}) == ()
    assert commands_doctor.task_needs("text", {}) == ()
