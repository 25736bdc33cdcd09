"""Reading the user's clips from a folder: .npy and PNG clips, labels, resizing, channels, and every error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from seqlab.tasks.clip_files import read_clip_folder
from seqlab.tasks.clips import EVENTS, make_clips


def write_labels(folder, text: str):
    (folder / "labels.csv").write_text(text, encoding="utf-8")


def write_png_clip(folder, name: str, values, size=(8, 8), mode="L"):
    """A folder of frames, each a uniform image of one value, named so that filename order is frame order."""
    (folder / name).mkdir()
    for i, v in enumerate(values):
        Image.new(mode, size, v).save(folder / name / f"frame_{i:02d}.png")


def test_npy_and_png_clips_with_every_label(tmp_path):
    grey = np.arange(4 * 8 * 8, dtype=np.uint8).reshape(4, 8, 8)
    np.save(tmp_path / "a.npy", grey)
    np.save(tmp_path / "b.npy", np.full((4, 8, 8, 1), 0.5, dtype=np.float32))
    write_png_clip(tmp_path, "c", [10, 20, 30, 40])
    write_labels(
        tmp_path,
        "clip,action,caption,events,notes\n"
        "a,wave,a hand waves,appeared moving moving turned,x\n"
        "b,jump,,,\n"
        "c,wave,a dot,appeared still still absent,\n",
    )
    clips = read_clip_folder(tmp_path)
    assert clips.frames.shape == (3, 4, 1, 8, 8) and clips.frames.dtype == torch.uint8
    assert torch.equal(clips.frames[0, :, 0], torch.from_numpy(grey))
    assert (clips.frames[1] == 128).all()  # 0.5 * 255 rounded
    assert clips.frames[2, :, 0, 0, 0].tolist() == [10, 20, 30, 40]  # filename order
    assert clips.action_names == ("jump", "wave") and clips.actions.tolist() == [1, 0, 1]
    assert clips.captions == ["a hand waves", "", "a dot"]
    assert clips.events[0].tolist() == [EVENTS.index(e) for e in ("appeared", "moving", "moving", "turned")]
    assert clips.events[1].tolist() == [-1] * 4 and clips.events[2, -1] == EVENTS.index("absent")


def test_generated_clips_round_trip_through_a_folder(tmp_path):
    made = make_clips(3, n_frames=8, frame_size=24, channels=3, n_objects=2)
    lines = ["clip,action,caption,events"]
    for i in range(3):
        np.save(tmp_path / f"clip{i}.npy", made.frames[i].permute(0, 2, 3, 1).numpy())  # (t, s, s, c)
        events = " ".join(EVENTS[e] for e in made.events[i])
        lines.append(f"clip{i},{made.action_names[made.actions[i]]},{made.captions[i]},{events}")
    write_labels(tmp_path, "\n".join(lines) + "\n")
    clips = read_clip_folder(tmp_path)
    assert torch.equal(clips.frames, made.frames) and torch.equal(clips.events, made.events)
    assert clips.captions == made.captions


def test_labels_without_optional_columns_and_channel_conversion(tmp_path):
    write_png_clip(tmp_path, "red", [(255, 0, 0)] * 3, mode="RGB")
    np.save(tmp_path / "grey.npy", np.full((3, 8, 8), 90, dtype=np.uint8))
    write_labels(tmp_path, "clip\nred\ngrey\n")
    clips = read_clip_folder(tmp_path)  # one colour clip makes the folder colour
    assert clips.frames.shape == (2, 3, 3, 8, 8) and clips.action_names == ()
    assert clips.actions.tolist() == [-1, -1] and (clips.events == -1).all() and clips.captions == ["", ""]
    assert clips.frames[0, 0, :, 0, 0].tolist() == [255, 0, 0] and (clips.frames[1] == 90).all()
    grey = read_clip_folder(tmp_path, channels=1)
    assert grey.frames.shape == (2, 3, 1, 8, 8) and (grey.frames[0] == 76).all()  # Pillow's luma of red


def test_frame_size_resizes_clips_of_different_sizes(tmp_path):
    write_png_clip(tmp_path, "wide", [200] * 2, size=(20, 10))
    np.save(tmp_path / "small.npy", np.full((2, 6, 6, 3), 50, dtype=np.uint8))
    write_labels(tmp_path, "clip\nwide\nsmall\n")
    clips = read_clip_folder(tmp_path, frame_size=12)
    assert clips.frames.shape == (2, 2, 1, 12, 12)  # the colour .npy is grey: equal channels
    assert (clips.frames[0] == 200).all() and (clips.frames[1] == 50).all()


def test_missing_labels_file_column_or_folder(tmp_path):
    with pytest.raises(ValueError, match=r"labels\.csv does not exist"):
        read_clip_folder(tmp_path)
    write_labels(tmp_path, "name,action\na,wave\n")
    with pytest.raises(ValueError, match=r"labels\.csv: the header lacks column 'clip'"):
        read_clip_folder(tmp_path)
    with pytest.raises(ValueError, match="does not exist or is not a folder"):
        read_clip_folder(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="channels must be 1, 3 or None, got 2"):
        read_clip_folder(tmp_path, channels=2)


def test_clips_the_labels_name_but_the_folder_lacks(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 8, 8), dtype=np.uint8))
    write_labels(tmp_path, "clip\na\n" + "".join(f"gone{i}\n" for i in range(7)))
    with pytest.raises(
        ValueError, match=r"labels\.csv: 7 clip\(s\) .*: gone0, gone1, gone2, gone3, gone4 and 2 more"
    ):
        read_clip_folder(tmp_path)


def test_clips_of_different_sizes_or_lengths(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 8, 8), dtype=np.uint8))
    np.save(tmp_path / "b.npy", np.zeros((4, 10, 10), dtype=np.uint8))
    np.save(tmp_path / "c.npy", np.zeros((5, 8, 8), dtype=np.uint8))
    write_labels(tmp_path, "clip\na\nb\n")
    with pytest.raises(ValueError, match=r"b\.npy has frames of 10x10 but .*a\.npy of 8x8; pass frame_size"):
        read_clip_folder(tmp_path)
    assert read_clip_folder(tmp_path, frame_size=8).frames.shape == (2, 4, 1, 8, 8)
    write_labels(tmp_path, "clip\na\nc\n")
    with pytest.raises(ValueError, match=r"c\.npy has 5 frames but .*a\.npy has 4; .*same number of frames"):
        read_clip_folder(tmp_path)


def test_frames_within_a_clip_of_different_sizes_or_not_square(tmp_path):
    write_png_clip(tmp_path, "mixed", [0])
    Image.new("L", (9, 8)).save(tmp_path / "mixed" / "frame_01.png")
    write_labels(tmp_path, "clip\nmixed\n")
    with pytest.raises(ValueError, match=r"mixed: frame 1 is 9x8 but frame 0 is 8x8"):
        read_clip_folder(tmp_path)
    np.save(tmp_path / "wide.npy", np.zeros((2, 8, 12), dtype=np.uint8))
    write_labels(tmp_path, "clip\nwide\n")
    with pytest.raises(ValueError, match=r"wide\.npy: frames are 12x8, not square; pass frame_size"):
        read_clip_folder(tmp_path)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.full((2, 8, 8), 1.5, dtype=np.float32), r"float frames must lie in \[0, 1\]"),
        (np.zeros((2, 8, 8), dtype=np.int64), r"uint8 frames or floats in \[0, 1\], got dtype int64"),
        (np.zeros((2, 8, 8, 4), dtype=np.uint8), r"c 1 or 3, got \(2, 8, 8, 4\)"),
        (np.zeros((8, 8), dtype=np.uint8), r"\(t, h, w\) or \(t, h, w, c\)"),
    ],
)
def test_bad_npy_arrays(tmp_path, array, message):
    np.save(tmp_path / "bad.npy", array)
    write_labels(tmp_path, "clip\nbad\n")
    with pytest.raises(ValueError, match=r"bad\.npy: .*" + message):
        read_clip_folder(tmp_path)


def test_bad_events_and_unreadable_clips(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 8, 8), dtype=np.uint8))
    write_labels(tmp_path, "clip,events\na,appeared moving\n")
    with pytest.raises(ValueError, match=r"labels\.csv, line 2: 2 events for clip 'a' of 3 frames"):
        read_clip_folder(tmp_path)
    write_labels(tmp_path, "clip,events\na,appeared jumping flying\n")
    with pytest.raises(ValueError, match=r"line 2: unknown event name\(s\) \['flying', 'jumping'\]"):
        read_clip_folder(tmp_path)
    (tmp_path / "empty").mkdir()
    write_labels(tmp_path, "clip\nempty\n")
    with pytest.raises(ValueError, match=r"clip folder .*empty holds no frame images"):
        read_clip_folder(tmp_path)
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    write_labels(tmp_path, "clip\njunk\n")
    with pytest.raises(ValueError, match=r"junk\.npy could not be read as a \.npy array"):
        read_clip_folder(tmp_path)
    write_labels(tmp_path, "clip\n")
    with pytest.raises(ValueError, match="names no clips"):
        read_clip_folder(tmp_path)
