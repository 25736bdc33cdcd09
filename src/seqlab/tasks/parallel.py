r"""Sentence pairs for translation: the built-in Bible, FreeDict's German–English examples, a user's file.

Readers return ``Pair(source, target, group)`` lists; ``group`` is what a split keeps together.

* ``bible_pairs`` (built in, any machine): ``seqlab/data/bible-web-rv1909.tsv.xz``, 31,067 rows of the
  World English Bible (engWEB2015eb, 2020 text) beside the Reina-Valera 1909 (spaRV1909eb), both public
  domain, built from the Debian packages sword-text-web and sword-text-sparv by
  ``scripts/build_bible_pairs.py`` (its docstring says how). One line a verse, canonical order, no header::

      book<TAB>chapter<TAB>verse<TAB>english<TAB>spanish

  Where the two translations number or divide verses differently (Job 39-40, Jonah 2, ...) a row holds
  several verses and carries the number of its first. The archaic Spanish ("crió", "á") meets modern
  English; Psalm superscriptions open verse 1 on both sides. Group: the book ("Genesis", "1 Kings").
  The file's sha256 is checked once per process (``BIBLE_SHA256``).
* ``freedict_pairs``: the example sentences and phrases inside the entries of FreeDict's German–English
  dictionary (from Ding, TU Chemnitz; GPL-3 / AGPL-3), read at run time from the Debian package
  dict-freedict-deu-eng, never copied into seqlab. Files: ``/usr/share/dictd/freedict-deu-eng.index``
  (``headword<TAB>offset<TAB>length``, the numbers in dictd's base64, digits ``A-Za-z0-9+/``) and
  ``freedict-deu-eng.dict.dz`` (dictzip, which gzip reads). Inside an entry an example is a line
  ``      "Ich denke an dich."  - I am thinking of you.``; there are 36,899 distinct pairs, about 7,200
  of them whole sentences, the rest phrases ("jdm. freie Hand lassen"). Group: the entry's headword, so
  one entry's examples stay in one split; a pair found under several headwords counts once, under the first.
* ``read_pairs_tsv``: a user's UTF-8 file of ``source<TAB>target[<TAB>group]`` lines.

Splits: ``split_pairs`` by named groups (``BIBLE_SPLIT``: whole books, about 5% each for validation and test,
Old and New Testament, narrative, poetry, prophecy and letters); ``random_group_split`` by hashing group
names (or whole pairs where the group is "") with a seed.
"""

from __future__ import annotations

import binascii
import bisect
import functools
import gzip
import hashlib
import importlib.resources
import lzma
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from seqlab.tasks.base import MissingDependencyError

__all__ = [
    "BIBLE_SHA256",
    "BIBLE_SPLIT",
    "MAX_BYTES",
    "Pair",
    "bible_pairs",
    "check_eval_splits",
    "check_fits",
    "freedict_pairs",
    "random_group_split",
    "read_pairs_tsv",
    "source_limit",
    "split_pairs",
]

BIBLE_FILE = "bible-web-rv1909.tsv.xz"
BIBLE_SHA256 = "719ccc1076d60bac05c5776d5dd68101c8bb51b37686770e021ef2dd97a02632"
BIBLE_SPLIT: dict[str, tuple[str, ...]] = {
    # 1,641 rows (5.3%): history, a story, poetry, prophecy; a letter of Paul's, two others.
    "val": ("Judges", "Esther", "Lamentations", "Amos", "Galatians", "Hebrews", "1 Peter"),
    # 1,629 rows (5.2%): stories, history, wisdom, prophecy; a gospel and two letters.
    "test": ("Ruth", "Ezra", "Ecclesiastes", "Jonah", "Micah", "Mark", "Philippians", "James"),
}
"""The Bible's fixed split: whole books for validation and test, every other book for training (89.5%)."""

MAX_BYTES = 200_000_000
"""The largest pairs file ``read_pairs_tsv`` reads unless told (``max_bytes``; the translation task's ``max_bytes``):
reading takes about 4 times the file's size in memory (the pairs it returns 2.5), the translation task 5."""
BLOCK = 1 << 24  # bytes of a pairs file decoded at a time (a newline never ends inside a UTF-8 character)

FREEDICT_DIR = Path("/usr/share/dictd")
FREEDICT_PACKAGE = "dict-freedict-deu-eng"
_INDEX_LINE = re.compile(r"^([^\t\n]*)\t([A-Za-z0-9+/]{1,8})\t([A-Za-z0-9+/]{1,8})$", flags=re.M)
_EXAMPLE = re.compile(rb'\n[ \t]+"([^\n]+)"[ \t]+-[ \t]+([^\n]+)')  # the line's start: after its \n


