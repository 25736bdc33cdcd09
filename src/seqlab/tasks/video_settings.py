"""The video settings that shape one source, or one setting of the generated clips, only
(``check_video_settings``).

    generated only  setting, n_objects, sprites, event_prob, n_train, n_eval: what ``seqlab.tasks.clips``
                    draws and how many clips (a folder's clips are its own, every one used)
    short only      event_prob: how often a short clip's target appears late, stops or vanishes
    long only       early (``clips.make_clips``): the frames of a long clip's early direction
    folder only     path (refused on its own by the task)

A value other than the constructor's default where it does not apply is refused before any clip is read or
drawn (``source_settings.refuse_unused``): it would change nothing.
"""

from __future__ import annotations

from typing import Any

from seqlab.tasks.source_settings import refuse_unused

__all__ = ["GENERATED_ONLY", "check_video_settings"]

GENERATED_ONLY = {
    "setting": "sets what a generated clip's action is (long: the direction of its first frames)",
    "n_objects": "sets how many objects a generated clip holds",
    "sprites": "sets what the generated objects are drawn as",
    "event_prob": "sets how often a generated object appears late, stops or vanishes",
    "n_train": "sets how many training clips are generated",
    "n_eval": "sets how many validation and test clips are generated",
}
"""The settings of generated clips, each with what it sets."""
FOLDER_READS = "the folder's own clips are the data (every row of labels.csv, split 80/10/10 by clip)"
OTHER_SETTING = {
    "long": (
        {"event_prob": "sets how often a short clip's target appears late, stops or vanishes"},
        "a long clip's target always moves for its early frames, vanishes for one and reappears elsewhere",
    ),
    "short": (
        {"early": "sets how many frames a long clip's early direction lasts"},
        "a short clip has no early part: its label is the motion of the whole clip",
    ),
}
"""Per setting: the settings of the other one (each with what it sets), and what this one draws instead."""


def check_video_settings(
    owner: type, source: Any, setting: Any, values: dict[str, Any], prefix: str = "task."
) -> None:
    """The settings ``values`` (name -> value, as given to ``owner``'s constructor) that do not apply to
    ``source`` (a folder), or to ``setting`` of generated clips, at their defaults: a ValueError naming those
    given otherwise, as ``{prefix}{name}`` (an unknown source or setting passes: its own check refuses it)."""
    if source == "folder":
        given = {k: v for k, v in values.items() if k in GENERATED_ONLY}
        refuse_unused(owner, source, given, GENERATED_ONLY, FOLDER_READS, prefix=prefix)
    elif source == "generated" and setting in OTHER_SETTING:
        reasons, draws = OTHER_SETTING[setting]
        given = {k: v for k, v in values.items() if k in reasons}
        refuse_unused(owner, setting, given, reasons, draws, field="setting", prefix=prefix)
