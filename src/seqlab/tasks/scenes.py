r"""Generated captioned scenes: one or two coloured shapes, a caption from a small grammar, and held-out
colour-shape pairs that measure compositional generalization.

Each image shows one or two objects (a colour, a shape and a size) on a plain dark-grey background; its
caption names them and, for two objects, how the first lies relative to the second:

    one object     a small red circle
    two objects    a small red circle above a large blue square
    grammar        caption  := object | object relation object
                   object   := "a" size colour shape
                   relation := "left of" | "right of" | "above" | "below"

The objects are described in the order they were drawn (random), so a two-object scene has two equivalent
captions, "A above B" and "B below A"; ``Scene.references`` lists both. The idea follows ShapeWorld
(Kuhnle & Copestake 2017, arXiv:1704.04517) and CLEVR's CoGenT condition (Johnson et al. 2017,
arXiv:1612.06890, Sec. 4.7): some attribute combinations (``HELD_OUT``, four colour-shape pairs) never
occur in the 'train', 'val' and 'test' splits, although each of their colours and shapes does, with other
partners; the 'heldout' split shows at least one of them in every scene.

Geometry, in image coordinates in [0, 1] (x to the right, y down, as rows are stored): an object of size
``small`` / ``large`` fits in the square of half-side ``r`` = 0.10 / 0.20 around its centre. Two objects
are separated along the relation's axis by at least ``r_0 + r_1 + MIN_GAP``, so their squares never meet,
and the difference of their centres along that axis is at least ``RATIO`` = 1.5 times the difference
across it, so the relation is never ambiguous. "A above B" means A's centre has the smaller y.

Notation: ``n`` scenes, ``S`` image side in pixels; images are uint8 (n, 3, S, S), channels RGB.

Randomness: scene ``i`` of ``make_scenes(n, split, seed)`` is drawn from its own generator, seeded from
(seed, split, i), and then rendered with the same generator (background level and pixel noise). So scene
``i`` does not depend on ``n`` (a longer list extends a shorter one) and splits never share a stream.

Example::

    images, scenes = make_scenes(8, "train", seed=0)   # (8, 3, 64, 64) uint8
    scenes[0].caption                                  # e.g. 'a large green square left of a small red circle'
    attribute_scores([s.caption for s in scenes], scenes)["exact"]   # 1.0
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from seqlab.tasks.base import check_int

__all__ = [
    "COLOURS",
    "HELD_OUT",
    "RELATIONS",
    "SHAPES",
    "SIZES",
    "SPLITS",
    "Attributes",
    "ParsedCaption",
    "Scene",
    "SceneObject",
    "attribute_scores",
    "make_scene",
    "make_scenes",
    "parse_caption",
    "relation_between",
    "render",
]

SPLITS = ("train", "val", "test", "heldout")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 90, 235),
    "yellow": (235, 215, 40),
    "purple": (160, 60, 200),
}
SHAPES = ("circle", "square", "triangle", "diamond")
SIZES: dict[str, float] = {"small": 0.10, "large": 0.20}
"""Half-extent ``r`` of each size, as a fraction of the image side."""
RELATIONS = ("left of", "right of", "above", "below")
INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
HELD_OUT = frozenset({("red", "triangle"), ("green", "diamond"), ("blue", "circle"), ("yellow", "square")})
"""(colour, shape) pairs absent from 'train', 'val' and 'test': four colours, four shapes, each seen elsewhere."""

RATIO = 1.5  # |centre difference along the relation's axis| >= RATIO * |difference across it|
MIN_GAP = 0.04  # least gap between the two objects' bounding squares along the relation's axis
BACKGROUND = (16, 80)  # grey level of the background, drawn uniformly (a clean render uses the middle, 48)
NOISE_STD = 6.0  # standard deviation of the Gaussian pixel noise, in grey levels, shared by the channels

_AXIS = {"left of": (0, 1), "right of": (0, -1), "above": (1, 1), "below": (1, -1)}
"""relation of A to B -> (axis: 0 = x, 1 = y; sign of B's coordinate minus A's along it)."""
_ALL_PAIRS = tuple(itertools.product(sorted(COLOURS), SHAPES))  # sorted: frozenset order depends on hashing
_SEEN_PAIRS = tuple(p for p in _ALL_PAIRS if p not in HELD_OUT)
_HELD_PAIRS = tuple(p for p in _ALL_PAIRS if p in HELD_OUT)
_STREAM_TAG = 0x5CE4E5  # keeps scene generators apart from any other seeded stream built from the same seed


class Attributes(NamedTuple):
    """What a caption says about one object, in caption order."""

    size: str
    colour: str
    shape: str


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    cx: float
    """Centre, x (to the right) in [0, 1] image coordinates."""
    cy: float
    """Centre, y (down) in [0, 1] image coordinates."""

    @property
    def radius(self) -> float:
        return SIZES[self.size]

    @property
    def attributes(self) -> Attributes:
        return Attributes(self.size, self.colour, self.shape)

    @property
    def words(self) -> str:
        return f"a {self.size} {self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    relation: str | None
    """Where objects[0] lies relative to objects[1]; None for a single object."""

    def __post_init__(self):
        if len(self.objects) not in (1, 2):
            raise ValueError(f"a scene holds 1 or 2 objects, got {len(self.objects)}")
        if (len(self.objects) == 2) != (self.relation is not None) or self.relation not in (None, *RELATIONS):
            raise ValueError(
                f"a two-object scene needs a relation in {RELATIONS} and a one-object scene None; "
                f"got {len(self.objects)} object(s) and relation {self.relation!r}"
            )

    @property
    def caption(self) -> str:
        if self.relation is None:
            return self.objects[0].words
        return f"{self.objects[0].words} {self.relation} {self.objects[1].words}"

    @property
    def references(self) -> list[str]:
        """Every equivalent caption, the scene's own first ("A above B", then "B below A")."""
        if self.relation is None:
            return [self.caption]
        a, b = self.objects
        return [self.caption, f"{b.words} {INVERSE[self.relation]} {a.words}"]


