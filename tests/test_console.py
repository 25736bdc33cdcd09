"""``seqlab.console``: a long silent step is named once it has taken a few seconds, a quick one never."""

import time

from seqlab.console import said_if_slow


def test_a_slow_step_is_said_with_its_time_and_a_quick_one_is_not(capsys):
    with said_if_slow("preparing the data", after=0.05):
        time.sleep(0.3)
    assert capsys.readouterr().err.splitlines() == [
        "preparing the data ...",
        "preparing the data: done in 0 s",
    ]
    with said_if_slow("preparing the data", after=5.0):
        pass
    assert capsys.readouterr().err == ""


def test_a_step_that_fails_is_closed_and_its_error_passes(capsys):
    try:
        with said_if_slow("reading", after=0.01):
            time.sleep(0.1)
            raise KeyError("x")
    except KeyError:
        pass
    else:
        raise AssertionError("the error was swallowed")
    assert "reading ..." in capsys.readouterr().err


def test_a_failed_allocation_is_named_as_out_of_memory_and_other_errors_are_not():
    import torch

    from seqlab.console import out_of_memory

    try:
        torch.empty(10**13, dtype=torch.uint8)  # 10 TB: torch's CPU allocator refuses it
    except RuntimeError as e:
        line = out_of_memory(e)
    else:
        raise AssertionError("a 10 TB allocation succeeded")
    assert line is not None and line.startswith("error: out of memory (an allocation of 10,000.0 GB failed)")
    assert "task.batch_size" in line
    import numpy as np

    try:
        np.empty((10**9, 3, 32, 32), np.uint8)  # numpy's MemoryError names the size in its own words
    except MemoryError as e:
        assert out_of_memory(e).startswith("error: out of memory (an allocation of 2.79 TiB failed)")
    assert out_of_memory(MemoryError()).startswith(
        "error: out of memory (an allocation of some memory failed)"
    )
    assert out_of_memory(RuntimeError("shape mismatch")) is None and out_of_memory(KeyError("x")) is None


def test_train_with_a_batch_too_large_for_memory_says_so_without_a_traceback(tmp_path, capsys, monkeypatch):
    import torch

    from seqlab.cli import main
    from seqlab.tasks.synthetic import AddingTask

    monkeypatch.setattr(
        AddingTask, "get_batch", lambda self, split, index: torch.empty(10**13, dtype=torch.uint8)
    )
    argv = [
        "train",
        "--model.name=test-lstm-lm",
        "--task.name=adding",
        "--train.steps=1",
        "--train.progress=false",
    ]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "error: out of memory (an allocation of 10,000.0 GB failed)" in err and "Traceback" not in err
