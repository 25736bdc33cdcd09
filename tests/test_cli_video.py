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
