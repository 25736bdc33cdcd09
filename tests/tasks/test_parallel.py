"""Translation data: the shipped Bible pairs and their rebuild, FreeDict's examples, a user's TSV, the splits.

FreeDict is GPL: its text is read where the package is installed and never copied here; the small dictionary
written by ``_write_dictionary`` is made up for these tests.
"""

from __future__ import annotations

import binascii
import dataclasses
import gzip
import hashlib
import importlib.resources
import importlib.util
import lzma
import random
import re
from pathlib import Path

import pytest

from seqlab.tasks import parallel
from seqlab.tasks.base import MissingDependencyError
from seqlab.tasks.parallel import (
    BIBLE_SHA256,
    BIBLE_SPLIT,
    Pair,
    bible_pairs,
    freedict_pairs,
    random_group_split,
    read_pairs_tsv,
    split_pairs,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_bible_pairs.py"
SWORD = Path("/usr/share/sword/modules/texts/ztext")
HAS_SWORD = (SWORD / "engWEB2015eb").is_dir() and (SWORD / "spaRV1909eb").is_dir()
HAS_FREEDICT = (parallel.FREEDICT_DIR / "freedict-deu-eng.index").is_file()
N_BIBLE, N_VAL, N_TEST = 31067, 1641, 1629
OLD_TESTAMENT_END = "Malachi"


def _shipped() -> bytes:
    return importlib.resources.files("seqlab.data").joinpath(parallel.BIBLE_FILE).read_bytes()


def _verses() -> dict[tuple[str, int, int], tuple[str, str]]:
    """{(book, chapter, verse): (english, spanish)} read straight from the shipped file."""
    rows = (line.split("\t") for line in lzma.decompress(_shipped()).decode("utf-8").rstrip("\n").split("\n"))
    return {(book, int(chapter), int(verse)): (en, es) for book, chapter, verse, en, es in rows}


def _load_script():
    spec = importlib.util.spec_from_file_location("build_bible_pairs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fresh_caches():
    """Readers cache their file for the process: clear before and after a test that changes what they see."""
    parallel._bible_rows.cache_clear()
    parallel._freedict_examples.cache_clear()
    yield
    parallel._bible_rows.cache_clear()
    parallel._freedict_examples.cache_clear()


# ----------------------------------------------------------------------------------------------------------
# The Bible.


def test_the_shipped_file_has_the_recorded_checksum_and_stays_small():
    data = _shipped()
    assert hashlib.sha256(data).hexdigest() == BIBLE_SHA256
    assert data.startswith(b"\xfd7zXZ\x00") and len(data) < 3_000_000


def test_known_verses_in_both_languages():
    verses = _verses()
    assert len(verses) == N_BIBLE
    en, es = verses["Genesis", 1, 1]
    assert en.startswith("In the beginning") and es.startswith("En el principio")
    en, es = verses["John", 3, 16]
    assert "For God so loved the world" in en and "de tal manera amó Dios al mundo" in es
    en, es = verses["Revelation", 22, 21]
    assert en.startswith("The grace of the Lord Jesus") and es.startswith("La gracia de nuestro Señor")
    en, es = verses["Jonah", 1, 17]  # the Reina-Valera numbers this verse 2:1: realigned
    assert "fish" in en and "pez" in es


def test_bible_pairs_follow_the_file_in_either_direction():
    verses = _verses()
    pairs = bible_pairs()
    assert len(pairs) == N_BIBLE
    assert [(p.group, p.source, p.target) for p in pairs] == [(k[0], *v) for k, v in verses.items()]
    assert all(p.source and p.target and p.source == p.source.strip() for p in pairs)
    assert all("\t" not in p.source + p.target and "<" not in p.source + p.target for p in pairs)
    flipped = bible_pairs("es", "en")
    assert [(p.source, p.target) for p in flipped] == [(p.target, p.source) for p in pairs]


@pytest.mark.parametrize(
    ("src", "tgt", "message"),
    [
        ("en", "fr", "the built-in Bible pairs are in en and es; got 'fr'"),
        ("de", "es", "the built-in Bible pairs are in en and es; got 'de'"),
        ("es", "es", "both 'es'"),
    ],
)
def test_bible_languages_are_checked(src, tgt, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bible_pairs(src, tgt)


def test_a_damaged_file_is_refused(monkeypatch, fresh_caches):
    monkeypatch.setattr(parallel, "BIBLE_SHA256", "0" * 64)
    with pytest.raises(OSError, match=r"is damaged: sha256 .* expected 0000"):
        bible_pairs()


def test_the_bible_split_keeps_books_whole_and_mixes_the_testaments():
    pairs = bible_pairs()
    splits = split_pairs(pairs, val_groups=BIBLE_SPLIT["val"], test_groups=BIBLE_SPLIT["test"])
    sizes = {name: len(split) for name, split in splits.items()}
    assert sizes == {"train": N_BIBLE - N_VAL - N_TEST, "val": N_VAL, "test": N_TEST}
    books = {name: {p.group for p in split} for name, split in splits.items()}
    assert not (
        books["train"] & books["val"] or books["train"] & books["test"] or books["val"] & books["test"]
    )
    assert books["val"] == set(BIBLE_SPLIT["val"]) and books["test"] == set(BIBLE_SPLIT["test"])
    canon = list(dict.fromkeys(p.group for p in pairs))
    old = set(canon[: canon.index(OLD_TESTAMENT_END) + 1])
    for name in ("val", "test"):
        assert 0.04 < sizes[name] / N_BIBLE < 0.06
        assert books[name] & old and books[name] - old  # both testaments


@pytest.mark.skipif(not HAS_SWORD, reason="needs Debian packages sword-text-web and sword-text-sparv")
def test_the_script_rebuilds_the_shipped_text():
    """Same rows, byte for byte (the compression of these bytes is checked by the slow test below)."""
    script = _load_script()
    assert script.tsv_bytes(script.build_rows()) == lzma.decompress(_shipped())


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SWORD, reason="needs Debian packages sword-text-web and sword-text-sparv")
def test_the_script_rebuilds_the_shipped_file_byte_for_byte(tmp_path):
    """xz at preset 9 takes about 8 s here."""
    out = tmp_path / "bible.tsv.xz"
    assert _load_script().build(out) == N_BIBLE
    assert out.read_bytes() == _shipped()


# ----------------------------------------------------------------------------------------------------------
# FreeDict.


@pytest.mark.skipif(not HAS_FREEDICT, reason="apt-get install dict-freedict-deu-eng")
def test_freedict_pairs_are_german_to_english():
    pairs = freedict_pairs()
    assert len(pairs) > 30_000
    assert len({(p.source, p.target) for p in pairs}) == len(pairs)
    assert all(p.source and p.target and p.group for p in pairs)

    def german(text: str) -> bool:
        return bool(re.search(r"[äöüß]|\b(der|die|das|nicht|ist|und|sich)\b", text))

    assert sum(map(german, (p.source for p in pairs))) > 0.5 * len(pairs)
    assert sum(map(german, (p.target for p in pairs))) < 0.02 * len(pairs)
    assert [(p.source, p.target) for p in freedict_pairs("en", "de")] == [(p.target, p.source) for p in pairs]


def test_freedict_without_the_package_says_how_to_install_it(monkeypatch, tmp_path, fresh_caches):
    monkeypatch.setattr(parallel, "FREEDICT_DIR", tmp_path)
    with pytest.raises(
        MissingDependencyError, match=r"dict-freedict-deu-eng.*apt-get install dict-freedict-deu-eng"
    ):
        freedict_pairs()


def test_freedict_languages_are_checked():
    with pytest.raises(ValueError, match=re.escape("the built-in FreeDict pairs are in de and en; got 'fr'")):
        freedict_pairs("fr", "en")


def _dictd(n: int) -> str:
    """A number in dictd's base64 digits."""
    return binascii.b2a_base64(n.to_bytes(6, "big"), newline=False).decode().lstrip("A") or "A"


def _write_dictionary(folder: Path) -> None:
    """A made-up dictionary in FreeDict's layout: a dictd header entry, then three entries."""
    entries = [
        ("00databaseinfo", 'Header\n      "Kein Beispiel"  - not an example\n'),
        ("Haus", 'Haus /haʊs/ <neut, n, sg>\nhouse <n>\n      "Das Haus ist rot."  - The house is red.\n'),
        (
            "Tür",
            'Tür /tyːɐ/ <fem, n, sg>\ndoor <n>\n      "die Tür öffnen"  - open the door\n'
            '      "Das Haus ist rot."  - The house is red.\n',
        ),
        ("Garten", 'Garten <masc, n, sg>\ngarden <n>\n      "im Garten"  - in the garden\n'),
    ]
    data, index = b"", []
    for headword, text in entries:
        index.append(f"{headword}\t{_dictd(len(data))}\t{_dictd(len(text.encode()))}")
        data += text.encode()
    (folder / "freedict-deu-eng.index").write_text("\n".join(sorted(index)) + "\n", encoding="utf-8")
    (folder / "freedict-deu-eng.dict.dz").write_bytes(gzip.compress(data))


def test_freedict_reader_on_a_small_dictionary(monkeypatch, tmp_path, fresh_caches):
    assert parallel._dictd_number("B0") == 116 and parallel._dictd_number(_dictd(123_456_789)) == 123_456_789
    _write_dictionary(tmp_path)
    monkeypatch.setattr(parallel, "FREEDICT_DIR", tmp_path)
    assert freedict_pairs() == [
        Pair("Das Haus ist rot.", "The house is red.", "Haus"),  # found twice, kept under the first entry
        Pair("die Tür öffnen", "open the door", "Tür"),
        Pair("im Garten", "in the garden", "Garten"),
    ]


def test_a_malformed_freedict_index_names_its_line(monkeypatch, tmp_path, fresh_caches):
    _write_dictionary(tmp_path)
    index = tmp_path / "freedict-deu-eng.index"
    index.write_text(index.read_text(encoding="utf-8") + "kaputt\tA\n", encoding="utf-8")
    monkeypatch.setattr(parallel, "FREEDICT_DIR", tmp_path)
    with pytest.raises(
        ValueError, match=r"freedict-deu-eng.index:5: expected headword<TAB>offset<TAB>length"
    ):
        freedict_pairs()


# ----------------------------------------------------------------------------------------------------------
# A user's TSV file.


def test_read_pairs_tsv_reads_groups_skips_blank_lines_and_a_bom(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_bytes("\ufeffa b\tx y\n\n  \nc\td\tg1\r\n e \t f \n".encode())
    assert read_pairs_tsv(path) == [Pair("a b", "x y", ""), Pair("c", "d", "g1"), Pair("e", "f", "")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"a\tb\nno tab here\n", r":2: no tab"),
        (b"a\tb\n\n\tb\n", r":3: the source side is empty"),
        (b"a\t  \n", r":1: the target side is empty"),
        (b"a\tb\nc\td\te\tf\n", r":2: 4 columns"),
        (b"a\tb\nc\x00\td\n", r":2: NUL byte"),
        (b"a\tb\nc\td\n\xff\xfe\td\n", r":3: not UTF-8"),
        (b"\n  \n\n", r" has no pairs"),
    ],
)
def test_read_pairs_tsv_names_the_file_and_line_of_an_error(tmp_path, content, message):
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(path)) + message):
        read_pairs_tsv(path)


