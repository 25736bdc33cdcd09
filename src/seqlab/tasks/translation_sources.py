"""Where a translation task's pairs come from, and which of the task's settings apply to which source.

* A built-in corpus (``BUILT_IN``: ``"bible"`` in en and es, ``"freedict"`` in de and en): ``src_lang`` and
  ``tgt_lang`` choose the direction. Either may be named alone (the other is then the corpus's other
  language); neither: the corpus's own order. ``max_bytes`` limits a file read from disk and a built-in
  corpus is none, so a value other than its default (``parallel.MAX_BYTES``) is refused, not ignored.
* A user's file of ``source<TAB>target`` lines: the first column is the source, the second the target,
  whatever their languages; nothing in the file names them, so ``src_lang`` and ``tgt_lang`` cannot choose
  or flip the direction and a value is refused, not ignored. The task reports the labels ``"src"`` and
  ``"tgt"`` for a file; those are accepted back (a description saved with a checkpoint, given again as
  settings, builds the same task).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from seqlab.tasks.base import SPLIT_SEED
from seqlab.tasks.pair_ids import say
from seqlab.tasks.parallel import (
    BIBLE_SPLIT,
    MAX_BYTES,
    Pair,
    bible_pairs,
    freedict_pairs,
    random_group_split,
    read_pairs_tsv,
    split_pairs,
)
from seqlab.tasks.source_settings import refuse

__all__ = ["BUILT_IN", "FILE_LABELS", "built_in_languages", "read_source"]

BUILT_IN = {"bible": ("en", "es"), "freedict": ("de", "en")}
"""The built-in corpora and their two languages, in their default direction (source, target)."""
FILE_LABELS = ("src", "tgt")
"""What a task reads from a pairs file reports as its languages (``describe``): the file cannot tell."""


def read_source(
    source: str, src_lang: str | None, tgt_lang: str | None, max_bytes: int = MAX_BYTES
) -> tuple[str, str, dict[str, list[Pair]]]:
    """(source language, target language, pairs by split) for a built-in corpus or a TSV file; the
    settings that do not apply to ``source`` refused (see the module docstring) before anything is read."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"task.source must be 'bible', 'freedict' or a path to a .tsv file, got {source!r}")
    if source in BUILT_IN:
        _check_max_bytes(source, max_bytes)
        src_lang, tgt_lang = built_in_languages(source, src_lang, tgt_lang)
        if source == "bible":
            pairs = bible_pairs(src_lang, tgt_lang)
            return (
                src_lang,
                tgt_lang,
                split_pairs(pairs, val_groups=BIBLE_SPLIT["val"], test_groups=BIBLE_SPLIT["test"]),
            )
        return src_lang, tgt_lang, random_group_split(freedict_pairs(src_lang, tgt_lang), SPLIT_SEED)
    path = Path(source)
    if path.suffix.lower() not in (".tsv", ".txt") and not path.exists():
        raise ValueError(
            f"unknown translation source {source!r}: use 'bible', 'freedict' or a path to a .tsv file"
        )
    _check_file_languages(source, src_lang, tgt_lang)
    t0 = time.perf_counter()
    pairs = read_pairs_tsv(path, max_bytes)
    n, seconds = f"{len(pairs):,}", time.perf_counter() - t0
    say(len(pairs), "translation data: read %s pairs from %s in %.0f s", n, path, seconds)
    return FILE_LABELS[0], FILE_LABELS[1], random_group_split(pairs, SPLIT_SEED)


def built_in_languages(source: str, src_lang: Any, tgt_lang: Any) -> tuple[str, str]:
    """(source, target language) of the built-in corpus ``source``: each of ``src_lang`` and ``tgt_lang``
    one of its two languages or None (the other one, or the corpus's default direction when both are None)."""
    first, second = BUILT_IN[source]
    for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if lang is not None and lang not in (first, second):
            raise ValueError(
                f"task.{name}={lang!r}: the built-in corpus {source!r} is in {first!r} and {second!r}; name "
                f"one of them, or leave task.{name} unset"
            )
    if src_lang is None:
        src_lang = second if tgt_lang == first else first
    if tgt_lang is None:
        tgt_lang = first if src_lang == second else second
    if src_lang == tgt_lang:
        raise ValueError(
            f"task.src_lang and task.tgt_lang are both {src_lang!r}; the built-in corpus {source!r} "
            f"translates between {first!r} and {second!r}: name one of each"
        )
    return src_lang, tgt_lang


def _check_file_languages(source: str, src_lang: Any, tgt_lang: Any) -> None:
    """``src_lang`` and ``tgt_lang`` unset (or the labels the task reports for a file) for a pairs file."""
    given = [
        f"task.{name}={lang!r}"
        for name, lang, label in zip(("src_lang", "tgt_lang"), (src_lang, tgt_lang), FILE_LABELS, strict=True)
        if lang is not None and lang != label
    ]
    if given:
        them = " and ".join(given)
        refuse(
            f"{them} {'do' if len(given) > 1 else 'does'} not apply to a pairs file ({source}): its first "
            "column is the source and its second the target, whatever their languages, so the setting would "
            "change nothing (task.src_lang and task.tgt_lang choose the direction of the built-in corpora "
            f"only: {', '.join(f'{k} ({a}, {b})' for k, (a, b) in BUILT_IN.items())}); leave them unset, or "
            "swap the file's columns to translate the other way"
        )


def _check_max_bytes(source: str, max_bytes: int) -> None:
    """``max_bytes`` at its default for a built-in corpus: it limits a pairs file read from disk only."""
    if max_bytes != MAX_BYTES:
        refuse(
            f"task.max_bytes={max_bytes:,} does not apply to the built-in corpus {source!r}: it limits the "
            f"size of a pairs file read from disk, and {source!r} is not one, so it would change nothing; "
            f"leave task.max_bytes unset (default {MAX_BYTES:,})"
        )
