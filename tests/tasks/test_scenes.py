"""Generated captioned scenes: determinism, the held-out pairs, geometry, rendering, and the caption grammar
read back by ``attribute_scores``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqlab.tasks.scenes import (
    COLOURS,
    HELD_OUT,
    MIN_GAP,
    RATIO,
    SHAPES,
    SIZES,
    Attributes,
    Scene,
    SceneObject,
    attribute_scores,
    make_scene,
    make_scenes,
    parse_caption,
    relation_between,
    render,
)

SEEN_SPLITS = ("train", "val", "test")


def many_scenes(split: str, n: int = 3000, seed: int = 0) -> list[Scene]:
    """Scenes without rendering (fast): one generator drawn from in turn."""
    rng = np.random.default_rng(seed)
    return [make_scene(rng, split) for _ in range(n)]


def pairs(scene: Scene) -> set[tuple[str, str]]:
    return {(o.colour, o.shape) for o in scene.objects}


def test_same_seed_same_scenes_other_seed_or_split_other_scenes():
    images, scenes = make_scenes(12, "train", seed=3, image_size=32)
    again, scenes_again = make_scenes(12, "train", seed=3, image_size=32)
    assert images.dtype == torch.uint8 and images.shape == (12, 3, 32, 32)
    assert torch.equal(images, again) and scenes == scenes_again
    other, other_scenes = make_scenes(12, "train", seed=4, image_size=32)
    assert not torch.equal(images, other) and [s.caption for s in scenes] != [s.caption for s in other_scenes]
    val, val_scenes = make_scenes(12, "val", seed=3, image_size=32)
    assert not torch.equal(images, val) and scenes != val_scenes
    # scene i depends on (seed, split, i) only: a shorter list is a prefix of a longer one
    prefix, prefix_scenes = make_scenes(5, "train", seed=3, image_size=32)
    assert torch.equal(prefix, images[:5]) and prefix_scenes == scenes[:5]


def test_held_out_pairs_never_in_seen_splits_and_in_every_heldout_scene():
    for split in SEEN_SPLITS:
        scenes = many_scenes(split)
        seen = set().union(*(pairs(s) for s in scenes))
        assert not seen & HELD_OUT, split
        # every colour and every shape of a held-out pair is still seen, with other partners
        assert {c for c, _ in seen} == set(COLOURS) and {s for _, s in seen} == set(SHAPES)
        assert len(seen) == len(COLOURS) * len(SHAPES) - len(HELD_OUT)
    heldout = many_scenes("heldout")
    assert all(pairs(s) & HELD_OUT for s in heldout)
    assert set().union(*(pairs(s) & HELD_OUT for s in heldout)) == HELD_OUT
    _, rendered = make_scenes(50, "heldout", image_size=32)  # the public path too
    assert all(pairs(s) & HELD_OUT for s in rendered)


def test_one_and_two_object_scenes_and_max_objects():
    scenes = many_scenes("train", n=1000)
    counts = [sum(len(s.objects) == k for s in scenes) for k in (1, 2)]
    assert 400 < counts[0] < 600 and counts[0] + counts[1] == 1000  # equally likely
    _, single = make_scenes(40, "train", max_objects=1, image_size=32)
    assert all(len(s.objects) == 1 and s.relation is None for s in single)


def test_every_caption_parses_back_to_its_scene():
    for split in (*SEEN_SPLITS, "heldout"):
        for scene in many_scenes(split, n=500):
            parsed = parse_caption(scene.caption)
            assert parsed.objects == tuple(o.attributes for o in scene.objects)
            assert parsed.relation == scene.relation
            if scene.relation is not None:  # the equivalent caption names the objects the other way round
                a, b = scene.objects
                swapped = parse_caption(scene.references[1])
                assert swapped.objects == (b.attributes, a.attributes)
                assert relation_between(b, a) == swapped.relation


def test_relations_follow_centres_with_a_clear_margin():
    for scene in many_scenes("train"):
        if scene.relation is None:
            continue
        a, b = scene.objects
        assert relation_between(a, b) == scene.relation
        dx, dy = b.cx - a.cx, b.cy - a.cy
        along, across = (dx, dy) if scene.relation in ("left of", "right of") else (dy, dx)
        assert abs(along) >= RATIO * abs(across) - 1e-9
        assert abs(along) >= a.radius + b.radius + MIN_GAP - 1e-9
        expected_sign = 1 if scene.relation in ("left of", "above") else -1  # y grows downwards
        assert math.copysign(1, along) == expected_sign


def test_objects_lie_inside_and_never_overlap():
    for scene in many_scenes("heldout") + many_scenes("train"):
        for o in scene.objects:
            assert o.radius <= o.cx <= 1 - o.radius and o.radius <= o.cy <= 1 - o.radius
        if len(scene.objects) == 2:
            a, b = scene.objects
            gap = a.radius + b.radius
            assert abs(a.cx - b.cx) >= gap or abs(a.cy - b.cy) >= gap  # bounding squares disjoint


@pytest.mark.parametrize("image_size", [32, 64])
def test_rendered_colours_at_centres_and_grey_elsewhere(image_size):
    images, scenes = make_scenes(150, "train", seed=1, image_size=image_size)
    palette = np.array(list(COLOURS.values()), dtype=np.float64)  # (5, 3)
    names = list(COLOURS)
    for image, scene in zip(images.numpy(), scenes, strict=True):
        covered = np.zeros((image_size, image_size), dtype=bool)
        for o in scene.objects:
            i, j = int(o.cy * image_size), int(o.cx * image_size)
            pixel = image[:, i, j].astype(np.float64)
            assert names[int(np.argmin(((palette - pixel) ** 2).sum(axis=1)))] == o.colour
            r = math.ceil(o.radius * image_size) + 1
            covered[max(0, i - r) : i + r + 1, max(0, j - r) : j + r + 1] = True
        background = image[:, ~covered]  # (3, pixels away from every object)
        assert (background[0] == background[1]).all() and (background[1] == background[2]).all()
        assert background.mean() < 100  # dark grey


@pytest.mark.parametrize("shape", SHAPES)
def test_clean_render_areas_tell_sizes_apart(shape):
    size = 64
    areas = {}
    for name in SIZES:
        obj = SceneObject(shape, "red", name, 0.5, 0.5)
        image = render(Scene((obj,), None), size)
        assert image.shape == (3, size, size) and image.dtype == np.uint8
        areas[name] = int((image[0] == COLOURS["red"][0]).sum())
    assert 3.0 < areas["large"] / areas["small"] < 5.5  # ~4: area grows as the square of the half-extent
    if shape == "circle":
        assert areas["large"] == pytest.approx(math.pi * (0.2 * size) ** 2, rel=0.05)


# ---- reading captions back -----------------------------------------------------------------------------

A = Scene(
    (SceneObject("circle", "red", "small", 0.2, 0.2), SceneObject("square", "blue", "large", 0.3, 0.7)),
    "above",
)
B = Scene((SceneObject("triangle", "green", "large", 0.5, 0.5),), None)
GOOD_A, SWAPPED_A = (
    "a small red circle above a large blue square",
    "a large blue square below a small red circle",
)
GOOD_B = "a large green triangle"


def test_scene_captions_and_references():
    assert A.caption == GOOD_A and A.references == [GOOD_A, SWAPPED_A]
    assert B.caption == GOOD_B and B.references == [GOOD_B]
    assert relation_between(*A.objects) == "above"
    with pytest.raises(ValueError, match="relation"):
        Scene(A.objects, None)


def test_parse_caption_accepts_the_grammar_only():
    parsed = parse_caption("  A Small Red Circle  left of a large blue square ")
    assert parsed.objects == (Attributes("small", "red", "circle"), Attributes("large", "blue", "square"))
    assert parsed.relation == "left of"
    for bad in (
        "",
        "a small red circle above",
        "a red small circle",
        "a small red circle near a large blue square",
        "a small red circle left a large blue square",
        "the small red circle",
        "a tiny red circle",
        "a small red circle above a large blue square above a small green diamond",
    ):
        assert parse_caption(bad) is None, bad


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        (GOOD_A, dict(exact=1, colour=1, shape=1, size=1, relation=1, parsed=1)),
        (SWAPPED_A, dict(exact=1, colour=1, shape=1, size=1, relation=1, parsed=1)),
        (  # one wrong colour: 2 of the 3 objects' colours right
            "a small green circle above a large blue square",
            dict(exact=1 / 2, colour=2 / 3, shape=1, size=1, relation=1, parsed=1),
        ),
        (  # objects right, relation wrong (the swapped order fits the attributes worse)
            "a small red circle below a large blue square",
            dict(exact=1 / 2, colour=1, shape=1, size=1, relation=0, parsed=1),
        ),
        (  # one of the two objects: the other counts as wrong, and there is no relation
            "a large blue square",
            dict(exact=1 / 2, colour=2 / 3, shape=2 / 3, size=2 / 3, relation=0, parsed=1),
        ),
        (
            "the cat sat on the mat",
            dict(exact=1 / 2, colour=1 / 3, shape=1 / 3, size=1 / 3, relation=0, parsed=1 / 2),
        ),
    ],
)
def test_attribute_scores_on_hand_written_captions(prediction, expected):
    scores = attribute_scores([prediction, GOOD_B], [A, B])  # B is always right: 1 of 3 objects
    assert scores == pytest.approx(expected)


def test_attribute_scores_garbage_scores_zero_and_relation_is_nan_without_pairs():
    assert attribute_scores(["the cat sat"], [A]) == dict(
        exact=0, colour=0, shape=0, size=0, relation=0, parsed=0
    )
    single = attribute_scores(["a large green diamond"], [B])
    assert (
        single["exact"] == 0
        and single["shape"] == 0
        and single["colour"] == 1
        and math.isnan(single["relation"])
    )
    with pytest.raises(ValueError, match="2 predictions for 1 scenes"):
        attribute_scores([GOOD_A, GOOD_B], [A])
    with pytest.raises(ValueError, match="at least one scene"):
        attribute_scores([], [])


def test_arguments_are_checked_with_clear_messages():
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'val', 'test', 'heldout'\)"):
        make_scenes(2, "dev")
    with pytest.raises(ValueError, match="image_size must be an integer >= 32, got 16"):
        make_scenes(2, "train", image_size=16)
    with pytest.raises(ValueError, match="image_size"):
        render(B, 31)
    with pytest.raises(ValueError, match="max_objects must be 1 or 2, got 3"):
        make_scenes(2, "train", max_objects=3)
    with pytest.raises(ValueError, match="n must be an integer >= 0, got -1"):
        make_scenes(-1, "train")
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        make_scene(0, "train")
    images, scenes = make_scenes(0, "test")
    assert images.shape == (0, 3, 64, 64) and scenes == []
