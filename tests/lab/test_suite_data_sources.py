"""The speech and video suites on a user's folder: they pass the task only the settings that apply to it (the
suite's corpus or clip sizes are left out, which the task would refuse), the video suite leaves out and refuses
its task 'long', and their tables say what a folder run trained and was scored on."""

import numpy as np
import pytest

import seqlab.lab.speech as speech_lab
import seqlab.lab.video as video_lab
from seqlab.run import build_task
from seqlab.tasks.speech_data import write_wav


def _speech_folder(path, n=12, sr=8000):
    """``n`` short tones, two words."""
    path.mkdir()
    lines = []
    for i in range(n):
        t = np.arange(int(0.3 * sr)) / sr
        write_wav(
            path / f"u{i}.wav", (0.5 * np.sin(2 * np.pi * (300 + 600 * (i % 2)) * t)).astype(np.float32), sr
        )
        lines.append(f"u{i}.wav\t{'yes' if i % 2 else 'no'}")
    (path / "transcripts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _clip_folder(path, n=12):
    path.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        np.save(path / f"c{i}.npy", rng.integers(0, 255, (5, 16, 16), dtype=np.uint8))
    rows = "".join(f"c{i},{'wave' if i % 2 else 'jump'}\n" for i in range(n))
    (path / "labels.csv").write_text("clip,action\n" + rows, encoding="utf-8")
    return path


def test_the_speech_suite_passes_a_folder_no_corpus_sizes(tmp_path, monkeypatch):
    folder = {"source": "folder", "path": str(_speech_folder(tmp_path / "f"))}
    monkeypatch.setattr(
        speech_lab, "TASK", {"n_train": 200, "n_eval": 40, "batch_size": 4}
    )  # not the defaults
    for name in ("keywords", "digits"):
        fields = speech_lab._task_fields(name, folder, 0)
        assert "n_train" not in fields and "n_eval" not in fields and fields["batch_size"] == 4
        assert build_task({"task": fields}).n_utterances["train"] == 9
    assert speech_lab._task_fields("keywords", {}, 0)["n_train"] == 200  # the generated corpus keeps them
    with pytest.raises(ValueError, match=r"^task.n_train=16 does not apply to source='folder'"):
        build_task(
            {"task": speech_lab._task_fields("keywords", {**folder, "n_train": 16}, 0)}
        )  # the caller's


def test_the_video_suite_passes_a_folder_no_clip_settings_and_leaves_out_long(tmp_path, monkeypatch):
    folder = {"source": "folder", "path": str(_clip_folder(tmp_path / "c"))}
    monkeypatch.setattr(video_lab, "TASK", {**video_lab.TASK, "n_train": 64, "n_eval": 16})
    fields = video_lab._task_fields("action", folder, 0)
    assert not {"n_train", "n_eval", "setting"} & set(fields)
    assert build_task({"task": fields}).n_clips == {"train": 9, "val": 1, "test": 2}
    assert video_lab._task_fields("long", {}, 0)["setting"] == "long"
    assert video_lab._suite_tasks(None, folder) == ["action", "frames", "caption"]
    with pytest.raises(
        ValueError, match="the video suite's task 'long' is the long setting of the generated"
    ):
        video_lab.compare_video(tmp_path / "out", ["lstm"], ["action", "long"], data=folder)
    assert not (tmp_path / "out").exists()  # refused before any run


def test_the_speech_table_says_what_a_folder_run_trained_and_scored_on(tmp_path):
    """It said "3000 training utterances per task ... spoken by espeak-ng voice variants" for any data."""
    data = {"source": "folder", "path": "/data/mine", "batch_size": 4}
    record = {"contender": "lstm", "d_model": 64, "params": 1000, "steps": 2, "ms_per_step": 5.0}
    records = [
        {**record, "task": "keywords", "data": data, "n_train": 9, "n_test": 2, "test": {"acc": 0.5}},
        {**record, "task": "digits", "data": data, "n_train": 9, "n_test": 2, "test": {"cer": 0.5}},
    ]
    table = speech_lab.write_table(tmp_path, records, 1.0).read_text(encoding="utf-8")
    assert "9 training utterances per task" in table and "(keywords 2, digits 2 utterances)" in table
    assert "from /data/mine, by speakers (or files) held out of training" in table and "espeak" not in table
    records[1]["n_train"] = 7
    table = speech_lab.write_table(tmp_path, records, 1.0).read_text(encoding="utf-8")
    assert "training utterances keywords 9, digits 7" in table


def test_the_video_table_says_what_a_folder_run_trained_and_scored_on(tmp_path):
    """It said "clips of 16 frames (32×32 grey), 4000 training clips" for any data."""
    record = {"contender": "lstm", "params": 1000, "steps": 2, "ms_per_step": 5.0, "test": {"acc": 0.5}}
    data = {"source": "folder", "path": "/data/clips", "batch_size": 4}
    records = [{**record, "task": "action", "data": data, "n_train": 9, "n_test": 2, "clips": (5, 16, 3)}]
    table = video_lab.write_table(tmp_path, records, 1.0).read_text(encoding="utf-8")
    assert (
        "4 clips of 5 frames (16×16 colour), 9 training clips" in table and "Metrics on 2 test clips" in table
    )