def test_read_pairs_tsv_refuses_what_is_not_a_small_regular_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_pairs_tsv(tmp_path / "missing.tsv")
    with pytest.raises(ValueError, match="is a directory"):
        read_pairs_tsv(tmp_path)
    if Path("/dev/null").exists():
        with pytest.raises(ValueError, match="not a regular file"):
            read_pairs_tsv("/dev/null")
    big = tmp_path / "big.tsv"
    big.write_text("a\tb\n" * 100, encoding="utf-8")
    with pytest.raises(ValueError, match="400 bytes, over the limit of 399") as refused:
        read_pairs_tsv(big, max_bytes=399)
    assert "--task.max_bytes=400" in str(refused.value)  # what a user can do, not a name they cannot pass
    assert "read_pairs_tsv(path, max_bytes=400)" in str(refused.value)
    assert len(read_pairs_tsv(big, max_bytes=400)) == 100


def _lines(n: int) -> list[bytes]:
    rng = random.Random(n)
    words = ["cat", "naïve", "日本語", "😀", "Привет", "x"]
    return [
        f"{' '.join(rng.choices(words, k=rng.randint(1, 9)))}\t{rng.choice(words)}\tg{i % 7}".encode()
        for i in range(n)
    ]


def test_read_pairs_tsv_block_by_block_reads_what_it_reads_whole(tmp_path, monkeypatch):
    path = tmp_path / "pairs.tsv"
    lines = _lines(500)
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines[:250]) + b"\n\n  \n" + b"\n".join(lines[250:]))
    whole = read_pairs_tsv(path)
    assert len(whole) == 500 and whole[0].source == lines[0].decode().split("\t")[0]
    for block in (1, 7, 64, 1000):  # boundaries between lines and inside multi-byte characters' lines
        monkeypatch.setattr(parallel, "BLOCK", block)
        assert read_pairs_tsv(path) == whole


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ({400: b"\xe2\x82"}, r":401: not UTF-8 \(byte 0xe2\)"),  # a character cut short, far into the file
        ({30: b"no tab", 400: b"\xff"}, r":401: not UTF-8"),  # the encoding is checked before any line
        ({30: b"\xff", 400: b"a\x00"}, r":401: NUL byte"),  # and NUL bytes before the encoding
        ({30: b"no tab", 400: b"a\tb\tc\td"}, r":31: no tab"),  # then the lines, the first error first
    ],
)
def test_read_pairs_tsv_errors_past_the_first_block_name_their_line(tmp_path, monkeypatch, broken, message):
    lines = _lines(500)
    for i, line in broken.items():
        lines[i] = line
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(parallel, "BLOCK", 100)
    with pytest.raises(ValueError, match=re.escape(str(path)) + message):
        read_pairs_tsv(path)


