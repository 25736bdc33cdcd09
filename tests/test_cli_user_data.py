"""`seqlab train`, `eval` and `--resume` on a user's data: a renamed class folder or a rescaled series refused
against the checkpoint, override values kept as text for text fields, YAML mistakes as one error line, and the
summary line's small numbers."""

from __future__ import annotations

import json
import shutil

import numpy as np
from PIL import Image

from seqlab.cli import main
from test_cli_errors import _error  # the same folder (pytest puts it on sys.path)

QUICK = ["--train.steps=2", "--train.eval_batches=1", "--train.progress=false", "--train.warmup_steps=0"]


def _images(root):
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (6, 6), (i * 40, 100 if c == "cat" else 0, 0)).save(root / c / f"{i}.png")
    return root


def test_eval_and_resume_refuse_a_renamed_class_folder(tmp_path, capsys):
    data, out = _images(tmp_path / "imgs"), tmp_path / "run"
    train = ["train", "--model.name=test-vit", "--task.name=image_classification", "--task.source=folder"]
    train += [f"--task.data_dir={data}", "--task.batch_size=4", "--task.image_size=8", *QUICK]
    assert main([*train, "--out", str(out)]) == 0
    shutil.move(data / "cat", data / "zebra")  # the same images: ids now dog=0, zebra=1 (were cat=0, dog=1)
    said = _error(capsys, ["eval", "--checkpoint", str(out), "--split", "test"])
    assert "its classes are new ['zebra'], missing ['cat']" in said and str(data) in said
    said = _error(capsys, [*train[:-1], "--train.steps=4", "--out", str(out), "--resume"])
    assert "its classes are new ['zebra'], missing ['cat']" in said


def _series_csv(path, scale=1.0):
    t = np.arange(200)
    values = scale * (10 + np.sin(t / 5) + 0.1 * np.cos(t / 3))
    path.write_text("value\n" + "\n".join(repr(float(v)) for v in values) + "\n", encoding="utf-8")
    return path


def test_eval_refuses_a_series_rescaled_since_training(tmp_path, capsys):
    csv, out = _series_csv(tmp_path / "s.csv"), tmp_path / "ts"
    argv = ["train", "--model.name=test-lm-lstm", "--task.name=forecast", f"--task.source={csv}"]
    assert (
        main(
            [*argv, "--task.column=value", "--task.context=8", "--task.horizon=2", *QUICK, "--out", str(out)]
        )
        == 0
    )
    _series_csv(csv, scale=100.0)  # the same number of rows
    said = _error(capsys, ["eval", "--checkpoint", str(out)])
    assert "the training span's mean is now" in said


def test_the_summary_keeps_four_significant_digits_of_small_metrics(tmp_path, capsys):
    csv = _series_csv(tmp_path / "tiny.csv", scale=1e-30)
    argv = ["train", "--model.name=test-lm-lstm", "--task.name=forecast", f"--task.source={csv}"]
    assert (
        main(
            [
                *argv,
                "--task.column=value",
                "--task.context=8",
                "--task.horizon=2",
                *QUICK,
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < summary["val_mae"] < 1e-28  # 4 decimals printed 0.0


def test_text_fields_keep_the_text_typed_and_yaml_mistakes_are_one_error_line(tmp_path, capsys):
    rows = [f"{np.sin(i / 5):.4f},{np.cos(i / 7):.4f},{i % 5}" for i in range(200)]
    csv = tmp_path / "numhdr.csv"
    csv.write_text("2020,yes,@sensor\n" + "\n".join(rows) + "\n", encoding="utf-8")
    argv = ["train", "--model.name=test-lm-lstm", "--task.name=forecast", f"--task.source={csv}"]
    argv += ["--task.context=8", "--task.horizon=2", *QUICK]
    for k, column in enumerate(("2020", "yes", "@sensor", '"2020"')):
        assert main([*argv, f"--task.column={column}", "--out", str(tmp_path / f"r{k}")]) == 0
    config = json.loads(next((tmp_path / "r1").glob("checkpoints/step-*/config.json")).read_text("utf-8"))
    assert config["task"]["column"] == "yes"
    said = _error(capsys, [*argv, "--task.context=@8", "--out", str(tmp_path / "bad")])
    assert said.startswith("error: --task.context=@8: not a valid value (")


def test_a_file_named_like_a_number_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "1984").write_text("to be or not to be " * 200, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    text = [
        "train",
        "--model.name=test-lstm-lm",
        "--task.name=text",
        "--task.source=1984",
        "--task.seq_len=16",
    ]
    assert main([*text, *QUICK, "--out", str(tmp_path / "t")]) == 0  # was: expected str, ..., not int
