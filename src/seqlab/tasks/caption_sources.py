"""The captioning task's sources: the (image, caption) pairs of a file source, and the settings each source takes
(``check_for_source``): an image side its source can draw or read, and no scene setting for files."""

from __future__ import annotations

from typing import Any

from seqlab.tasks.source_settings import refuse

__all__ = ["MIN_IMAGE_SIZE", "check_for_source", "file_pairs"]

MIN_IMAGE_SIZE = {"scenes": 32, "tuxpaint": 8, "folder": 8}
"""The least ``image_size`` of each source: the generated shapes are drawn on 32 pixels or more."""


def file_pairs(source: str, captions: str | None) -> list[tuple[Any, str]]:
    from seqlab.tasks import image_files

    if source == "tuxpaint":
        return image_files.tuxpaint_stamps()
    if captions is None:
        raise ValueError(
            "source='folder' needs captions=PATH, a CSV or JSON-lines file of image,caption rows"
        )
    return image_files.read_captions_file(captions)


def check_for_source(source: str, image_size: Any, max_objects: Any) -> int:
    """``image_size`` against its source's real least side, in one message (the scenes' 32 was told second); a
    file source has no objects to count: a ``max_objects`` other than the default is refused, not ignored."""
    least = MIN_IMAGE_SIZE[source]
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < least:
        why = " (the generated shapes are drawn on 32 pixels or more)" if source == "scenes" else ""
        raise ValueError(
            f"task.image_size must be an integer >= {least} for source={source!r}{why}, got {image_size!r}"
        )
    if source != "scenes" and (isinstance(max_objects, bool) or max_objects != 2):
        refuse(
            f"task.max_objects={max_objects!r} sets how many objects a generated scene holds (source='scenes'); "
            f"source={source!r} reads its images and captions from files, where it does not apply: leave it out"
        )
    return image_size
