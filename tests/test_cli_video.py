"""`seqlab train` on the video task, `seqlab viz video`, `seqlab compare --suite video` errors."""

import pytest

from seqlab.cli import main

DATA = [
    "--task.name=video",
    "--task.n_frames=8",
    "--task.frame_size=16",
    "--task.n_train=64",
    "--task.n_eval=16",
]
TRAIN = ["--train.steps=4", "--train.eval_every=0", "--train.progress=false", "--task.batch_size=8"]


def _train(out, model, *extra):
    assert main(["train", f"--model.name={model}", *DATA, *TRAIN, *extra, "--out", str(out)]) == 0


def test_viz_video_frames_and_actions(tmp_path, capsys):
    _train(tmp_path / "frames", "test-video-frames", "--task.label=frames")
    png = tmp_path / "frames.png"
    assert (
        main(["viz", "video", "--checkpoint", str(tmp_path / "frames"), "--clip", "3", "--out", str(png)])
        == 0
    )
    assert png.stat().st_size > 0 and "frame events" in capsys.readouterr().out
    _train(tmp_path / "action", "test-video")
    assert (
        main(["viz", "video", "--checkpoint", str(tmp_path / "action"), "--out", str(tmp_path / "a.png")])
        == 0
    )
    assert "action: true " in capsys.readouterr().out


def test_viz_video_caption_draws_the_attention_over_frames(tmp_path, capsys):
    _train(tmp_path / "cap", "test-video-caption", "--task.label=caption")
    png = tmp_path / "cap.png"
    assert (
        main(["viz", "video", "--checkpoint", str(tmp_path / "cap"), "--split", "val", "--out", str(png)])
        == 0
    )
    out = capsys.readouterr().out
    assert "true: the " in out and "predicted:" in out and png.stat().st_size > 0


def test_viz_video_errors(tmp_path, capsys):
    _train(tmp_path / "action", "test-video")
    assert main(["viz", "video", "--checkpoint", str(tmp_path / "action"), "--clip", "99"]) == 2
    assert "the test split has 16 clips (0..15)" in capsys.readouterr().err
    assert main(["compare", "--suite", "video", "--minutes", "2", "--out", str(tmp_path / "c")]) == 2
    assert "the video suite counts steps" in capsys.readouterr().err
    assert main(["compare", "--suite", "video", "--mixers", "xlstm", "--out", str(tmp_path / "c")]) == 2
    assert "unknown video suite mixer" in capsys.readouterr().err


def test_a_clip_folder_with_unequal_frames_fails_before_training(tmp_path, capsys):
    import numpy as np

    folder = tmp_path / "clips"
    folder.mkdir()
    for i in range(12):
        np.save(folder / f"c{i}.npy", np.zeros((8, 20 if i == 7 else 16, 16), dtype=np.uint8))
    rows = "".join(f"c{i},{'wave' if i % 2 else 'jump'}\n" for i in range(12))
    (folder / "labels.csv").write_text("clip,action\n" + rows, encoding="utf-8")
    args = [
        "train",
        "--model.name=test-video",
        "--task.name=video",
        "--task.source=folder",
        f"--task.path={folder}",
    ]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "c7" in err and "16" in err and "20" in err, err
    with pytest.raises(AssertionError):
        assert (tmp_path / "run" / "latest").exists()


def test_viz_video_refuses_a_clip_folder_changed_since_training(tmp_path, capsys):
    import numpy as np

    folder = tmp_path / "clips"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rows = ["clip,action"]
    for i in range(12):
        np.save(folder / f"c{i}.npy", rng.integers(0, 255, (5, 16, 16), dtype=np.uint8))
        rows.append(f"c{i},{['jump', 'run', 'sit'][i % 3]}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    args = [
        "--model.name=test-video",
        "--task.name=video",
        "--task.source=folder",
        f"--task.path={folder}",
        *TRAIN,
    ]
    assert main(["train", *args, "--out", str(out)]) == 0
    assert main(["viz", "video", "--checkpoint", str(out), "--out", str(tmp_path / "a.png")]) == 0
    (folder / "labels.csv").write_text(
        "\n".join(rows).replace("c0,jump", "c0,aardvark") + "\n", encoding="utf-8"
    )
    capsys.readouterr()
    assert main(["viz", "video", "--checkpoint", str(out), "--out", str(tmp_path / "b.png")]) == 2
    assert "changed since the checkpoint was trained on it: class_names is now" in capsys.readouterr().err


def test_classify_answers_as_the_task_predicts_for_clips_and_frames(tmp_path, capsys):
    """A test clip saved as .npy and as a folder of PNG frames gets the action (and the per-frame events) that
    the task's own predict gives it; a clip of another size is fitted, one of another length refused."""
    import numpy as np
    from PIL import Image

    from seqlab.tasks import create_task
    from seqlab.training.checkpoint import load_model

    task = create_task("video", n_frames=8, frame_size=16, n_train=64, n_eval=16)
    clip = task.clips["test"].frames[0]  # (t, 1, 16, 16) uint8
    np.save(tmp_path / "c.npy", clip[:, 0].numpy())
    (tmp_path / "c").mkdir()
    for i, frame in enumerate(clip[:, 0].numpy()):
        Image.fromarray(frame).save(tmp_path / "c" / f"frame{i + 1}.png")
    files = [str(tmp_path / "c.npy"), str(tmp_path / "c")]
    for model, label, extra in (
        ("test-video", "action", []),
        ("test-video-frames", "frames", ["--task.label=frames"]),
    ):
        _train(tmp_path / label, model, *extra)
        capsys.readouterr()  # the training's own lines
        task = create_task("video", label=label, n_frames=8, frame_size=16, n_train=64, n_eval=16)
        expected = task.predict(
            load_model(next((tmp_path / label).glob("checkpoints/step-*"))).eval(), clip[None]
        )
        names = [task.class_names[i] for i in expected.flatten().tolist()]
        assert main(["classify", "--checkpoint", str(tmp_path / label), *files]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        for f, line in zip(files, lines, strict=True):
            path, answer = line.split("\t")
            got = answer.split(" (p = ")[0] if label == "action" else answer
            assert path == f and got == " ".join(names), (line, names)
    np.save(tmp_path / "big.npy", np.zeros((8, 40, 30, 3), dtype=np.uint8))  # colour, not square: fitted
    assert (
        main(["classify", "--checkpoint", str(tmp_path / "action"), "--top", "2", str(tmp_path / "big.npy")])
        == 0
    )
    assert capsys.readouterr().out.count("(p = ") == 2
    np.save(tmp_path / "short.npy", np.zeros((5, 16, 16), dtype=np.uint8))
    cases = [
        (
            ["--checkpoint", str(tmp_path / "action"), str(tmp_path / "short.npy")],
            "has 5 frames; the model was trained on 8",
        ),
        (
            ["--checkpoint", str(tmp_path / "frames"), "--top", "2", files[0]],
            "--top applies to an action model",
        ),
        (
            ["--checkpoint", str(tmp_path / "action"), str(tmp_path / "none.npy")],
            "neither a .npy clip nor a folder",
        ),
    ]
    for argv, match in cases:
        assert main(["classify", *argv]) == 2
        err = capsys.readouterr()
        assert match in err.err and err.out == "", (argv, err)