@dataclass(frozen=True)
class ParsedCaption:
    """A caption read back with the grammar: the objects' attributes and the relation (no positions)."""

    objects: tuple[Attributes, ...]
    relation: str | None


def relation_between(a: SceneObject, b: SceneObject) -> str | None:
    """Where ``a`` lies relative to ``b`` by their centres, or None when neither axis dominates by RATIO."""
    dx, dy = b.cx - a.cx, b.cy - a.cy
    if abs(dx) >= RATIO * abs(dy) - 1e-9:
        return "left of" if dx > 0 else "right of"
    if abs(dy) >= RATIO * abs(dx) - 1e-9:
        return "above" if dy > 0 else "below"
    return None


# ---- generation ----------------------------------------------------------------------------------------


def _check_split(split) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def _check_max_objects(max_objects) -> int:
    if isinstance(max_objects, bool) or max_objects not in (1, 2):
        raise ValueError(f"max_objects must be 1 or 2, got {max_objects!r}")
    return max_objects


def _place_pair(rng: np.random.Generator, r: tuple[float, float], relation: str) -> list[list[float]]:
    """Centres [[x, y], [x, y]] of two objects of half-extents ``r`` that stand in ``relation``.

    Along the relation's axis, the lower object ``lo`` and the higher ``hi`` are ``d`` apart, with
    r_lo + r_hi + MIN_GAP <= d <= 1 - r_lo - r_hi (both inside); across it they differ by ``e``,
    |e| < d / RATIO, also within what keeps both inside.
    """
    axis, sign = _AXIS[relation]
    lo, hi = (0, 1) if sign > 0 else (1, 0)
    r_lo, r_hi = r[lo], r[hi]
    d = rng.uniform(r_lo + r_hi + MIN_GAP, 1 - r_lo - r_hi)
    along_lo = rng.uniform(r_lo, 1 - r_hi - d)
    e = rng.uniform(max(-d / RATIO, r_lo + r_hi - 1), min(d / RATIO, 1 - r_lo - r_hi))
    across_lo = rng.uniform(max(r_lo, r_hi - e), min(1 - r_lo, 1 - r_hi - e))
    centres = [[0.0, 0.0], [0.0, 0.0]]
    centres[lo][axis], centres[lo][1 - axis] = along_lo, across_lo
    centres[hi][axis], centres[hi][1 - axis] = along_lo + d, across_lo + e
    return centres


