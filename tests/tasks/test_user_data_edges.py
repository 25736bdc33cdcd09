"""A user's own data that gave silently wrong results or late errors: frame files in ffmpeg's order, colour
clips, shifts past the image, repeated WAV files, CTC transcripts longer than the model's frames, one-class and
huge series, the linear baseline at any level and scale, flags and fractions of the wrong type, unlabelled
clips, and a checkpoint's class names and statistics against the data rebuilt for it."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from seqlab.tasks import create_task
from seqlab.tasks.clip_files import read_clip_folder
from seqlab.tasks.speech_data import write_wav
from seqlab.tasks.speech_decode import ctc_frames_needed


def _labels(folder, rows: list[str]) -> None:
    (folder / "labels.csv").write_text("clip,action\n" + "\n".join(rows) + "\n", encoding="utf-8")


def _csv(path, columns: dict[str, list]) -> str:
    names = list(columns)
    lines = [",".join(names)] + [",".join(repr(v) if isinstance(v, float) else str(v) for v in row)
                                 for row in zip(*columns.values(), strict=True)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


# ---- video clips --------------------------------------------------------------------------------------------


def test_frame_images_are_read_in_natural_order_as_ffmpeg_numbers_them(tmp_path):
    (tmp_path / "c0").mkdir()
    for i in range(1, 13):  # frame1.png ... frame12.png: plain sorting puts frame10 before frame2
        Image.new("L", (8, 8), 20 * i).save(tmp_path / "c0" / f"frame{i}.png")
    _labels(tmp_path, ["c0,wave"])
    clips = read_clip_folder(tmp_path)
    assert clips.frames[0, :, 0, 0, 0].tolist() == [20 * i for i in range(1, 13)]


def _clip_folder(folder, n=12, colour=False, blank=()):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        frames = rng.integers(0, 255, (4, 8, 8, 3) if colour else (4, 8, 8), dtype=np.uint8)
        np.save(folder / f"c{i}.npy", frames)
        rows.append(f"c{i},{'' if i in blank else ('left', 'right')[i % 2]}")
    _labels(folder, rows)
    return str(folder)


def test_colour_clip_folders_keep_their_colour_unless_channels_is_set(tmp_path):
    path = _clip_folder(tmp_path, colour=True)
    task = create_task("video", source="folder", path=path, batch_size=2)
    assert task.clips["train"].frames.shape[2] == 3 and task.model_overrides()["in_channels"] == 3
    assert create_task("video", source="folder", path=path, channels=1).model_overrides()["in_channels"] == 1
    assert (
        create_task("video", n_frames=4, frame_size=16, n_train=4, n_eval=2).channels == 1
    )  # generated: grey


def test_unlabelled_clips_are_counted_and_every_split_needs_a_labelled_one(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        task = create_task(
            "video", source="folder", path=_clip_folder(tmp_path, 20, blank={0, 2}), batch_size=2
        )
    assert "2 of 20 clips have no action" in caplog.text
    batch = {"clips": task.get_batch("train", 0)["clips"], "y": torch.tensor([-1, -1])}
    model = _VideoModel(task.n_classes)
    loss, metrics, _ = task.loss(model, batch)
    assert loss.item() == 0.0 and metrics["loss"] == 0.0 and not torch.isnan(loss)
    loss.backward()  # a step on it changes nothing
    (tmp_path / "b").mkdir()
    # two labelled clips of 20: the split keeps both in training, and validation has none to score
    with pytest.raises(ValueError, match=r"none of the 2 val clips has one"):
        create_task("video", source="folder", path=_clip_folder(tmp_path / "b", 20, blank=set(range(2, 20))))


class _VideoModel(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.head = torch.nn.Linear(1, k)

    def forward(self, clips):
        return self.head(clips.mean((1, 2, 3, 4))[:, None])


# ---- images -------------------------------------------------------------------------------------------------


def _image_folder(root, classes=("cat", "dog"), per_class=5):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (6, 6), (i * 20, 0, 0)).save(root / c / f"{i}.png")
    return str(root)


def test_a_shift_past_half_the_image_is_refused(tmp_path):
    path = _image_folder(tmp_path)
    create_task("image_classification", source="folder", data_dir=path, image_size=8, shift=4)
    with pytest.raises(
        ValueError, match=r"shift=5 must be at most half the image side \(8 // 2 = 4 pixels\)"
    ):
        create_task("image_classification", source="folder", data_dir=path, image_size=8, shift=5)


@pytest.mark.parametrize("field", ["augment", "flip"])
@pytest.mark.parametrize("value", ["nope", "false", 1, None])
def test_flags_take_true_or_false_only(tmp_path, field, value):
    path = _image_folder(tmp_path)
    if field == "flip" and value is None:  # flip's None is its default (by source)
        return
    with pytest.raises(ValueError, match=rf"{field} must be true or false, got {value!r}"):
        create_task("image_classification", source="folder", data_dir=path, image_size=8, **{field: value})


# ---- speech -------------------------------------------------------------------------------------------------


def _tone(i, seconds=0.3, sr=16000):
    t = np.arange(int(sr * seconds)) / sr
    return (0.5 * np.sin(2 * np.pi * (300 + 50 * i) * t)).astype(np.float32)


def _speech_folder(path, texts, seconds=0.3, extra=""):
    path.mkdir(parents=True, exist_ok=True)
    for i in range(len(texts)):
        write_wav(path / f"u{i}.wav", _tone(i, seconds), 16000)
    lines = [f"u{i}.wav\t{t}" for i, t in enumerate(texts)]
    (path / "transcripts.txt").write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return str(path)


def test_a_wav_named_twice_in_the_transcripts_is_refused_with_both_lines(tmp_path):
    path = _speech_folder(tmp_path / "s", ["yes", "no"] * 6, extra="./u0.wav\tno\n")
    with pytest.raises(ValueError, match=r"line 13: './u0.wav' is named again \(first at line 1\)"):
        create_task("keywords", source="folder", path=path)


class _CTCModel(torch.nn.Module):
    """Uniform per-frame logits, ``subsample`` feature frames to an output frame."""

    def __init__(self, v, subsample):
        super().__init__()
        self.v, self.s = v, subsample
        self.bias = torch.nn.Parameter(torch.zeros(v))

    def output_lengths(self, lengths):
        return (lengths + self.s - 1) // self.s

    def forward(self, x, mask=None):
        t = int(self.output_lengths(torch.tensor(x.size(1))))
        return self.bias.expand(x.size(0), t, self.v)


def test_ctc_frames_needed_counts_a_blank_between_repeats():
    assert ctc_frames_needed([1, 2, 3]) == 3 and ctc_frames_needed([1, 1, 2, 2, 2]) == 8
    assert ctc_frames_needed([]) == 0


def test_ctc_transcripts_longer_than_the_output_frames_are_refused_or_counted(tmp_path, caplog):
    texts = ["ab", "ba", "abc", "cb", "ca", "bb", "ac", "cab", "bc", "ac", "cc", "aa"]
    task = create_task(
        "speech_ctc", source="folder", path=_speech_folder(tmp_path / "s", texts), batch_size=4
    )
    task.check_model(_CTCModel(len(task.vocabulary), 1))  # every transcript fits: nothing said
    with pytest.raises(ValueError, match=r"none of the \d+ train utterances has as many output frames"):
        task.check_model(_CTCModel(len(task.vocabulary), 10**6))  # one output frame each: none fits
    long = [*texts[:-2], "a" * 40, "b" * 40]  # 40 repeated labels need 79 frames of about 30
    task = create_task("speech_ctc", source="folder", path=_speech_folder(tmp_path / "l", long), batch_size=2)
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        task.check_model(_CTCModel(len(task.vocabulary), 1))
    assert "have fewer output frames than their transcripts need" in caplog.text
    split, rows = next((s, [i for i, t in enumerate(u.texts) if len(t) == 40]) for s, u in task.data.items()
                       if any(len(t) == 40 for t in u.texts))  # fmt: skip
    batch = task.rows_batch(task.data[split], torch.tensor(rows[:1]))  # a batch of only an unfit one
    with pytest.raises(ValueError, match=r"no utterance of this batch has as many output frames"):
        task.loss(_CTCModel(len(task.vocabulary), 1), batch)  # was a loss of 0.0: a perfect score


# ---- series -------------------------------------------------------------------------------------------------


def _series(n=300, seed=0):
    rng = np.random.default_rng(seed)
    y = np.zeros(n)
    for t in range(2, n):
        y[t] = 0.6 * y[t - 1] - 0.2 * y[t - 2] + rng.standard_normal()
    return y + 10 * np.sin(np.arange(n) / 6)


def test_the_linear_baseline_is_the_same_at_any_level_and_scale(tmp_path):
    t = np.arange(300)  # a seasonal series: its 24 lags are nearly collinear beside the intercept
    y = 10 + 3 * np.sin(2 * np.pi * t / 24) + 0.5 * np.random.default_rng(0).standard_normal(300)
    scores = []
    for k, values in enumerate((y, y + 1e6, y * 1e10)):
        path = _csv(tmp_path / f"s{k}.csv", {"value": values.tolist()})
        task = create_task("forecast", source=path, column="value")
        scores.append(task.baseline_scores("test")["linear_mase"])
    assert scores[1] == pytest.approx(scores[0], rel=1e-6) and scores[2] == pytest.approx(scores[0], rel=1e-6)


def test_values_whose_square_overflows_are_refused_where_they_are(tmp_path):
    values = _series().tolist()
    values[150] = 1e300
    path = _csv(tmp_path / "huge.csv", {"value": values})
    with pytest.raises(
        ValueError, match=r"holds 1e\+300 at data row 151 \(line 152 of the file\), which is beyond"
    ):
        create_task("forecast", source=path, column="value")


def test_series_classification_needs_two_classes_in_the_training_span(tmp_path):
    n = 300
    labels = ["sun"] * 220 + ["rain", "sun"] * 40  # rain only after the training span (70 %: rows 1-210)
    path = _csv(tmp_path / "w.csv", {"a": _series(n).tolist(), "b": _series(n, 1).tolist(), "w": labels})
    with pytest.raises(
        ValueError, match=r"training span \(data rows 1-210\) holds only the class\(es\) \['sun'\]"
    ):
        create_task("series_classification", source=path, label="w", features="a,b")


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ("forecast", "val_frac"),
        ("forecast", "test_frac"),
        ("series_classification", "val_frac"),
        ("text", "val_fraction"),
    ],
)
def test_a_fraction_that_is_not_a_number_is_a_clear_error(tmp_path, task, field):
    n = 300
    if task == "text":
        kwargs = {"source": str(tmp_path / "t.txt")}
        (tmp_path / "t.txt").write_text("hello world " * 100, encoding="utf-8")
    else:
        labels = ["sun", "rain"] * (n // 2)
        path = _csv(tmp_path / "s.csv", {"a": _series(n).tolist(), "b": _series(n, 1).tolist(), "w": labels})
        kwargs = (
            {"source": path, "column": "a"}
            if task == "forecast"
            else {"source": path, "label": "w", "features": "a,b"}
        )
    with pytest.raises(ValueError, match=rf"{field} must be a number in \(0, 1\), got 'abc'"):
        create_task(task, **kwargs, **{field: "abc"})