# ----------------------------------------------------------------------------------------------------------
# Splits.


def test_split_pairs_refuses_overlapping_or_unknown_groups():
    pairs = [Pair("a", "b", "g1"), Pair("c", "d", "g2")]
    with pytest.raises(ValueError, match=r"in both val and test: \['g1'\]"):
        split_pairs(pairs, val_groups=["g1"], test_groups=["g1"])
    with pytest.raises(ValueError, match=r"not in the pairs: \['g3'\]"):
        split_pairs(pairs, val_groups=["g3"], test_groups=["g2"])


def _assignment(splits: dict[str, list[Pair]]) -> dict[Pair, str]:
    return {pair: name for name, split in splits.items() for pair in split}


def test_random_group_split_is_deterministic_order_free_and_keeps_groups_whole():
    pairs = [Pair(f"s{i}", f"t{i}", f"g{i % 300}") for i in range(3000)]
    splits = random_group_split(pairs, seed=7)
    shuffled = pairs[:]
    random.Random(0).shuffle(shuffled)
    assert _assignment(random_group_split(shuffled, seed=7)) == _assignment(splits)
    assert _assignment(random_group_split(pairs, seed=8)) != _assignment(splits)
    groups = {name: {p.group for p in split} for name, split in splits.items()}
    assert not (
        groups["train"] & groups["val"] or groups["train"] & groups["test"] or groups["val"] & groups["test"]
    )
    for name in ("val", "test"):
        assert 0.02 < len(splits[name]) / len(pairs) < 0.09
    train = set(splits["train"])
    assert [p for p in pairs if p in train] == splits["train"]  # order kept


