"""The helpers every task shares: one check per kind of argument, describe() from the constructor."""

from typing import Literal

import pytest

from seqlab.tasks.base import Task, check_choice, check_int
from seqlab.tasks.synthetic import AddingTask, CopyTask


def test_check_choice_reads_the_literal_type():
    assert check_choice("sampling", "random", Literal["stream", "random"]) == "random"
    assert check_choice("mode", None, Literal["rows", "pixels"] | None) is None
    with pytest.raises(ValueError, match=r"mode must be one of \('rows', 'pixels', None\), got 'cols'"):
        check_choice("mode", "cols", Literal["rows", "pixels"] | None)
    with pytest.raises(ValueError, match="seq_len must be an integer >= 2, got True"):
        check_int("seq_len", True, 2)


def test_describe_reports_the_constructor_arguments_and_the_derived_numbers():
    assert AddingTask(seq_len=7, batch_size=3, seed=1).describe() == {
        "name": "adding",
        "seq_len": 7,
        "batch_size": 3,
        "seed": 1,
        "baseline_mse": 1 / 6,
    }
    info = CopyTask(n_symbols=4).describe()
    assert info["vocab_size"] == 6 and info["n_symbols"] == 4 and "copy_len" in info
    assert Task().describe() == {"name": "task"}


def test_text_sampling_is_checked(tmp_path):
    from seqlab.tasks.text import CharLMTask

    path = tmp_path / "t.txt"
    path.write_text("abcdefgh" * 200, encoding="utf-8")
    with pytest.raises(ValueError, match=r"sampling must be one of \('stream', 'random'\), got 'shuffle'"):
        CharLMTask(source=str(path), sampling="shuffle")