@dataclass(frozen=True)
class Pair:
    """One sentence in two languages, and the group a split keeps together ("" for none).

    Examples::

        >>> Pair("In the beginning, God created", "En el principio crió Dios", group="Genesis").target
        'En el principio crió Dios'
    """

    source: str
    target: str
    group: str


def _check_languages(corpus: str, available: tuple[str, str], src_lang: str, tgt_lang: str) -> bool:
    """True when the pairs must be flipped (``src_lang`` is the file's second language)."""
    for lang in (src_lang, tgt_lang):
        if lang not in available:
            raise ValueError(
                f"the built-in {corpus} pairs are in {available[0]} and {available[1]}; got {lang!r}"
            )
    if src_lang == tgt_lang:
        raise ValueError(f"source and target language are both {src_lang!r}; pick one of each of {available}")
    return src_lang == available[1]


# ----------------------------------------------------------------------------------------------------------
# The Bible, shipped with seqlab.


@functools.lru_cache(maxsize=1)
def _bible_rows() -> tuple[tuple[str, str, str], ...]:
    """(book, english, spanish) of every row of the shipped file, its sha256 checked."""
    resource = importlib.resources.files("seqlab.data").joinpath(BIBLE_FILE)
    if not resource.is_file():
        raise FileNotFoundError(
            f"seqlab's data file {BIBLE_FILE} is missing from {resource}: reinstall seqlab (the file is package "
            "data), or rebuild it with python scripts/build_bible_pairs.py"
        )
    data = resource.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != BIBLE_SHA256:
        raise OSError(
            f"seqlab's data file {resource} is damaged: sha256 {digest}, expected {BIBLE_SHA256}; reinstall "
            "seqlab or rebuild the file with python scripts/build_bible_pairs.py"
        )
    rows = []
    for line in lzma.decompress(data).decode("utf-8").rstrip("\n").split("\n"):
        book, _chapter, _verse, english, spanish = line.split("\t")
        rows.append((book, english, spanish))
    return tuple(rows)


def bible_pairs(src_lang: str = "en", tgt_lang: str = "es") -> list[Pair]:
    """The Bible's verse pairs in canonical order, English–Spanish either way; group: the book.

    Examples::

        >>> pairs = bible_pairs("es", "en")
        >>> len(pairs), pairs[0].group, pairs[0].source
        (31067, 'Genesis', 'En el principio crió Dios los cielos y la tierra.')
    """
    flip = _check_languages("Bible", ("en", "es"), src_lang, tgt_lang)
    return [Pair(es, en, book) if flip else Pair(en, es, book) for book, en, es in _bible_rows()]


# ----------------------------------------------------------------------------------------------------------
# FreeDict's German–English examples, read where the Debian package is installed.


def _dictd_number(digits: str) -> int:
    """dictd's base64 numbers: digits ``A-Za-z0-9+/`` worth 0..63, most significant first ("B0" = 116).

    They are base64's digits, so padded with "A" (zero) to eight they decode to the number's six bytes.
    """
    return int.from_bytes(binascii.a2b_base64(digits.rjust(8, "A")), "big")


def _freedict_files() -> tuple[Path, Path]:
    index, data = FREEDICT_DIR / "freedict-deu-eng.index", FREEDICT_DIR / "freedict-deu-eng.dict.dz"
    if not (index.is_file() and data.is_file()):
        raise MissingDependencyError(
            f"The German–English pairs are read from the Debian package {FREEDICT_PACKAGE}, which is not "
            f"installed ({index} is missing). Install it with: apt-get install {FREEDICT_PACKAGE}"
        )
    return index, data


def _entries(index: Path) -> dict[int, str]:
    """{offset: length in dictd digits} of the dictionary's entries; dictd's own 00database* entries left out."""
    text = index.read_text(encoding="utf-8")
    rows = _INDEX_LINE.findall(text)
    lines = text.rstrip("\n").split("\n")
    if len(rows) != len(lines):
        bad = ((n, ln) for n, ln in enumerate(lines, 1) if not _INDEX_LINE.fullmatch(ln))
        number, line = next(bad, (0, ""))
        raise ValueError(f"{index}:{number}: expected headword<TAB>offset<TAB>length, got {line[:80]!r}")
    return {
        _dictd_number(offset): length for head, offset, length in rows if not head.startswith("00database")
    }


@functools.lru_cache(maxsize=1)
def _freedict_examples() -> tuple[tuple[str, str, str], ...]:
    """(German, English, headword) of every distinct example pair, in dictionary order."""
    index, dict_dz = _freedict_files()
    entries = _entries(index)
    starts = sorted(entries)
    with gzip.open(dict_dz) as f:
        data = f.read()
    seen: dict[tuple[str, str], str] = {}
    for found in _EXAMPLE.finditer(data):
        k = bisect.bisect_right(starts, found.start()) - 1
        start = starts[k] if k >= 0 else -1
        if start < 0 or found.end() > start + _dictd_number(entries[start]):
            continue  # outside every entry
        first_line = data[start : data.find(b"\n", start)].decode("utf-8")
        headword = first_line.split(" /")[0].split(" <")[0].strip()  # "Haus /haʊs/ <neut, n, sg>"
        german, english = (part.decode("utf-8").strip() for part in found.groups())
        if german and english:
            seen.setdefault((german, english), headword)
    return tuple((german, english, headword) for (german, english), headword in seen.items())


