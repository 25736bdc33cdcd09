r"""A user's folder of recordings and their transcripts, read as utterances (``read_speech_folder``).

    FOLDER/transcripts.txt   one line per utterance: FILE.wav <TAB> transcript [<TAB> speaker];
                             blank lines and lines starting with # are skipped
    FOLDER/FILE.wav          any rate, any channel count (``speech_data.read_wav``)

Before any audio is read, every file the transcripts name is checked, and each kind of fault is one error that
names the files (the first few, and how many): a file that is missing (or a folder), then a recording longer
than ``max_seconds`` (its length from the file's header). A line of ``transcripts.txt`` is one utterance, a
sentence or so; a long recording is refused rather than trained on, because a training step's memory grows with
the square of its length: CTC's forward-backward keeps (t', 2L + 1) numbers per utterance, with t' its output
frames and L its labels, both in proportion to its length (a 30-minute file asked ``F.ctc_loss`` for 517 GB).

With a speaker column the folder is split by speaker (``speech_data.split_by_speaker``: no test speaker is heard
in training), otherwise by file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seqlab.tasks.base import first_named, torch_threads
from seqlab.tasks.speech_data import (
    MIN_SECONDS,
    TRANSCRIPTS,
    Features,
    Utterances,
    read_wav,
    soundfile_module,
)

__all__ = ["MAX_SECONDS", "check_max_seconds", "normalize_text", "read_speech_folder"]

MAX_SECONDS = 60.0
"""The longest recording a folder may hold unless ``max_seconds`` says otherwise: a minute, past the longest
utterance of LibriSpeech (35 s) and Common Voice (10 s), short of a recording that wants cutting into them."""


def check_max_seconds(value: Any) -> float:
    """``max_seconds`` as a float: a number of seconds above ``MIN_SECONDS`` (``inf``: no limit)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > MIN_SECONDS:
        raise ValueError(
            f"max_seconds must be a number of seconds above {MIN_SECONDS} (the shortest recording read), e.g. "
            f"{MAX_SECONDS:g}; got {value!r}"
        )
    return float(value)


def normalize_text(text: str) -> str:
    """Lowercase, whitespace collapsed to single spaces: the form transcripts are compared in."""
    return " ".join(text.lower().split())


def _read_transcripts(path: Path) -> list[tuple[str, str, str, int]]:
    """(file, transcript, speaker or "", line number) per utterance line of the transcript file ``path``."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: a speech folder needs {TRANSCRIPTS}, one line per WAV file: "
            "FILE.wav<TAB>transcript[<TAB>speaker]"
        )
    rows, first = [], {}
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in line.split("\t")]
        if len(cells) not in (2, 3) or not cells[0] or not normalize_text(cells[1]):
            raise ValueError(
                f"{path}, line {number}: expected FILE.wav<TAB>transcript[<TAB>speaker], got {line!r} "
                "(the separators are tab characters)"
            )
        key = os.path.normpath(cells[0])  # ./u0.wav is u0.wav
        if key in first:  # a second row would make a second sample, which the split could part
            raise ValueError(
                f"{path}, line {number}: {cells[0]!r} is named again (first at line {first[key]}); "
                f"{TRANSCRIPTS} takes one line per WAV file"
            )
        first[key] = number
        rows.append((cells[0], normalize_text(cells[1]), cells[2] if len(cells) == 3 else "", number))
    if not rows:
        raise ValueError(f"{path} names no utterances")
    return rows


def _check_files_exist(path: Path, rows: list[tuple[str, str, str, int]]) -> None:
    """Every file the transcripts (``path``) name is a file: one FileNotFoundError naming those that are not."""
    wavs = [(path.parent / name, n) for name, *_, n in rows]
    bad = [
        f"line {n}: {wav} {'is a folder, not a file' if wav.is_dir() else 'does not exist'}"
        for wav, n in wavs
        if not wav.is_file()
    ]
    if bad:
        are = "is" if len(bad) == 1 else "are"
        raise FileNotFoundError(
            f"{path}: {len(bad):,} of the {len(rows):,} WAV files it names {are} not there "
            f"({first_named(bad, '; ', '; and')}); add the missing files to {path.parent}, or remove their lines"
        )


def _check_durations(path: Path, rows: list[tuple[str, str, str, int]], max_seconds: float) -> None:
    """No recording the transcripts (``path``) name is longer than ``max_seconds``, read from the files' headers:
    one ValueError naming those that are, with their lengths, otherwise."""
    sf, long = soundfile_module(), []
    for name, *_, n in rows:
        try:
            info = sf.info(str(path.parent / name))
        except (RuntimeError, sf.LibsndfileError):
            continue  # not audio: read_wav says so, with its line
        seconds = info.frames / info.samplerate if info.samplerate > 0 else 0.0
        if seconds > max_seconds:
            minutes = f" = {seconds / 60:,.1f} min" if seconds >= 120 else ""
            long.append(f"line {n}: {name} ({seconds:,.1f} s{minutes})")
    if long:
        are = "is" if len(long) == 1 else "are"
        raise ValueError(
            f"{path}: {len(long):,} of its {len(rows):,} recordings {are} longer than max_seconds={max_seconds:g} "
            f"s ({first_named(long, '; ', '; and')}). A line of {TRANSCRIPTS} is one utterance, a sentence or so: "
            "cut long recordings into utterances, each with its own line and transcript, or raise the task's "
            f"max_seconds (e.g. --task.max_seconds={2 * max_seconds:g}; a training step's memory grows with the "
            "square of an utterance's length)"
        )


def read_speech_folder(
    folder: str | Path, features: Features, max_seconds: float = MAX_SECONDS
) -> Utterances:
    """The utterances of a user's folder (module docstring), as features; the speaker is "" when not given.
    Every file is checked to be there, then to be at most ``max_seconds`` long, before the first is read."""
    folder, max_seconds = Path(folder), check_max_seconds(max_seconds)
    if not folder.is_dir():
        raise FileNotFoundError(f"speech folder not found: {folder}")
    path = folder / TRANSCRIPTS
    rows = _read_transcripts(path)
    _check_files_exist(path, rows)
    _check_durations(path, rows, max_seconds)
    seqs = []
    # one file's features are small ops: a team of threads waits at each one's end, and on a busy machine for a
    # core (150 utterances, 2-core AMD EPYC at load 3: 0.11 s on 1 thread, 0.39 s on 2)
    with torch_threads(1):
        for name, *_, n in rows:
            try:
                seqs.append(features(read_wav(folder / name, features.sample_rate)))
            except ValueError as e:
                raise ValueError(f"{path}, line {n}: {e}") from e
    return Utterances.of(seqs, [text for _, text, *_ in rows], [speaker for _, _, speaker, _ in rows])