def make_scene(rng: np.random.Generator, split: str, max_objects: int = 2) -> Scene:
    """One random scene of ``split``: 1 or 2 objects (equally likely when ``max_objects`` is 2).

    Colour-shape pairs are uniform over the 16 pairs outside ``HELD_OUT`` in 'train', 'val' and 'test'; in
    'heldout' one object (chosen at random) takes a held-out pair and the other any of the 20 pairs. Sizes
    and relations are uniform.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    _check_split(split)
    n = 1 if _check_max_objects(max_objects) == 1 else int(rng.integers(1, 3))
    novel = int(rng.integers(n)) if split == "heldout" else -1  # the object that takes a held-out pair
    attributes = []
    for i in range(n):
        pool = _HELD_PAIRS if i == novel else _ALL_PAIRS if split == "heldout" else _SEEN_PAIRS
        colour, shape = pool[int(rng.integers(len(pool)))]
        attributes.append((shape, colour, tuple(SIZES)[int(rng.integers(len(SIZES)))]))
    if n == 1:
        r = SIZES[attributes[0][2]]
        centres, relation = [[rng.uniform(r, 1 - r), rng.uniform(r, 1 - r)]], None
    else:
        relation = RELATIONS[int(rng.integers(len(RELATIONS)))]
        centres = _place_pair(rng, (SIZES[attributes[0][2]], SIZES[attributes[1][2]]), relation)
    objects = tuple(
        SceneObject(*a, float(cx), float(cy)) for a, (cx, cy) in zip(attributes, centres, strict=True)
    )
    return Scene(objects, relation)


# ---- rendering -----------------------------------------------------------------------------------------


def _shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inside-test in units of the half-extent: ``u`` (1, w) and ``v`` (h, 1) offsets from the centre."""
    if shape == "circle":
        return u**2 + v**2 <= 1.0
    if shape == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.85  # area 2.9, close to the circle's 3.1
    if shape == "diamond":
        return np.abs(u) + np.abs(v) <= 1.0
    if shape == "triangle":  # apex up at v = -1, base at v = 0.8, base half-width 1
        return (v <= 0.8) & (np.abs(u) <= (v + 1.0) / 1.8)
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def render(scene: Scene, image_size: int = 64, rng: np.random.Generator | None = None) -> np.ndarray:
    """Draw ``scene`` as a uint8 RGB image (3, S, S) with S = ``image_size`` >= 32.

    Pixel (row i, column j) samples the point ((j + 0.5) / S, (i + 0.5) / S); no anti-aliasing. Without
    ``rng`` the background is grey 48 and there is no noise; with it the background level is uniform in
    ``BACKGROUND`` and Gaussian noise of standard deviation ``NOISE_STD`` (the same in the three channels)
    is added, then the image is rounded and clipped to 0..255.
    """
    size = check_int("image_size", image_size, 32)
    background = sum(BACKGROUND) // 2 if rng is None else int(rng.integers(BACKGROUND[0], BACKGROUND[1] + 1))
    image = np.full((size, size, 3), background, dtype=np.float32)  # (S, S, 3) while drawing
    for obj in scene.objects:
        r = obj.radius
        j0, j1 = max(0, math.floor((obj.cx - r) * size)), min(size, math.ceil((obj.cx + r) * size))
        i0, i1 = max(0, math.floor((obj.cy - r) * size)), min(size, math.ceil((obj.cy + r) * size))
        u = (((np.arange(j0, j1) + 0.5) / size - obj.cx) / r)[None, :]  # (1, w)
        v = (((np.arange(i0, i1) + 0.5) / size - obj.cy) / r)[:, None]  # (h, 1)
        image[i0:i1, j0:j1][_shape_mask(obj.shape, u, v)] = COLOURS[obj.colour]
    if rng is not None:
        image += NOISE_STD * rng.standard_normal((size, size, 1), dtype=np.float32)
    image = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(image.transpose(2, 0, 1))  # (S, S, 3) -> (3, S, S)