def freedict_pairs(src_lang: str = "de", tgt_lang: str = "en") -> list[Pair]:
    """FreeDict's German–English example pairs (either way) in dictionary order; group: the headword.

    Raises MissingDependencyError when the Debian package dict-freedict-deu-eng is not installed.

    Examples::

        >>> pairs = freedict_pairs()  # doctest: +SKIP
        >>> len(pairs)  # doctest: +SKIP
        36899
    """
    flip = _check_languages("FreeDict", ("de", "en"), src_lang, tgt_lang)
    return [Pair(en, de, head) if flip else Pair(de, en, head) for de, en, head in _freedict_examples()]


# ----------------------------------------------------------------------------------------------------------
# A user's file.


def _open_pairs_file(path: Path, max_bytes: int) -> tuple[bytes, int]:
    """(the file's bytes, where its text starts: after a byte-order mark), after the checks ``read_pairs_tsv``
    lists; UTF-8 checked a block at a time, never decoded whole (4 bytes a character if one emoji is in it)."""
    if not path.exists():
        raise FileNotFoundError(f"pairs file {str(path)!r} does not exist; expected source<TAB>target lines")
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory; expected a file of source<TAB>target lines")
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is not a regular file (a device or a pipe?); expected a text file")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(
            f"{str(path)!r} is {size:,} bytes, over the limit of {max_bytes:,}: give a part of it, or, where memory "
            f"allows 5 times the file's size, --task.max_bytes={size} (translation) or read_pairs_tsv(path, "
            f"max_bytes={size}) from Python"
        )
    data = path.read_bytes()
    if b"\x00" in data:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        raise ValueError(f"{path}:{line}: NUL byte: the file looks binary; expected UTF-8 text")
    start = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    for line, block in _blocks(data, start):
        try:
            block.decode("utf-8")
        except UnicodeDecodeError as e:
            line += block.count(b"\n", 0, e.start)
            raise ValueError(
                f"{path}:{line}: not UTF-8 (byte {block[e.start]:#04x}); the file looks binary or is in another "
                "encoding: convert it to UTF-8"
            ) from None
    return data, start


def _blocks(data: bytes, start: int) -> Iterator[tuple[int, bytes]]:
    """(its first line's number, about BLOCK bytes of whole lines) of ``data[start:]``; each decodes alone."""
    line = 1
    while start < len(data):
        end = data.find(b"\n", start + BLOCK) + 1 or len(data)
        yield line, data[start:end]
        line, start = line + data.count(b"\n", start, end), end


def read_pairs_tsv(path: str | Path, max_bytes: int = MAX_BYTES) -> list[Pair]:
    """Pairs from a UTF-8 file of ``source<TAB>target`` lines, with an optional third column, the group.

    Blank lines are skipped, a byte-order mark is dropped, spaces around each field are stripped; without a
    third column the group is "" (the split then goes by pair). Raises FileNotFoundError for a missing path
    and ValueError, naming the file and the line, for a line without a tab, with more than three columns or
    an empty side; for a directory, a device, a binary file (NUL bytes, invalid UTF-8), a file over
    ``max_bytes`` and a file without pairs. The file is read whole, then decoded a block at a time.
    """
    path = Path(path).expanduser()
    data, start = _open_pairs_file(path, max_bytes)
    pairs: list[Pair] = []
    for first, block in _blocks(data, start):
        for number, line in enumerate(block.decode("utf-8").split("\n"), first):
            if line.strip():
                pairs.append(_pair(path, number, line))
    if not pairs:
        raise ValueError(f"{path} has no pairs; expected source<TAB>target lines")
    return pairs


def _pair(path: Path, number: int, line: str) -> Pair:
    """The pair on line ``number`` (not blank) of ``path``; a ValueError naming the line if it is malformed."""
    fields = [field.strip() for field in line.rstrip("\r").split("\t")]
    if len(fields) == 1:
        raise ValueError(f"{path}:{number}: no tab; expected source<TAB>target[<TAB>group]: {line[:60]!r}")
    if len(fields) > 3:
        raise ValueError(f"{path}:{number}: {len(fields)} columns; expected source<TAB>target[<TAB>group]")
    for side, field in zip(("source", "target"), fields, strict=False):
        if not field:
            raise ValueError(f"{path}:{number}: the {side} side is empty")
    return Pair(fields[0], fields[1], fields[2] if len(fields) == 3 else "")