def test_random_group_split_goes_pair_by_pair_without_groups():
    pairs = [Pair(f"s{i}", f"t{i}", "") for i in range(4000)] + [Pair("s0", "t0", "")]
    splits = random_group_split(pairs, seed=0, val_fraction=0.1, test_fraction=0.2)
    assert 0.08 < len(splits["val"]) / len(pairs) < 0.12 and 0.17 < len(splits["test"]) / len(pairs) < 0.23
    homes = [name for name, split in splits.items() for p in split if p == Pair("s0", "t0", "")]
    assert len(homes) == 2 and homes[0] == homes[1]  # identical pairs land together


def test_random_group_split_gives_small_data_a_val_and_test_pair():
    pairs = [Pair(f"s{i}", f"t{i}", "") for i in range(5)]
    for seed in range(20):
        splits = random_group_split(pairs, seed=seed)
        assert splits["val"] and splits["test"] and len(splits["train"]) >= 2


def _random_group_split_ref(pairs, seed, val_fraction=0.05, test_fraction=0.05):
    """The split as first written: every key ranked by a full sort."""
    keys = [f"group:{p.group}" if p.group else f"pair:{p.source}\t{p.target}" for p in pairs]
    unit = {key: parallel._unit(seed, key) for key in keys}
    ranked = sorted(unit, key=lambda key: (unit[key], key))
    test = {key for key in ranked if unit[key] < test_fraction}
    if not test and test_fraction > 0 and len(ranked) >= 3:
        test = {ranked[0]}
    val = {key for key in ranked if key not in test and unit[key] < test_fraction + val_fraction}
    if not val and val_fraction > 0 and len(ranked) >= 3:
        val = {next(key for key in ranked if key not in test)}
    splits = {"train": [], "val": [], "test": []}
    for pair, key in zip(pairs, keys, strict=True):
        splits["test" if key in test else "val" if key in val else "train"].append(pair)
    return splits


@pytest.mark.parametrize(
    ("n", "val", "test"), [(3, 0.05, 0.05), (40, 1e-9, 1e-9), (2000, 0.05, 0.1), (500, 0.0, 0.3)]
)
def test_random_group_split_is_the_sorted_split(n, val, test):
    pairs = [Pair(f"s{i % (n // 2 + 1)}", f"t{i}", f"g{i % 9}" if i % 3 == 0 else "") for i in range(n)]
    for seed in (0, 1, 5):
        assert random_group_split(pairs, seed, val, test) == _random_group_split_ref(pairs, seed, val, test)


@pytest.mark.parametrize(("val", "test"), [(-0.1, 0.1), (0.5, 0.5), (0.1, -0.01)])
def test_random_group_split_checks_its_fractions(val, test):
    with pytest.raises(ValueError, match="sum below 1"):
        random_group_split([Pair("a", "b", "")], seed=0, val_fraction=val, test_fraction=test)


def test_a_pair_is_frozen():
    pair = Pair("a", "b", "g")
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.source = "c"
