r"""Generated moving-object clips with three labels: the clip's action (many to one), an event per frame (many
to many, aligned) and a caption (sequence to sequence).

Notation: ``n`` clips, ``t`` frames, ``c`` channels (1 grey, 3 RGB), ``s`` frame side, ``w`` sprite side: 7
for the shapes, 8 for scikit-learn's digits (zero..nine, a random image of the digit per clip). Frames are
uint8 (n, t, c, s, s) on black. A position is the integer (x, y) of a sprite's top-left pixel, x right, y
down, in [0, s - w]. The target has full brightness; with ``n_objects=2`` a distractor with another sprite
moves independently at half brightness (overlaps keep the brighter pixel). With ``channels=3`` each object
takes a colour of ``COLOURS``, named in the caption.

Actions (``ACTIONS``), over the target's moving frames:
    still     never moves
    left ...  1..2 px/frame along one axis (1.5..2.5 in the long setting's early part); never touches a wall:
              x, y stay in [1, s - w - 1]
    circle    (x, y) = (x_0, y_0) + r (cos, sin)(φ_0 ± ω τ), r in [2.5, 6], chord 2 r sin(ω/2) in [1.6, 2.6]
              px, so no integer step is zero; +ω is clockwise on screen (y points down)
    zigzag    x at a constant 1..1.5 px/frame; y steps ±3 px, flipping sign every P in 2..4 frames
    bounce    2..3 px/frame along one axis, reflected at 0 and s - w; the first wall is hit after >= 1.5
              frames with >= 2 frames left, so at least one reversal shows

Events (``EVENTS``, one per frame: absent, appeared, still, moving, turned) are a pure function of the
target's track (``seqlab.tasks.clip_events.frame_events`` says how).

Settings. ``short``: with probability ``event_prob`` each, the target is absent for its first k frames, and
it stops or vanishes (equally likely; a still target only vanishes) for its last m; k, m in
2..max(2, t // 4), keeping >= 6 moving frames. The label is the motion. ``long`` (long-range memory): the
target moves left, right, up or down for ``early`` frames, is absent one frame, then reappears at a uniformly
random place doing any of the eight motions, drawn independently; the label is the early direction. The
distractor does one motion over the whole clip, without events. ``event_prob`` shapes the short setting only
and ``early`` the long one: either given other than its default for the other setting is refused.

Captions, words of ``CAPTION_WORDS`` in time order:
    caption  := object phrase [ "while" object phrase ]        (target first)
    object   := "the" [colour] sprite
    phrase   := ["appears and"] motion ["then stops" | "then vanishes"]                     (short)
              | "moves" dir "then vanishes then appears and" motion                         (long)
    motion   := "stays still" | "moves" dir | "goes round" ("clockwise" | "anticlockwise")
              | "zigzags" ("left" | "right") | "bounces off the" wall "wall"
              | "bounces off the" wall "and" wall "walls"   (two or more reversals, the first wall first)

Randomness: clip ``i`` has its own generator, seeded from (seed, i): a shorter list prefixes a longer one.

Example::

    clips = make_clips(8, seed=0)   # frames (8, 16, 1, 32, 32) uint8
    clips.captions[0]               # e.g. 'the circle appears and zigzags right'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from seqlab.tasks.base import check_choice, check_int
from seqlab.tasks.clip_events import EVENTS, frame_events
from seqlab.tasks.video_settings import check_video_settings
from seqlab.tasks.vision import _load_digits

__all__ = [
    "ACTIONS", "CAPTION_WORDS", "COLOURS", "DIGITS", "EVENTS", "SHAPES", "ClipObject", "ClipSettings",
    "Clips", "describe", "frame_events", "make_clip", "make_clips", "render",
]  # fmt: skip

ACTIONS = ("still", "left", "right", "up", "down", "circle", "zigzag", "bounce")
SHAPES = ("circle", "square", "triangle", "cross")
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40), "green": (40, 200, 60), "blue": (60, 100, 255), "yellow": (240, 220, 40),
    "cyan": (40, 220, 230), "magenta": (220, 60, 220),
}  # fmt: skip
_DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
_WORDS = "the while and then appears stops vanishes moves stays still goes round clockwise anticlockwise"
_MORE_WORDS = "zigzags bounces off wall walls top bottom"
CAPTION_WORDS = tuple(sorted({*f"{_WORDS} {_MORE_WORDS}".split(), *SHAPES, *DIGITS, *COLOURS, *_DIRECTIONS}))
"""Every word a caption can use, sorted (45 words)."""

Setting = Literal["short", "long"]
Sprites = Literal["shapes", "digits"]
SPRITE_SIZE = {"shapes": 7, "digits": 8}
STRAIGHT_SPEED = (1.0, 2.0)  # px/frame, left/right/up/down; the top is lowered where the room needs it
EARLY_SPEED = (1.5, 2.5)  # px/frame, the long setting's early direction
ZIGZAG_SPEED, ZIGZAG_STEP = (1.0, 1.5), 3  # horizontal px/frame; vertical px per frame
BOUNCE_SPEED = (2.0, 3.0)
CIRCLE_RADIUS, CIRCLE_CHORD = (2.5, 6.0), (1.6, 2.6)
MIN_MOVING = 6  # the least moving frames a short clip keeps when events cut its start or end
_STREAM_TAG = 0xC11B5  # keeps clip generators apart from other seeded streams built from the same seed


@dataclass
class Clips:
    """Clips and their labels; ``-1`` marks an unknown action or event, ``""`` an unknown caption."""

    frames: Tensor  # (n, t, c, s, s) uint8
    actions: Tensor  # (n,) long, index into action_names
    events: Tensor  # (n, t) long, index into EVENTS
    captions: list[str]
    action_names: tuple[str, ...] = ACTIONS

    def __post_init__(self):
        f, a, e, n = self.frames, self.actions, self.events, len(self.captions)
        ok = f.dim() == 5 and f.dtype == torch.uint8 and len(f) == n
        if not (ok and a.shape == f.shape[:1] and e.shape == f.shape[:2]):
            raise ValueError(
                f"expected frames uint8 (n, t, c, s, s), actions (n,), events (n, t) and n captions, got "
                f"{f.dtype} {tuple(f.shape)}, {tuple(a.shape)}, {tuple(e.shape)} and {n}"
            )

    def __len__(self) -> int:
        return self.frames.shape[0]

    def subset(self, rows) -> Clips:
        """The clips at ``rows`` (a sequence or tensor of indices), in that order."""
        index = torch.as_tensor(rows, dtype=torch.long).reshape(-1)  # (m,)
        picked = [self.captions[i] for i in index.tolist()]
        return Clips(self.frames[index], self.actions[index], self.events[index], picked, self.action_names)


@dataclass(frozen=True)
class ClipSettings:
    """What ``make_clips`` draws; validated on construction (see the module docstring for each field)."""

    n_frames: int = 16
    frame_size: int = 32
    channels: int = 1
    setting: Setting = "short"
    n_objects: int = 1
    sprites: Sprites = "shapes"
    early: int = 4
    """Frames of the early direction in the long setting."""
    event_prob: float = 0.3
    """Probability of a late appearance, and separately of a stop or vanish, in the short setting."""

    def __post_init__(self):
        check_int("n_frames", self.n_frames, 4)
        if self.n_frames > 64:
            raise ValueError(f"n_frames must be an integer in 4..64, got {self.n_frames}")
        check_int("frame_size", self.frame_size, 16)
        for name, choices in (("channels", (1, 3)), ("n_objects", (1, 2))):
            if isinstance(getattr(self, name), bool) or getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        check_choice("setting", self.setting, Setting)
        check_choice("sprites", self.sprites, Sprites)
        p = self.event_prob
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f"event_prob must be a number in [0, 1], got {p!r}")
        check_int("early", self.early, 2)
        check_video_settings(ClipSettings, "generated", self.setting, asdict(self), prefix="")
        if self.setting == "long" and self.n_frames - self.early - 1 < 4:
            raise ValueError(
                f"early={self.early} leaves {self.n_frames - self.early - 1} frames after the one-frame gap "
                f"for the later motion with n_frames={self.n_frames}; the long setting needs >= 4: "
                f"early <= {self.n_frames - 5}"
            )
        # straight motion at its least speed over the whole clip (and the early part) must fit without a wall
        room = self.frame_size - SPRITE_SIZE[self.sprites] - 2  # positions 1 .. s - w - 1
        need = (self.n_frames - 1) * STRAIGHT_SPEED[0]
        if self.setting == "long":
            need = max(need, (self.early - 1) * EARLY_SPEED[0])
        if room < need:
            raise ValueError(
                f"frame_size={self.frame_size} is too small for n_frames={self.n_frames} with {self.sprites} "
                f"(sprite side {SPRITE_SIZE[self.sprites]}): straight motion at >= 1 px/frame that never "
                f"touches a wall needs frame_size >= {int(np.ceil(need)) + SPRITE_SIZE[self.sprites] + 2}; "
                f"raise frame_size or lower n_frames"
            )


@dataclass(frozen=True, eq=False)
class ClipObject:
    """One object of a clip: its sprite, its track and what the caption says about it."""

    name: str  # the sprite's word: a shape or a digit's name
    colour: str | None  # a key of COLOURS, or None for white / grey
    brightness: float  # 1.0 for the target, 0.5 for the distractor
    mask: np.ndarray  # (w, w) float in [0, 1]
    positions: np.ndarray  # (t, 2) int64, (x, y) of the top-left pixel
    visible: np.ndarray  # (t,) bool
    action: str  # the action label (the early direction in the long setting)
    phrase: str  # e.g. "appears and moves left then stops"


@lru_cache(maxsize=1)
def _shape_masks() -> dict[str, np.ndarray]:
    """7×7 float masks; u, v are offsets from the centre pixel."""
    v, u = np.mgrid[-3:4, -3:4]  # (7, 7) each
    masks = {
        "circle": u**2 + v**2 <= 10,  # radius ~3.2: the corners of the 7×7 box stay dark
        "square": np.ones((7, 7), dtype=bool),
        "triangle": 2 * np.abs(u) <= v + 3,  # apex up, one pixel wide at the top, 7 at the bottom
        "cross": (np.abs(u) <= 1) | (np.abs(v) <= 1),
    }
    return {k: m.astype(np.float32) for k, m in masks.items()}


def _sprite(rng: np.random.Generator, sprites: str, avoid: str | None) -> tuple[str, np.ndarray]:
    names = [k for k in (SHAPES if sprites == "shapes" else DIGITS) if k != avoid]
    name = names[int(rng.integers(len(names)))]
    if sprites == "shapes":
        return name, _shape_masks()[name]
    images, classes = _load_digits()  # (N, 1, 8, 8) uint8, (N,): scikit-learn's 1,797 digits
    choices = np.flatnonzero(classes.numpy() == DIGITS.index(name))
    return name, images[choices[int(rng.integers(len(choices)))], 0].numpy() / np.float32(255)


# ---- motions --------------------------------------------------------------------------------------------


def _place(path: np.ndarray, low: float, high: float, rng: np.random.Generator) -> np.ndarray:
    """Shift ``path`` (t, 2) by a uniform offset per axis to lie within [low, high], rounded: (t, 2) int64."""
    lo, hi = low - path.min(0), high - path.max(0)  # (2,) each: the offsets that keep it inside
    assert np.all(lo <= hi + 1e-9), "the settings' validation should leave room for every motion"
    return np.rint(path + rng.uniform(lo, np.maximum(lo, hi))).astype(np.int64)


def _bounce_phrase(coord: np.ndarray, axis: int) -> str:
    """Name the walls from the rendered coordinate: a reversal to increasing means the low wall was hit."""
    steps = np.diff(coord)
    steps = steps[steps != 0]
    flips = np.flatnonzero(np.sign(steps[1:]) != np.sign(steps[:-1]))  # reversals, at least one by design
    walls = ("left", "right") if axis == 0 else ("top", "bottom")
    first, other = walls if steps[flips[0] + 1] > 0 else walls[::-1]
    return f"bounces off the {first} " + ("wall" if len(flips) == 1 else f"and {other} walls")


def _bounce(rng: np.random.Generator, t: int, hi: int) -> tuple[np.ndarray, str]:
    axis, towards_low = int(rng.integers(2)), bool(rng.integers(2))
    v = rng.uniform(*BOUNCE_SPEED)
    t_hit = rng.uniform(1.5, min(t - 2.01, hi / v))  # >= 1 step before the hit and >= 2 after it
    u = np.mod(v * (t_hit - np.arange(t)), 2 * hi)  # unfolded distance from the first wall, then folded
    along = np.where(u <= hi, u, 2 * hi - u)  # (t,) reflected into [0, hi]
    along = np.rint(along if towards_low else hi - along).astype(np.int64)
    pos = np.empty((t, 2), dtype=np.int64)
    pos[:, axis], pos[:, 1 - axis] = along, int(rng.integers(1, hi))
    return pos, _bounce_phrase(along, axis)


def _motion(rng: np.random.Generator, action: str, t: int, hi: int, speed=STRAIGHT_SPEED):
    """(t, 2) int64 positions within [0, hi] doing ``action`` over ``t`` frames, and its caption phrase."""
    steps = np.arange(t, dtype=np.float64)  # (t,)
    if action == "still":
        return _place(np.zeros((t, 2)), 0, hi, rng), "stays still"
    if action in _DIRECTIONS:
        v = rng.uniform(speed[0], min(speed[1], (hi - 2) / max(t - 1, 1)))
        return _place(np.outer(v * steps, _DIRECTIONS[action]), 1, hi - 1, rng), f"moves {action}"
    if action == "circle":
        r = rng.uniform(CIRCLE_RADIUS[0], min(CIRCLE_RADIUS[1], (hi - 2) / 2))
        sense = 1 if rng.integers(2) else -1  # +1: clockwise on screen
        omega = 2 * np.arcsin(rng.uniform(*CIRCLE_CHORD) / (2 * r))  # radians per frame
        angle = rng.uniform(0, 2 * np.pi) + sense * omega * steps  # (t,)
        path = r * np.stack([np.cos(angle), np.sin(angle)], axis=1)  # (t, 2)
        return _place(path, 1, hi - 1, rng), "goes round " + ("clockwise" if sense > 0 else "anticlockwise")
    if action == "zigzag":
        sx = 1 if rng.integers(2) else -1
        vx = rng.uniform(ZIGZAG_SPEED[0], min(ZIGZAG_SPEED[1], (hi - 2) / max(t - 1, 1)))
        period = int(rng.integers(2, min(4, (hi - 2) // ZIGZAG_STEP) + 1))
        turns = (np.arange(1, t) + int(rng.integers(period))) // period  # (t - 1,) flips before each step
        dy = ZIGZAG_STEP * (1 if rng.integers(2) else -1) * (-1) ** turns
        path = np.stack([sx * vx * steps, np.concatenate([[0], np.cumsum(dy)])], axis=1)  # (t, 2)
        return _place(path, 1, hi - 1, rng), "zigzags " + ("right" if sx > 0 else "left")
    if action == "bounce":
        return _bounce(rng, t, hi)
    raise ValueError(f"unknown action {action!r}; known: {ACTIONS}")


# ---- tracks and clips -----------------------------------------------------------------------------------


def _short_track(rng: np.random.Generator, s: ClipSettings, hi: int):
    """(positions (t, 2), visible (t,), action, phrase) of a short-setting target with its optional events."""
    t, most = s.n_frames, max(2, s.n_frames // 4)
    action = ACTIONS[int(rng.integers(len(ACTIONS)))]
    late, cut, end = 0, 0, None
    if rng.random() < s.event_prob and t - 2 >= MIN_MOVING:
        late = int(rng.integers(2, min(most, t - MIN_MOVING) + 1))
    if rng.random() < s.event_prob and t - late - 2 >= MIN_MOVING:
        cut = int(rng.integers(2, min(most, t - late - MIN_MOVING) + 1))
        end = "vanishes" if action == "still" or rng.random() < 0.5 else "stops"
    moving, phrase = _motion(rng, action, t - late - cut, hi)
    positions = np.concatenate([np.repeat(moving[:1], late, 0), moving, np.repeat(moving[-1:], cut, 0)])
    visible = np.ones(t, dtype=bool)
    visible[:late] = False
    if end == "vanishes":
        visible[t - cut :] = False
    phrase = ("appears and " if late else "") + phrase + (f" then {end}" if end else "")
    return positions, visible, action, phrase


def _long_track(rng: np.random.Generator, s: ClipSettings, hi: int):
    """Early direction, one absent frame, then an independent motion from a uniformly random place."""
    direction = tuple(_DIRECTIONS)[int(rng.integers(len(_DIRECTIONS)))]
    early, phrase = _motion(rng, direction, s.early, hi, EARLY_SPEED)
    later, later_phrase = _motion(rng, ACTIONS[int(rng.integers(len(ACTIONS)))], s.n_frames - s.early - 1, hi)
    positions = np.concatenate([early, early[-1:], later])  # (t, 2); the gap frame keeps the last position
    visible = np.ones(s.n_frames, dtype=bool)
    visible[s.early] = False
    return positions, visible, direction, f"{phrase} then vanishes then appears and {later_phrase}"


def make_clip(settings: ClipSettings, seed: int, index: int) -> list[ClipObject]:
    """The objects of clip ``index``, target first: a pure function of (settings, seed, index)."""
    rng = np.random.default_rng([_STREAM_TAG, seed, index])
    hi = settings.frame_size - SPRITE_SIZE[settings.sprites]  # the largest position
    objects = []
    for k in range(settings.n_objects):
        if k == 0:
            track = (_long_track if settings.setting == "long" else _short_track)(rng, settings, hi)
        else:  # the distractor: one motion over the whole clip, always visible
            action = ACTIONS[int(rng.integers(len(ACTIONS)))]
            positions, phrase = _motion(rng, action, settings.n_frames, hi)
            track = (positions, np.ones(settings.n_frames, dtype=bool), action, phrase)
        name, mask = _sprite(rng, settings.sprites, objects[0].name if objects else None)
        colour = tuple(COLOURS)[int(rng.integers(len(COLOURS)))] if settings.channels == 3 else None
        objects.append(ClipObject(name, colour, 1.0 if k == 0 else 0.5, mask, *track))
    return objects


def render(objects: list[ClipObject], frame_size: int, channels: int = 1) -> np.ndarray:
    """Paste each object's mask × colour × brightness at its visible positions: uint8 (t, c, s, s).

    Pixels combine by maximum, on black; an object without colour is white (255 in every channel).
    """
    t = len(objects[0].visible)
    canvas = np.zeros((t, frame_size, frame_size, channels), dtype=np.float32)  # (t, s, s, c) while drawing
    for obj in objects:
        if obj.colour is not None and channels != 3:
            raise ValueError(f"a coloured object ({obj.colour}) needs channels=3, got channels={channels}")
        h, w = obj.mask.shape
        when = np.flatnonzero(obj.visible)  # (t',)
        x, y = obj.positions[when].T  # (t',) each
        if when.size and (min(x.min(), y.min()) < 0 or max(x.max() + w, y.max() + h) > frame_size):
            raise ValueError(f"the {obj.name}'s track leaves the {frame_size}×{frame_size} frame")
        level = obj.brightness * np.asarray(COLOURS[obj.colour] if obj.colour else (255,) * channels)  # (c,)
        rows, cols = y[:, None] + np.arange(h), x[:, None] + np.arange(w)  # (t', h), (t', w)
        index = (when[:, None, None], rows[:, :, None], cols[:, None, :])
        canvas[index] = np.maximum(canvas[index], obj.mask[None, :, :, None] * level)  # (t', h, w, c)
    return np.rint(canvas).astype(np.uint8).transpose(0, 3, 1, 2)  # (t, s, s, c) -> (t, c, s, s)


def describe(objects: list[ClipObject]) -> str:
    """The caption: "the [colour] name phrase", the objects joined by "while", target first."""
    return " while ".join(" ".join(filter(None, ("the", o.colour, o.name, o.phrase))) for o in objects)


def make_clips(
    n: int,
    *,
    seed: int = 0,
    n_frames: int = 16,
    frame_size: int = 32,
    channels: int = 1,
    setting: Setting = "short",
    n_objects: int = 1,
    sprites: Sprites = "shapes",
    early: int = 4,
    event_prob: float = 0.3,
) -> Clips:
    """``n`` clips with their actions, the target's frame events and captions; clip i depends on (seed, i)."""
    check_int("n", n, 0)
    check_int("seed", seed, 0)
    s = ClipSettings(n_frames, frame_size, channels, setting, n_objects, sprites, early, event_prob)
    frames = np.empty((n, n_frames, channels, frame_size, frame_size), dtype=np.uint8)
    actions, events, captions = np.empty(n, dtype=np.int64), np.empty((n, n_frames), dtype=np.int64), []
    for i in range(n):
        objects = make_clip(s, seed, i)
        frames[i] = render(objects, frame_size, channels)
        actions[i] = ACTIONS.index(objects[0].action)
        events[i] = frame_events(objects[0].positions, objects[0].visible)
        captions.append(describe(objects))
    return Clips(torch.from_numpy(frames), torch.from_numpy(actions), torch.from_numpy(events), captions)