# ----------------------------------------------------------------------------------------------------------
# Splits.


def split_pairs(
    pairs: Iterable[Pair], *, val_groups: Sequence[str], test_groups: Sequence[str]
) -> dict[str, list[Pair]]:
    """{"train", "val", "test"}: pairs of the named groups go to val and test, all others to train.

    Order is kept within each split. Raises ValueError when a group is named twice or is not in the pairs.
    """
    pairs = list(pairs)
    val, test = set(val_groups), set(test_groups)
    if val & test:
        raise ValueError(f"groups in both val and test: {sorted(val & test)}")
    missing = (val | test) - {pair.group for pair in pairs}
    if missing:
        raise ValueError(f"groups not in the pairs: {sorted(missing)}")
    splits: dict[str, list[Pair]] = {"train": [], "val": [], "test": []}
    for pair in pairs:
        splits["val" if pair.group in val else "test" if pair.group in test else "train"].append(pair)
    return splits


def _unit(seed: int, key: str) -> float:
    """A number in [0, 1) that depends on the seed and the key only."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def random_group_split(
    pairs: Iterable[Pair], seed: int, val_fraction: float = 0.05, test_fraction: float = 0.05
) -> dict[str, list[Pair]]:
    """{"train", "val", "test"} by hashing: whole groups go together; pairs with group "" go one by one.

    A group (or an ungrouped pair, keyed by its two texts) goes to test when a hash of the seed and its
    name falls below ``test_fraction``, to val when it falls in the next ``val_fraction``: the split does
    not depend on the order of the pairs, and identical pairs land together. Fractions count groups, so
    splits by a few large groups come out uneven. With three keys or more, val and test get at least one
    each (the keys hashing lowest) when their fraction is above zero.
    """
    if not (val_fraction >= 0 and test_fraction >= 0 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"need 0 <= val_fraction, test_fraction and a sum below 1, got {val_fraction}, {test_fraction}"
        )
    pairs = list(pairs)
    keys = [f"group:{p.group}" if p.group else f"pair:{p.source}\t{p.target}" for p in pairs]
    unit = {key: _unit(seed, key) for key in keys}
    test = {key for key, u in unit.items() if u < test_fraction}
    if not test and test_fraction > 0 and len(unit) >= 3:  # the key hashing lowest (a tie: the first by name)
        test = {min((u, key) for key, u in unit.items())[1]}
    val = {key for key, u in unit.items() if key not in test and u < test_fraction + val_fraction}
    if not val and val_fraction > 0 and len(unit) >= 3:
        val = {min((u, key) for key, u in unit.items() if key not in test)[1]}
    splits: dict[str, list[Pair]] = {"train": [], "val": [], "test": []}
    for pair, key in zip(pairs, keys, strict=True):
        splits["test" if key in test else "val" if key in val else "train"].append(pair)
    return splits


def source_limit(model) -> tuple[str, int | None]:
    """(the config field, its value) that bounds a source sentence (</s> included): Seq2Seq's ``max_src_len``, a
    Transformer's ``max_seq_len`` (which bounds the target too); (``max_src_len``, None) for a model with none."""
    config = getattr(model, "config", None)
    for field in ("max_src_len", "max_seq_len"):
        if (limit := getattr(config, field, None)) is not None:
            return field, limit
    return "max_src_len", None


def check_fits(model, longest_source: int, longest_target: int, max_len: int) -> None:
    """Before step 1: the task's longest sentences (</s> included) against what the model accepts
    (:func:`source_limit`; a batch holding a longer one failed mid-training)."""
    field, limit = source_limit(model)
    longest = max(longest_source, longest_target) if field == "max_seq_len" else longest_source
    if limit is not None and longest > limit:
        raise ValueError(
            f"task.max_len={max_len} keeps sentences of up to {longest} tokens (</s> included), longer than the "
            f"model's {field}={limit}: set task.max_len={limit} (longer pairs are left out) or raise "
            f"model.{field}"
        )


def check_eval_splits(source: str, splits: dict[str, list[Pair]], data: dict, max_len: int) -> None:
    """Validation and test must hold pairs, or the first evaluation would fail after training had begun."""
    for name in ("val", "test"):
        if not splits[name]:
            keys = {p.group or (p.source, p.target) for pairs in splits.values() for p in pairs}
            raise ValueError(
                f"the {name} split of {source!r} is empty: its pairs make {len(keys)} distinct groups (or "
                f"ungrouped pairs), and train, validation and test need at least 3, one each; give more pairs "
                f"or more groups"
            )
        if not data[name][0]:
            raise ValueError(
                f"no {name} pair of {source!r} has at most max_len={max_len} tokens per side (its "
                f"{len(splits[name])} pairs are all longer); raise task.max_len"
            )
