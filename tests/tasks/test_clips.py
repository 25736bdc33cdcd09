"""Generated moving-object clips: determinism, the motions read back from the rendered frames, the frame
events on hand-built tracks, the long-range setting, the caption grammar, and argument errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from seqlab.tasks.clips import (
    ACTIONS,
    CAPTION_WORDS,
    COLOURS,
    DIGITS,
    EVENTS,
    SHAPES,
    ClipObject,
    Clips,
    ClipSettings,
    describe,
    frame_events,
    make_clip,
    make_clips,
    render,
)

AXIS_SIGN = {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}
LIT_PIXELS = {"square": 49, "circle": 37, "cross": 33, "triangle": 25}  # the 7×7 masks' areas


def centroids(frames: torch.Tensor) -> np.ndarray:
    """(t, 2) brightness-weighted (x, y) centre of each frame (t, 1, s, s); NaN where the frame is black."""
    f = frames[:, 0].double().numpy()  # (t, s, s)
    mass = f.sum((1, 2))
    ys, xs = np.arange(f.shape[1]), np.arange(f.shape[2])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.stack([(f.sum(1) * xs).sum(1) / mass, (f.sum(2) * ys).sum(1) / mass], axis=1)


def ev(*names: str) -> list[int]:
    return [EVENTS.index(n) for n in names]


def test_same_seed_same_clips_and_a_shorter_list_is_a_prefix():
    clips = make_clips(40, seed=3)
    assert clips.frames.shape == (40, 16, 1, 32, 32) and clips.frames.dtype == torch.uint8
    assert clips.actions.shape == (40,) and clips.actions.dtype == torch.long
    assert clips.events.shape == (40, 16) and clips.events.dtype == torch.long
    assert len(clips) == 40 and len(clips.captions) == 40 and clips.action_names == ACTIONS
    prefix = make_clips(10, seed=3)
    assert torch.equal(prefix.frames, clips.frames[:10]) and torch.equal(prefix.events, clips.events[:10])
    assert torch.equal(prefix.actions, clips.actions[:10]) and prefix.captions == clips.captions[:10]
    other = make_clips(10, seed=4)
    assert not torch.equal(other.frames, prefix.frames) and other.captions != prefix.captions


def test_shapes_dtypes_and_ranges_for_colour_digits_and_two_objects():
    clips = make_clips(12, channels=3, n_objects=2, sprites="digits", n_frames=8, frame_size=24)
    assert clips.frames.shape == (12, 8, 3, 24, 24) and clips.frames.dtype == torch.uint8
    assert clips.actions.min() >= 0 and clips.actions.max() < len(ACTIONS)
    assert clips.events.min() >= 0 and clips.events.max() < len(EVENTS)
    assert all(" while " in c and any(f" {d} " in c for d in DIGITS) for c in clips.captions)
    picked = clips.subset([3, 1])
    assert len(picked) == 2 and torch.equal(picked.frames[1], clips.frames[1])
    assert picked.captions == [clips.captions[3], clips.captions[1]]


@pytest.mark.parametrize(
    ("xs", "visible", "expected"),
    [
        ([6, 4, 2, 0, 2, 4], [1] * 6, ev("appeared", "moving", "moving", "moving", "turned", "moving")),
        ([0, 1, 2, 2, 2], [1] * 5, ev("appeared", "moving", "moving", "still", "still")),
        ([0, 2, 2, 0], [1] * 4, ev("appeared", "moving", "still", "turned")),  # remembers across a stop
        (
            [5, 5, 5, 6, 5, 5],
            [0, 0, 1, 1, 0, 1],
            ev("absent", "absent", "appeared", "moving", "absent", "appeared"),
        ),
        (
            [0, 2, 2, 1, 0],
            [1, 1, 0, 1, 1],
            ev("appeared", "moving", "absent", "appeared", "moving"),
        ),  # new run
        ([3, 3, 3, 3], [1, 1, 1, 0], ev("appeared", "still", "still", "absent")),
    ],
)
def test_frame_events_on_horizontal_tracks(xs, visible, expected):
    positions = np.stack([xs, np.full(len(xs), 7)], axis=1)
    assert frame_events(positions, np.array(visible, dtype=bool)).tolist() == expected


def test_frame_events_in_two_dimensions():
    # a right angle is not a reversal (dot product 0); a zigzag kink with |dy| > |dx| is (1 - 9 < 0)
    assert frame_events([(0, 0), (1, 0), (1, 1)], [True] * 3).tolist() == ev("appeared", "moving", "moving")
    kink = frame_events([(0, 0), (1, 3), (2, 0), (3, -3)], [True] * 4).tolist()
    assert kink == ev("appeared", "moving", "turned", "moving")
    with pytest.raises(ValueError, match=r"positions \(t, 2\) and visible \(t,\)"):
        frame_events(np.zeros((4, 2)), np.ones(3, dtype=bool))


def test_every_event_and_action_occurs_in_default_clips():
    clips = make_clips(400)
    events = torch.bincount(clips.events.flatten(), minlength=len(EVENTS)).double() / clips.events.numel()
    actions = torch.bincount(clips.actions, minlength=len(ACTIONS)).double() / len(clips)
    assert events.min() > 0.02 and events[EVENTS.index("moving")] < 0.8, events
    assert actions.min() > 0.07, actions
    # events are those of the rendered target: black frames are exactly the absent ones
    black = clips.frames.flatten(2).amax(2) == 0  # (n, t)
    assert torch.equal(black, clips.events == EVENTS.index("absent"))


def test_each_motion_reads_off_the_rendered_frames():
    clips = make_clips(240, seed=1, event_prob=0.0)
    seen = set()
    for frames, action, caption in zip(clips.frames, clips.actions.tolist(), clips.captions, strict=True):
        c = centroids(frames)
        d = np.round(np.diff(c, axis=0), 6)  # (t - 1, 2) per-frame displacement of the target
        name = ACTIONS[action]
        seen.add(name)
        if name == "still":
            assert np.all(d == 0) and caption.endswith("stays still")
        elif name in ("left", "right", "up", "down"):
            axis, sign = AXIS_SIGN[name]
            assert np.all(sign * d[:, axis] >= 1) and np.all(d[:, 1 - axis] == 0), (name, d)
            assert caption.endswith(f"moves {name}")
        elif name == "circle":
            assert np.all(np.hypot(*d.T) >= 1)
            turning = np.sum(d[:-1, 0] * d[1:, 1] - d[:-1, 1] * d[1:, 0])  # > 0: clockwise with y down
            assert caption.endswith("clockwise") and (turning > 0) == caption.endswith(" clockwise")
        elif name == "zigzag":
            sign = 1 if caption.endswith("right") else -1
            assert np.all(sign * d[:, 0] >= 1) and np.any(d[:-1, 1] * d[1:, 1] < 0) and "zigzags" in caption
        else:
            axis = int(np.all(d[:, 0] == 0))  # the axis it moves along
            steps = d[:, axis][d[:, axis] != 0]
            flips = np.flatnonzero(steps[:-1] * steps[1:] < 0)
            assert len(flips) >= 1 and np.all(d[:, 1 - axis] == 0)
            walls = ("left", "right") if axis == 0 else ("top", "bottom")
            first = walls[int(steps[flips[0]] > 0)]  # moving towards it before the first reversal
            assert f"bounces off the {first} " in caption
    assert seen == set(ACTIONS)


def test_the_shape_in_the_caption_is_the_one_drawn_and_events_are_told_in_order():
    clips = make_clips(200, seed=2, event_prob=0.5)
    for frames, caption in zip(clips.frames, clips.captions, strict=True):
        lit = (frames > 0).flatten(1).sum(1)  # (t,) lit pixels per frame
        shape = caption.split()[1]
        assert set(lit[lit > 0].tolist()) == {LIT_PIXELS[shape]}, caption
        assert caption.startswith(f"the {shape} appears and ") == (lit[0] == 0).item()
        assert caption.endswith(" then vanishes") == (lit[-1] == 0).item()
        stopped = torch.equal(frames[-1], frames[-2]) and torch.equal(frames[-2], frames[-3])
        assert caption.endswith(" then stops") == (stopped and "stays still" not in caption and lit[-1] > 0)


def test_captions_use_the_vocabulary_and_name_colours_and_both_objects():
    assert list(CAPTION_WORDS) == sorted(set(CAPTION_WORDS)) and len(CAPTION_WORDS) < 60
    for kwargs in ({}, {"setting": "long"}, {"channels": 3, "n_objects": 2}, {"sprites": "digits"}):
        clips = make_clips(60, **kwargs)
        for caption in clips.captions:
            assert re.fullmatch(r"[a-z]+( [a-z]+)*", caption) and set(caption.split()) <= set(CAPTION_WORDS)
    colour = make_clips(30, channels=3, n_objects=2, seed=5)
    for caption in colour.captions:
        first, second = caption.split(" while ")
        assert first.split()[1] in COLOURS and second.split()[1] in COLOURS
        assert (
            first.split()[2] in SHAPES
            and second.split()[2] in SHAPES
            and first.split()[2] != second.split()[2]
        )
    grey = make_clips(30, n_objects=2, seed=5).frames
    assert set(grey.unique().tolist()) >= {0, 128, 255}  # the distractor at half brightness


def test_long_setting_label_is_the_early_direction_and_the_rest_is_unrelated():
    early = 4
    clips = make_clips(300, setting="long", early=early, seed=7)
    assert set(clips.actions.tolist()) == {ACTIONS.index(d) for d in ("left", "right", "up", "down")}
    projections, later = [], set()
    for frames, action, caption in zip(clips.frames, clips.actions.tolist(), clips.captions, strict=True):
        c = centroids(frames)
        d = c[early - 1] - c[0]  # the early motion
        read = ("left" if d[0] < 0 else "right") if abs(d[0]) > abs(d[1]) else ("up" if d[1] < 0 else "down")
        assert ACTIONS[action] == read and abs(d).max() >= 1.5 * (early - 1) - 1
        assert frames[early].max() == 0 and frames[early + 1].max() > 0
        assert caption.split()[2:4] == ["moves", read] and "then vanishes then appears and" in caption
        projections.append(np.dot(c[early + 1] - c[early - 1], np.sign(d)))
        later.add(caption.split(" appears and ")[1].split()[0])
    # the reappearance lies ahead of or behind the early motion equally often: no fixed relation
    ahead = np.mean(np.array(projections) > 0)
    assert 0.3 < ahead < 0.7 and len(set(np.round(projections))) > 20
    assert later == {"stays", "moves", "goes", "zigzags", "bounces"}
    events = clips.events
    assert (events[:, early] == EVENTS.index("absent")).all() and (events[:, early + 1] == 1).all()


def test_render_and_describe_building_blocks():
    mask = np.ones((7, 7), dtype=np.float32)
    positions = np.array([[0, 0], [2, 0], [4, 1]])
    obj = ClipObject(
        "square", None, 1.0, mask, positions, np.array([True, True, False]), "right", "moves right"
    )
    frames = render([obj], 16)
    assert frames.shape == (3, 1, 16, 16) and frames[1, 0, 0:7, 2:9].min() == 255 and frames[2].max() == 0
    assert frames[1].sum() == 49 * 255
    assert describe([obj]) == "the square moves right"
    red = ClipObject("circle", "red", 0.5, mask, positions, np.ones(3, dtype=bool), "right", "moves right")
    assert render([red], 16, channels=3)[0, :, 3, 3].tolist() == [115, 20, 20]
    assert describe([obj, red]) == "the square moves right while the red circle moves right"
    with pytest.raises(ValueError, match="needs channels=3"):
        render([red], 16, channels=1)
    with pytest.raises(ValueError, match="leaves the 8×8 frame"):
        render([obj], 8)
    objects = make_clip(ClipSettings(), seed=0, index=5)
    assert describe(objects) == make_clips(6).captions[5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_frames": 2}, "n_frames must be an integer >= 4, got 2"),
        ({"n_frames": 65}, r"n_frames must be an integer in 4..64, got 65"),
        ({"n_frames": 8.0}, "n_frames must be an integer >= 4, got 8.0"),
        ({"frame_size": 8}, "frame_size must be an integer >= 16, got 8"),
        ({"frame_size": 20}, r"frame_size=20 is too small for n_frames=16 with shapes .* frame_size >= 24"),
        ({"frame_size": 24, "sprites": "digits"}, r"with digits .* frame_size >= 25"),
        ({"channels": 2}, r"channels must be one of \(1, 3\), got 2"),
        ({"n_objects": 3}, r"n_objects must be one of \(1, 2\), got 3"),
        ({"setting": "medium"}, r"setting must be one of \('short', 'long'\), got 'medium'"),
        ({"sprites": "letters"}, r"sprites must be one of \('shapes', 'digits'\), got 'letters'"),
        ({"event_prob": 1.5}, r"event_prob must be a number in \[0, 1\], got 1.5"),
        ({"early": 1}, "early must be an integer >= 2, got 1"),
        ({"setting": "long", "early": 12}, r"early=12 leaves 3 frames .* early <= 11"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ],
)
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_clips(2, **kwargs)


def test_clips_checks_its_labels_and_counts():
    with pytest.raises(ValueError, match="n must be an integer >= 0"):
        make_clips(-1)
    frames = torch.zeros(2, 4, 1, 16, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"events \(n, t\)"):
        Clips(frames, torch.zeros(2, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long), ["", ""])
    assert len(make_clips(0).captions) == 0