def _scene_rng(seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng([_STREAM_TAG, seed, SPLITS.index(split), index])


def make_scenes(
    n: int, split: str, seed: int = 0, image_size: int = 64, max_objects: int = 2
) -> tuple[Tensor, list[Scene]]:
    """``n`` scenes of ``split`` and their images, uint8 (n, 3, S, S); scene i depends on (seed, split, i)."""
    check_int("n", n, 0)
    check_int("seed", seed, 0)
    check_int("image_size", image_size, 32)
    _check_split(split)
    _check_max_objects(max_objects)
    images = np.empty((n, 3, image_size, image_size), dtype=np.uint8)
    scenes = []
    for i in range(n):
        rng = _scene_rng(seed, split, i)
        scenes.append(make_scene(rng, split, max_objects))
        images[i] = render(scenes[-1], image_size, rng)
    return torch.from_numpy(images), scenes


# ---- reading captions back -----------------------------------------------------------------------------


def _parse_object(words: list[str]) -> Attributes | None:
    if (
        len(words) == 4
        and words[0] == "a"
        and words[1] in SIZES
        and words[2] in COLOURS
        and words[3] in SHAPES
    ):
        return Attributes(words[1], words[2], words[3])
    return None


def parse_caption(text: str) -> ParsedCaption | None:
    """Read a caption with the grammar (case and surrounding whitespace ignored); None if it does not parse."""
    words = text.lower().split()
    if len(words) == 4:
        first = _parse_object(words)
        return None if first is None else ParsedCaption((first,), None)
    for relation in RELATIONS:
        k = len(relation.split())
        if len(words) == 8 + k and " ".join(words[4 : 4 + k]) == relation:
            first, second = _parse_object(words[:4]), _parse_object(words[4 + k :])
            if first is not None and second is not None:
                return ParsedCaption((first, second), relation)
    return None


def _pairings(n_pred: int, n_true: int) -> list[tuple[tuple[int, int], ...]]:
    """Every one-to-one matching of predicted to true objects as ((pred index, true index), ...)."""
    perms = itertools.permutations(range(max(n_pred, n_true)), min(n_pred, n_true))
    return [tuple((i, j) if n_pred <= n_true else (j, i) for i, j in enumerate(p)) for p in perms]


def _best_fit(parsed: ParsedCaption, scene: Scene) -> tuple[dict[str, int], bool]:
    """Attribute matches per field and whether the relation is right, under the best-fitting matching.

    The matching maximizes the number of matched attributes, then the relation's correctness; a matching
    that swaps two objects reads the predicted relation as its inverse ("B below A" for "A above B").
    """
    best = None
    for pairing in _pairings(len(parsed.objects), len(scene.objects)):
        hits = dict.fromkeys(Attributes._fields, 0)
        for (p, t), field in itertools.product(pairing, Attributes._fields):
            hits[field] += getattr(parsed.objects[p], field) == getattr(scene.objects[t], field)
        relation_ok = False
        if len(parsed.objects) == len(scene.objects) == 2:
            swapped = pairing[0][1] == 1
            relation_ok = parsed.relation == (INVERSE[scene.relation] if swapped else scene.relation)
        key = (sum(hits.values()), relation_ok)
        if best is None or key > best[0]:
            best = (key, hits, relation_ok)
    return best[1], best[2]


def attribute_scores(predictions: list[str], scenes: list[Scene]) -> dict[str, float]:
    """How much of each scene a predicted caption gets right, read back with the grammar; fractions in [0, 1].

    exact     fraction of captions that parse, name as many objects as the scene holds, and get every
              size, colour, shape and the relation right (in either equivalent order)
    colour, shape, size
              fraction of the scenes' objects whose attribute the caption states, objects matched to the
              caption's in the order that fits best; objects the caption leaves out count as wrong, extra
              objects in the caption are ignored (``exact`` still fails)
    relation  fraction of two-object scenes whose caption has two objects and the right relation under the
              best-fitting order (nan when there are no two-object scenes)
    parsed    fraction of captions the grammar reads at all; a caption that does not parse scores 0 on all
    """
    if len(predictions) != len(scenes):
        raise ValueError(f"got {len(predictions)} predictions for {len(scenes)} scenes")
    if not scenes:
        raise ValueError("attribute_scores needs at least one scene")
    totals = dict.fromkeys(("exact", "colour", "shape", "size", "relation", "parsed"), 0)
    n_objects = sum(len(s.objects) for s in scenes)
    n_pairs = sum(len(s.objects) == 2 for s in scenes)
    for text, scene in zip(predictions, scenes, strict=True):
        parsed = parse_caption(text)
        if parsed is None:
            continue
        hits, relation_ok = _best_fit(parsed, scene)
        complete = len(parsed.objects) == len(scene.objects) and sum(hits.values()) == 3 * len(scene.objects)
        totals["exact"] += complete and (relation_ok or len(scene.objects) == 1)
        totals["relation"] += relation_ok
        totals["parsed"] += 1
        for field, count in hits.items():
            totals[field] += count
    denominators = {"exact": len(scenes), "parsed": len(scenes), "relation": n_pairs or math.nan}
    return {key: total / denominators.get(key, n_objects) for key, total in totals.items()}
