"""Each user mistake on the command line is one `error:` line with exit status 2, found before any training."""

import pytest
import torch

from seqlab.cli import main

BASE = ["train", "--model.name=test-lstm-lm", "--task.name=adding", "--task.seq_len=8", "--train.steps=2"]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: "), err
    assert not any("Traceback" in line for line in err)
    return err[-1]


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("--train.steps=abc", "train.steps must be a positive integer, got 'abc'"),
        ("--train.steps=2.5", "train.steps must be a positive integer, got 2.5"),
        ("--train.steps=true", "train.steps must be a positive integer, got True"),
        ("--train.lr=inf", "train.lr must be a positive finite number"),
        ("--train.grad_clip=nan", "train.grad_clip must be a positive finite number"),
        ("--train.min_lr=-1", "train.min_lr must be a number >= 0"),
        ("--train.weight_decay=-5", "train.weight_decay must be a number >= 0"),
        ("--train.keep_checkpoints=-1", "train.keep_checkpoints must be an integer >= 0"),
        ("--train.progress=maybe", "train.progress must be true or false"),
        ("--train.max_minutes=-1", "train.max_minutes must be a positive finite number"),
        ("--train.beta2=1.5", "train.beta2 must be in [0, 1)"),
        ("--train.device=tpu", "train.device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        (
            "--model.d_input=10",
            "the task 'adding' fixes these model fields: model.d_input=10 (the task needs 2)",
        ),
    ],
)
def test_bad_values_are_one_error_line(capsys, tmp_path, arg, says):
    assert says in _error(capsys, [*BASE, arg, "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu(capsys, tmp_path):
    msg = _error(capsys, [*BASE, "--train.device=cuda", "--out", str(tmp_path / "run")])
    assert "no CUDA device" in msg


def test_bad_run_files_and_out_dirs(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: test-lstm-lm\ntask: [", encoding="utf-8")
    assert "is not valid YAML" in _error(capsys, ["train", str(bad)])
    number = tmp_path / "out.yaml"
    number.write_text("model: {name: test-lstm-lm}\ntask: {name: adding}\nout: 123\n", encoding="utf-8")
    assert "out must be a path (a string), got 123" in _error(capsys, ["train", str(number)])
    a_file = tmp_path / "a-file"
    a_file.write_text("mine", encoding="utf-8")
    assert "is a file" in _error(capsys, [*BASE, "--out", str(a_file)])
    assert "which is a file, not a directory" in _error(capsys, [*BASE, "--out", str(a_file / "run")])
    assert a_file.read_text(encoding="utf-8") == "mine"


def test_a_text_source_that_is_not_a_file(capsys, tmp_path):
    argv = [
        "train",
        "--model.name=test-lstm-lm",
        "--task.name=text",
        "--train.steps=1",
        "--out",
        str(tmp_path / "r"),
    ]
    assert "not a regular file" in _error(capsys, [*argv, "--task.source=/dev/zero"])
    assert "is a directory" in _error(capsys, [*argv, f"--task.source={tmp_path}"])


def test_damaged_checkpoints_without_a_manifest_are_clear_errors(capsys, tmp_path):
    """A checkpoint that no manifest vouches for (copied elsewhere, or written by 0.1) still fails clearly."""
    import json
    import shutil

    text = tmp_path / "t.txt"
    text.write_text("KING:\nhello there my lord\n" * 200, encoding="utf-8")
    run = tmp_path / "run"
    argv = [
        "train",
        "--model.name=test-gru-lm",
        "--task.name=text",
        f"--task.source={text}",
        "--train.steps=1",
    ]
    assert main([*argv, "--train.progress=false", "--out", str(run)]) == 0
    capsys.readouterr()
    ckpt = run / (run / "latest").read_text().strip()

    def damaged(name: str):
        copy = tmp_path / name
        shutil.copytree(ckpt, copy)
        return copy, copy / "model.safetensors", copy / "config.json", copy / "tokenizer.json"

    gen = ["generate", "--prompt", "KING", "--max-new-tokens", "3", "--checkpoint"]
    d, weights, _, _ = damaged("empty-weights")
    weights.write_bytes(b"")
    assert "cannot be read as safetensors" in _error(capsys, [*gen, str(d)])
    d, _, config, _ = damaged("list-config")
    config.write_text("[1, 2]", encoding="utf-8")
    assert "must be a JSON object with 'family'" in _error(capsys, [*gen, str(d)])
    d, _, config, _ = damaged("no-family")
    cfg = json.loads(config.read_text(encoding="utf-8"))
    del cfg["family"]
    config.write_text(json.dumps(cfg), encoding="utf-8")
    assert "must be a JSON object with 'family'" in _error(capsys, [*gen, str(d)])
    d, _, _, tok = damaged("small-tokenizer")
    tok.write_text('{"type": "char", "chars": "KING"}', encoding="utf-8")
    assert "the tokenizer has 4 tokens" in _error(capsys, [*gen, str(d)])


def test_a_model_the_tasks_cannot_train_and_a_diverging_run(capsys, tmp_path):
    msg = _error(
        capsys, ["train", "--model.name=test-bert", "--task.name=adding", "--out", str(tmp_path / "b")]
    )
    assert "is of family 'encoder'" in msg
    run = tmp_path / "n"
    argv = [
        *BASE[:-1],
        "--train.steps=4",
        "--train.save_every=1",
        "--train.lr=1e30",
        "--train.warmup_steps=0",
    ]
    msg = _error(capsys, [*argv, "--train.grad_clip=null", "--train.progress=false", "--out", str(run)])
    assert "loss is inf at step 2" in msg and "last good checkpoint is" in msg and "step-00000001" in msg
    assert "lower train.lr (now 1e+30) or set train.grad_clip." in msg
    msg = _error(
        capsys, [*argv, "--train.grad_clip=1.0", "--train.progress=false", "--out", str(tmp_path / "c")]
    )
    assert "lower train.lr (now 1e+30). " in msg and "grad_clip" not in msg  # it is set: not the advice


def _text_run(tmp_path) -> list[str]:
    """`seqlab train` of a tiny GRU LM on a small text file (the file written into ``tmp_path``)."""
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 200, encoding="utf-8")
    return [
        "train",
        "--model.name=test-gru-lm",
        "--task.name=text",
        f"--task.source={text}",
        "--task.seq_len=8",
    ]


def test_a_full_disk_during_a_save_loses_nothing(tmp_path, monkeypatch, capsys):
    """ENOSPC in the middle of writing a checkpoint: one error line, the previous checkpoint intact and still
    `latest`, no temporary directory left, and --resume (with space again) finishes the run."""
    from safetensors import SafetensorError

    from seqlab.training import state_tree

    run = tmp_path / "run"
    argv = _text_run(tmp_path)
    argv += ["--train.steps=6", "--train.save_every=3", "--train.progress=false", "--out", str(run)]
    real = state_tree.save_file
    calls = {"n": 0}

    def fill_the_disk(tensors, filename, *args, **kwargs):
        calls["n"] += 1
        if (
            calls["n"] > 2
        ):  # the second checkpoint's weights: half written, then no space, as safetensors says it
            with open(filename, "wb") as fh:
                fh.write(b"\0" * 100)
            raise SafetensorError(
                'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
                'device" })'
            )
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(state_tree, "save_file", fill_the_disk)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: could not write" in err and "model.safetensors" in err and "No space left on device" in err
    assert "Traceback" not in err and "a bug in seqlab" not in err
    assert (run / "latest").read_text().strip() == "checkpoints/step-00000003"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["manifest.json", "step-00000003"]
    monkeypatch.setattr(state_tree, "save_file", real)
    assert main([*argv, "--resume"]) == 0
    assert (run / "latest").read_text().strip() == "checkpoints/step-00000006"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]


@pytest.mark.parametrize(
    "name, said",
    [
        ("SEQLAB_DISABLE_KERNELS", "SEQLAB_DISABLE_KERNELS='bogus' names no kernel ['bogus']"),
        ("SEQLAB_GEMM", "SEQLAB_GEMM must be 'onednn', 'torch' or 'auto', got 'bogus'"),
    ],
)
def test_a_misspelt_kernel_switch_is_refused_before_anything_is_written(
    capsys, tmp_path, monkeypatch, name, said
):
    monkeypatch.setenv(name, "bogus")
    msg = _error(capsys, [*BASE, "--out", str(tmp_path / "run")])
    assert said in msg
    assert not (tmp_path / "run").exists()  # it was found at the first kernel, after the run folder was made


def test_an_output_that_cannot_be_written_is_found_before_step_1(tmp_path, monkeypatch, capsys):
    """A checkpoints/ folder that refuses new entries (immutable, read-only) or a folder named metrics.jsonl was
    found by the first save or log line, after the work; now before step 1, and the run is not touched."""
    import tempfile

    from seqlab.training import trainer

    argv = [*_text_run(tmp_path), "--train.steps=4", "--train.progress=false"]

    assert main([*argv, "--out", str(tmp_path / "b")]) == 0  # a run to resume, below
    capsys.readouterr()

    def never(*args, **kwargs):
        raise AssertionError("a step ran")

    monkeypatch.setattr(trainer.Trainer, "train_step", never)
    real = tempfile.mkdtemp

    def read_only(*args, dir=None, **kwargs):
        if dir is not None and str(dir).endswith("checkpoints"):
            raise PermissionError(1, "Operation not permitted", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    msg = _error(capsys, [*argv, "--out", str(tmp_path / "a")])
    assert (
        "cannot write the run in" in msg and "Operation not permitted" in msg and "nothing was trained" in msg
    )
    monkeypatch.setattr(tempfile, "mkdtemp", real)
    (tmp_path / "b" / "metrics.jsonl").unlink()
    (tmp_path / "b" / "metrics.jsonl").mkdir()  # a folder where the resumed run's log goes
    msg = _error(
        capsys,
        [*argv[:-2], "--train.steps=8", "--train.progress=false", "--out", str(tmp_path / "b"), "--resume"],
    )
    assert "cannot write the run in" in msg and "Is a directory" in msg


def test_training_that_cannot_fit_in_memory_is_refused_before_step_1(tmp_path, monkeypatch, capsys):
    """The weights fit, but not their gradients and AdamW's moments: said before step 1, not by the allocator."""
    import seqlab.models as models

    argv = [
        "train",
        "--model.name=test-lm-lstm",
        "--task.name=adding",
        "--train.steps=2",
        "--train.progress=false",
    ]
    n = models.count_parameters("test-lm-lstm", d_input=2, d_output=1)
    monkeypatch.setattr(models, "_available_bytes", lambda: 2 * 4 * n)  # room for the weights, not for 3 more
    msg = _error(capsys, [*argv, "--out", str(tmp_path / "a")])
    assert "needs" in msg and "for its gradients and AdamW's two moments" in msg and "available" in msg
    assert not list((tmp_path / "a").glob("checkpoints/step-*"))


def test_an_error_is_printed_below_an_open_progress_bar(capsys):
    """A run stopped by an error leaves its progress bar mid-line; the error line was printed at its end."""
    import sys

    from tqdm import tqdm

    from seqlab.console import say

    bar = tqdm(total=10, file=sys.stderr, desc="train")
    bar.update(3)
    say("error: boom")
    err = capsys.readouterr().err
    assert "\nerror: boom\n" in err and "3/10" in err.split("\nerror: boom")[0]


def test_a_reader_that_stops_reading_is_not_an_error():
    """`seqlab list | head -1`: the rest of the output has nowhere to go. It printed
    'error: [Errno 32] Broken pipe' and exited 2; now it stops quietly, as a command killed by SIGPIPE would."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "seqlab.cli", "list"], stdout=write, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")
