"""The speech tasks' settings that shape one source only (``check_source_settings``); ``snrs``' own check.

    generated only  n_train, n_eval, snrs, min_digits, max_digits (speech_ctc), cache_dir, jobs: they shape
                    the espeak-ng corpus (``seqlab.tasks.speech_corpus``) and where and how it is built
    folder only     path, max_seconds: which folder, and its longest recording (``speech_folder``)

A value other than the constructor's default for the other source is refused before anything is read or
generated (``source_settings.refuse_unused``): it would change nothing.
"""

from __future__ import annotations

import math
from typing import Any

from seqlab.tasks.source_settings import refuse_unused

__all__ = ["FOLDER_ONLY", "GENERATED_ONLY", "check_snrs", "check_source_settings"]

GENERATED_ONLY = {
    "n_train": "sets how many training utterances the generated corpus speaks",
    "n_eval": "sets how many validation and test utterances the generated corpus speaks",
    "snrs": "sets the noise mixed into the generated speech",
    "min_digits": "sets the shortest digit string the generated corpus speaks",
    "max_digits": "sets the longest digit string the generated corpus speaks",
    "cache_dir": "sets where the generated corpus is built and kept",
    "jobs": "sets how many processes build the generated corpus",
}
"""Settings of the generated corpus, each with what it sets."""
FOLDER_ONLY = {"max_seconds": "sets the longest recording a folder may hold"}
"""Settings of a user's folder (besides ``path``, refused on its own), each with what it sets."""
READS = {
    "folder": "the folder's own recordings are the data (every line of transcripts.txt, split 80/10/10 by "
    "speaker when it names speakers, else by file)",
    "generated": "the generated corpus's utterances are a word or a few digits, a few seconds each",
}


def check_source_settings(owner: type, source: Any, **values: Any) -> None:
    """The settings ``values`` (name -> value, as given to ``owner``'s constructor) that do not apply to
    ``source`` at their defaults: a ValueError naming those given otherwise (an unknown source passes, for
    the constructor's own check to refuse)."""
    if source not in READS:
        return
    reasons = FOLDER_ONLY if source == "generated" else GENERATED_ONLY
    refuse_unused(owner, source, {k: v for k, v in values.items() if k in reasons}, reasons, READS[source])


def check_snrs(snrs) -> list[float | None] | None:
    """``snrs``: None (the corpus's own), or a list of signal-to-noise ratios in dB (null: clean speech)."""
    if snrs is None:
        return None
    try:
        out = [None if s is None else float(s) for s in snrs if not isinstance(snrs, str | bytes)]
        if not out or not all(s is None or math.isfinite(s) for s in out):
            raise ValueError  # none to draw from, or a NaN or infinite ratio
        return out
    except (TypeError, ValueError):
        raise ValueError(
            f"snrs must be a non-empty list of finite signal-to-noise ratios in dB (null for clean speech), e.g. "
            f"--task.snrs='[null, 20, 10]'; got {snrs!r}"
        ) from None
