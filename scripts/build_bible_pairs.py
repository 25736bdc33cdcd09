r"""Build ``src/seqlab/data/bible-web-rv1909.tsv.xz``: the Bible verse by verse in English and Spanish.

Sources, public domain, read from the Debian packages' files with ``struct`` and ``zlib`` (no SWORD library):
``sword-text-web``, the World English Bible (module ``engWEB2015eb``, 2020 text), and ``sword-text-sparv``,
the Reina-Valera 1909 (``spaRV1909eb``). Run ``python scripts/build_bible_pairs.py [OUT]``. A zText
module keeps each testament in three files::

    ot.bzs, nt.bzs  12 bytes a block: offset, compressed size, size          (uint32 little-endian each)
    ot.bzv, nt.bzv  10 bytes an entry: block, start in the block (uint32), size (uint16)
    ot.bzz, nt.bzz  the zlib-compressed blocks; an entry is UTF-8 OSIS XML

Entries follow the versification as SWORD lays it out: 0 is the testament's header, 1 the module's, then
each book has an intro entry and each chapter an intro entry followed by its verses (Genesis 1:1 is OT entry
4). The Reina-Valera uses KJV versification (``BOOK_TABLE``: 66 books, 31,102 verses); the WEB declares
NRSVA, which differs within the 66 books only by 3 John 1:15 and Revelation 12:18 (both empty: this WEB keeps
KJV's numbers) and puts the deuterocanon after Malachi, past every KJV entry. Every chapter intro carries
``<chapter osisID="Gen.1">``; all 1,189 are checked in both modules, so a wrong count cannot pass.
Text: notes and section titles go with their content, but the canonical Psalm superscriptions stay (the
Reina-Valera prints them in verse 1); tags go, entities are unescaped, whitespace collapsed (more in
``plain_text``, ``english_text`` and ``spanish_text``).

Alignment: the same verse number does not always hold the same words. The Reina-Valera numbers some
chapters as the Hebrew Bible does (Jonah 2:1 is KJV's 1:17) and the module squeezes them into KJV's slots,
shifting whole chapters by a verse or more (Numbers 13 and 30, 1 Samuel 24, Job 39-40, Hosea 12, Jonah 2);
elsewhere one joins two verses and splits another (1 Chronicles 21, 2 Chronicles 33, 1 Kings 22).
``align_book`` realigns such stretches by the verses' lengths; a row joining several verses carries the
number of its first (Job 39:27 holds 39:27-40:5). Output, canonical order, UTF-8, no header, xz (lzma)::

    book<TAB>chapter<TAB>verse<TAB>english<TAB>spanish      e.g. "Genesis	1	1	In the beginning, ..."
"""

from __future__ import annotations

import html
import lzma
import math
import re
import struct
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

SWORD = Path("/usr/share/sword")
ENGLISH = "engWEB2015eb"  # Debian package sword-text-web
SPANISH = "spaRV1909eb"  # Debian package sword-text-sparv
OUT = Path(__file__).resolve().parent.parent / "src" / "seqlab" / "data" / "bible-web-rv1909.tsv.xz"
OT_BOOKS = 39
NRSVA_CHAPTERS = {("3John", 1): 15, ("Rev", 12): 18}  # where NRSVA's chapters differ from KJV's
SPOT_CHECKS = (  # (book, chapter, verse, words in the English, words in the Spanish)
    ("Genesis", 1, 1, "In the beginning, God created", "En el principio crió Dios"),
    ("John", 3, 16, "For God so loved the world", "de tal manera amó Dios al mundo"),
    ("Revelation", 22, 21, "The grace of the Lord Jesus Christ", "La gracia de nuestro Señor Jesucristo"),
)

BOOK_TABLE = """
Gen    Genesis          31 25 24 26 32 22 24 22 29 32 32 20 18 24 21 16 27 33 38 18 34 24 20 67 34 35 46 22 35 43 55 32 20 31 29 43 36 30 23 23 57 38 34 34 28 34 31 22 33 26
Exod   Exodus           22 25 22 31 23 30 25 32 35 29 10 51 22 31 27 36 16 27 25 26 36 31 33 18 40 37 21 43 46 38 18 35 23 35 35 38 29 31 43 38
Lev    Leviticus        17 16 17 35 19 30 38 36 24 20 47 8 59 57 33 34 16 30 37 27 24 33 44 23 55 46 34
Num    Numbers          54 34 51 49 31 27 89 26 23 36 35 16 33 45 41 50 13 32 22 29 35 41 30 25 18 65 23 31 40 16 54 42 56 29 34 13
Deut   Deuteronomy      46 37 29 49 33 25 26 20 29 22 32 32 18 29 23 22 20 22 21 20 23 30 25 22 19 19 26 68 29 20 30 52 29 12
Josh   Joshua           18 24 17 24 15 27 26 35 27 43 23 24 33 15 63 10 18 28 51 9 45 34 16 33
Judg   Judges           36 23 31 24 31 40 25 35 57 18 40 15 25 20 20 31 13 31 30 48 25
Ruth   Ruth             22 23 18 22
1Sam   1 Samuel         28 36 21 22 12 21 17 22 27 27 15 25 23 52 35 23 58 30 24 42 15 23 29 22 44 25 12 25 11 31 13
2Sam   2 Samuel         27 32 39 12 25 23 29 18 13 19 27 31 39 33 37 23 29 33 43 26 22 51 39 25
1Kgs   1 Kings          53 46 28 34 18 38 51 66 28 29 43 33 34 31 34 34 24 46 21 43 29 53
2Kgs   2 Kings          18 25 27 44 27 33 20 29 37 36 21 21 25 29 38 20 41 37 37 21 26 20 37 20 30
1Chr   1 Chronicles     54 55 24 43 26 81 40 40 44 14 47 40 14 17 29 43 27 17 19 8 30 19 32 31 31 32 34 21 30
2Chr   2 Chronicles     17 18 17 22 14 42 22 18 31 19 23 16 22 15 19 14 19 34 11 37 20 12 21 27 28 23 9 27 36 27 21 33 25 33 27 23
Ezra   Ezra             11 70 13 24 17 22 28 36 15 44
Neh    Nehemiah         11 20 32 23 19 19 73 18 38 39 36 47 31
Esth   Esther           22 23 15 17 14 14 10 17 32 3
Job    Job              22 13 26 21 27 30 21 22 35 22 20 25 28 22 35 22 16 21 29 29 34 30 17 25 6 14 23 28 25 31 40 22 33 37 16 33 24 41 30 24 34 17
Ps     Psalms           6 12 8 8 12 10 17 9 20 18 7 8 6 7 5 11 15 50 14 9 13 31 6 10 22 12 14 9 11 12 24 11 22 22 28 12 40 22 13 17 13 11 5 26 17 11 9 14 20 23 19 9 6 7 23 13 11 11 17 12 8 12 11 10 13 20 7 35 36 5 24 20 28 23 10 12 20 72 13 19 16 8 18 12 13 17 7 18 52 17 16 15 5 23 11 13 12 9 9 5 8 28 22 35 45 48 43 13 31 7 10 10 9 8 18 19 2 29 176 7 8 9 4 8 5 6 5 6 8 8 3 18 3 3 21 26 9 8 24 13 10 7 12 15 21 10 20 14 9 6
Prov   Proverbs         33 22 35 27 23 35 27 36 18 32 31 28 25 35 33 33 28 24 29 30 31 29 35 34 28 28 27 28 27 33 31
Eccl   Ecclesiastes     18 26 22 16 20 12 29 17 18 20 10 14
Song   Song of Solomon  17 17 11 16 16 13 13 14
Isa    Isaiah           31 22 26 6 30 13 25 22 21 34 16 6 22 32 9 14 14 7 25 6 17 25 18 23 12 21 13 29 24 33 9 20 24 17 10 22 38 22 8 31 29 25 28 28 25 13 15 22 26 11 23 15 12 17 13 12 21 14 21 22 11 12 19 12 25 24
Jer    Jeremiah         19 37 25 31 31 30 34 22 26 25 23 17 27 22 21 21 27 23 15 18 14 30 40 10 38 24 22 17 32 24 40 44 26 22 19 32 21 28 18 16 18 22 13 30 5 28 7 47 39 46 64 34
Lam    Lamentations     22 22 66 22 22
Ezek   Ezekiel          28 10 27 17 17 14 27 18 11 22 25 28 23 23 8 63 24 32 14 49 32 31 49 27 17 21 36 26 21 26 18 32 33 31 15 38 28 23 29 49 26 20 27 31 25 24 23 35
Dan    Daniel           21 49 30 37 31 28 28 27 27 21 45 13
Hos    Hosea            11 23 5 19 15 11 16 14 17 15 12 14 16 9
Joel   Joel             20 32 21
Amos   Amos             15 16 15 13 27 14 17 14 15
Obad   Obadiah          21
Jonah  Jonah            17 10 10 11
Mic    Micah            16 13 12 13 15 16 20
Nah    Nahum            15 13 19
Hab    Habakkuk         17 20 19
Zeph   Zephaniah        18 15 20
Hag    Haggai           15 23
Zech   Zechariah        21 13 10 14 11 15 14 23 17 12 17 14 9 21
Mal    Malachi          14 17 18 6
Matt   Matthew          25 23 17 25 48 34 29 34 38 42 30 50 58 36 39 28 27 35 30 34 46 46 39 51 46 75 66 20
Mark   Mark             45 28 35 41 43 56 37 38 50 52 33 44 37 72 47 20
Luke   Luke             80 52 38 44 39 49 50 56 62 42 54 59 35 35 32 31 37 43 48 47 38 71 56 53
John   John             51 25 36 54 47 71 53 59 41 42 57 50 38 31 27 33 26 40 42 31 25
Acts   Acts             26 47 26 37 42 15 60 40 43 48 30 25 52 28 41 40 34 28 41 38 40 30 35 27 27 32 44 31
Rom    Romans           32 29 31 25 21 23 25 39 33 21 36 21 14 23 33 27
1Cor   1 Corinthians    31 16 23 21 13 20 40 13 27 33 34 31 13 40 58 24
2Cor   2 Corinthians    24 17 18 18 21 18 16 24 15 18 33 21 14
Gal    Galatians        24 21 29 31 26 18
Eph    Ephesians        23 22 21 32 33 24
Phil   Philippians      30 30 21 23
Col    Colossians       29 23 25 18
1Thess 1 Thessalonians  10 20 13 18 28
2Thess 2 Thessalonians  12 17 18
1Tim   1 Timothy        20 15 16 16 25 21
2Tim   2 Timothy        18 26 17 22
Titus  Titus            16 15 15
Phlm   Philemon         25
Heb    Hebrews          14 18 19 16 14 20 28 13 28 39 40 29 25
Jas    James            27 26 18 17 20
1Pet   1 Peter          25 25 22 19 14
2Pet   2 Peter          21 22 18
1John  1 John           10 29 24 21 21
2John  2 John           13
3John  3 John           14
Jude   Jude             25
Rev    Revelation       20 29 22 11 14 17 17 13 21 11 19 17 18 20 8 21 18 24 21 15 27 21
"""
"""The 66 books in KJV versification, one a line: OSIS id, English name, the verses of each chapter."""


def books() -> list[tuple[str, str, list[int]]]:
    """(OSIS id, English name, verses per chapter) of the 66 books, from ``BOOK_TABLE``."""
    lines = BOOK_TABLE.strip("\n").splitlines()
    return [(line[:6].strip(), line[7:23].strip(), [int(n) for n in line[24:].split()]) for line in lines]


def module_conf(module: str, key: str, default: str | None = None) -> str:
    """One setting of a module's ``mods.d/<module>.conf`` file."""
    path = SWORD / "mods.d" / f"{module}.conf"
    if not path.is_file():
        raise FileNotFoundError(f"no SWORD module {module}: {path} is missing")
    found = re.search(rf"^{key}=(.*?)\s*$", path.read_text(encoding="utf-8"), flags=re.M)
    if found is None and default is None:
        raise ValueError(f"{path} has no {key}")
    return found.group(1) if found else default


def sword_entries(module: str, testament: str) -> list[bytes]:
    """Every entry of one testament ("ot" or "nt") of a zText module, as raw UTF-8 bytes, by index."""
    if module_conf(module, "ModDrv") != "zText" or module_conf(module, "Encoding", "UTF-8") != "UTF-8":
        raise ValueError(f"{module} is not a UTF-8 zText module")
    folder = SWORD / module_conf(module, "DataPath")
    bzs, bzv, bzz = ((folder / f"{testament}.{ext}").read_bytes() for ext in ("bzs", "bzv", "bzz"))
    blocks, entries = {}, []  # block number -> its bytes; entry index -> its bytes
    for block, start, size in struct.iter_unpack("<IIH", bzv):
        if size and block not in blocks:
            offset, csize, usize = struct.unpack_from("<III", bzs, 12 * block)
            blocks[block] = zlib.decompress(bzz[offset : offset + csize])
            if len(blocks[block]) != usize:
                raise ValueError(f"{module} {testament}: block {block} is not {usize} bytes long")
        entries.append(blocks[block][start : start + size] if size else b"")
    return entries


def layout(scheme: str) -> Iterator[tuple[str, int, str, int, int]]:
    """(testament, entry index, OSIS book, chapter, verse) of every chapter intro (verse 0) and verse."""
    if scheme not in ("KJV", "NRSVA"):
        raise ValueError(f"versification {scheme} is not supported; KJV and NRSVA are")
    table = books()
    for testament, part in (("ot", table[:OT_BOOKS]), ("nt", table[OT_BOOKS:])):
        index = 2  # after the testament's and the module's headers
        for osis, _, lengths in part:
            index += 1  # the book's intro
            for chapter, n_verses in enumerate(lengths, 1):
                if scheme == "NRSVA":
                    n_verses = NRSVA_CHAPTERS.get((osis, chapter), n_verses)
                for verse in range(n_verses + 1):
                    yield testament, index + verse, osis, chapter, verse
                index += 1 + n_verses


def read_bible(module: str) -> dict[tuple[str, int, int], str]:
    """{(OSIS book, chapter, verse): raw OSIS text} of the 66 books, the numbering checked chapter by chapter."""
    entries = {t: sword_entries(module, t) for t in ("ot", "nt")}
    kjv = {(osis, c): n for osis, _, lengths in books() for c, n in enumerate(lengths, 1)}
    verses = {}
    for testament, index, osis, chapter, verse in layout(module_conf(module, "Versification", "KJV")):
        text = entries[testament][index].decode("utf-8")
        if verse == 0:
            found = re.search(r'<chapter\b[^>]*\bosisID="([^"]+)"', text)
            if not found or found.group(1) != f"{osis}.{chapter}":
                raise ValueError(f"{module}: {testament} entry {index} should open {osis}.{chapter}")
        elif verse <= kjv[osis, chapter]:
            verses[osis, chapter, verse] = text
        elif text.strip():  # an NRSVA-only verse: KJV has no place for it
            raise ValueError(f"{module}: {osis} {chapter}:{verse} is not in KJV but has text")
    return verses


_NOTE = re.compile(r"<note\b[^>]*/>|<note\b.*?</note>", flags=re.S)
_TITLE = re.compile(r"<title\b([^>]*)>(.*?)</title>", flags=re.S)
_BOOK_END = re.compile(r'<div\b(?=[^>]*\beID=)(?=[^>]*\btype="book")[^>]*/>')
_GAP = "\ue000"  # where a note was, until we know whether a space belongs there
_CAPS = re.compile(r"\b[A-ZÁÉÍÓÚÑÜ]{2,}\b")
_SUBSCRIPTION = re.compile(r"(?<=Amén\.) [^.]*\b(?:[Ee]scrita|[Ee]nviada)\b.*$")
Verses = dict[tuple[str, int, int], str]


def plain_text(raw: Verses) -> Verses:
    """Verses as plain text, Psalm 119's stanza headings ("ALEPH", "BETH", ...) dropped like the titles.

    The WEB's text often lacks the space after a footnote ("God<note/>created"): where a note sat between
    a character and a word, a space takes its place. The WEB's glossary follows Revelation 22:21 in its entry.
    """
    verses = {}
    for key, osis in raw.items():
        text = _NOTE.sub(_GAP, _BOOK_END.split(osis, maxsplit=1)[0])
        text = _TITLE.sub(lambda m: m.group(2) + " " if 'canonical="true"' in m.group(1) else "", text)
        text = html.unescape(re.sub(r"<[^>]*>", "", text))
        text = re.sub(rf"(?<=\S){_GAP}+(?=[\w“‘(\[¿¡])", " ", text).replace(_GAP, "")
        verses[key] = " ".join(text.split())
    for verse in range(1, 177, 8):
        heading = re.match(r"[A-Z]+(?: AND [A-Z]+)?\.? ", verses["Ps", 119, verse][:20].upper())
        if not heading:
            raise ValueError(f"Psalm 119:{verse} has no stanza heading: {verses['Ps', 119, verse][:40]!r}")
        verses["Ps", 119, verse] = verses["Ps", 119, verse][heading.end() :]
    return verses


def english_text(raw: Verses) -> Verses:
    """Plain text of the WEB's verses; the doxology it prints after Romans 14:23 moves to Romans 16:25.

    The WEB numbers that doxology Romans 14:24-26 and leaves 16:25-27 empty; KJV versification has no
    14:24, so the module appends it to 14:23. Moved to the empty 16:25, it aligns with the Spanish 16:25-27.
    """
    verses = plain_text(raw)
    text, start = verses["Rom", 14, 23], verses["Rom", 14, 23].find("Now to him who is able")
    if start < 0 or verses["Rom", 16, 25]:
        raise ValueError("the WEB's Romans 14:23 and 16:25 are not as expected")
    verses["Rom", 14, 23], verses["Rom", 16, 25] = text[:start].strip(), text[start:]
    return verses


def lower_chapter_capitals(first_verse: str, names: set[str]) -> str:
    """'EN el principio' -> 'En el principio'; 'Y FUERON acabados' -> 'Y fueron acabados'.

    The Reina-Valera sets a chapter's first word in capitals, and the next one too after a short word ("LA
    SEGUNDA suerte"). A word keeps a capital initial where it opens a sentence or is a name, one the text
    writes capitalized more often than not after a lower-case word ("Y JEHOVÁ dijo" -> "Y Jehová dijo").
    """
    found = _CAPS.search(first_verse)
    if not found:
        return first_verse
    start, end = found.span()
    if end - start <= 3 and (second := _CAPS.match(first_verse, end + 1)) and first_verse[end] == " ":
        end = second.end()
    before = first_verse[:start].rstrip(" ¡¿“(")
    opens = before == "" or before.endswith((".", "!", "?", ":"))
    words = [
        w[0] + w[1:].lower() if (opens and k == 0) or w.title() in names else w.lower()
        for k, w in enumerate(first_verse[start:end].split(" "))
    ]
    return first_verse[:start] + " ".join(words) + first_verse[end:]


def spanish_text(raw: Verses) -> Verses:
    """Plain text of the Reina-Valera's verses: chapter capitals undone, the epistles' subscriptions dropped.

    Like the KJV, the Reina-Valera ends 14 epistles with a note on where they were written ("Amén. Fué
    escrita á los Hebreos desde Italia con Timoteo."); the WEB has none.
    """
    verses = plain_text(raw)
    mid = Counter(w for t in verses.values() for w in re.findall(r"(?<=[a-záéíóúñü] )[^\W\d_]+", t))
    names = {w for w, n in mid.items() if w[0].isupper() and n > mid[w.lower()]}
    last = {}
    for key, text in verses.items():
        verses[key] = lower_chapter_capitals(text, names) if key[2] == 1 else text
        last[key[0]] = key if text else last.get(key[0])
    for key in last.values():
        verses[key] = _SUBSCRIPTION.sub("", verses[key])
    return verses


# Alignment. A verse's log length ratio, log(len(spanish) / len(english)), has median -0.04 and spread
# 0.14 over these texts; a pair costs half its squared z-score, capped so that one odd verse cannot pull
# the path away. Leaving the numbering costs _MERGE for each group of several verses, so the path leaves it
# only where many verses in a row disagree with it. A verse one side omits (Acts 8:37 in the WEB) costs _OMIT.
_LOG_RATIO, _SPREAD, _CAP, _SKIP, _OMIT, _MERGE = -0.04, 0.14, 16.0, 15.0, 1.0, 12.0
_BAND, _MAX_MERGE = 8, 10  # how far the path may stray from the numbering; most verses in one group
_FLAG, _REACH = 4.0, 20  # a verse this costly (or half empty) is realigned with this many around it


def pair_cost(en_chars: int, es_chars: int) -> float:
    """Cost of pairing texts of these lengths."""
    z = (math.log((es_chars + 10) / (en_chars + 10)) - _LOG_RATIO) / _SPREAD
    return min(z * z / 2, _CAP)


def _steps(i: int, j: int, la: list[int], lb: list[int]) -> Iterator[tuple[int, int, float]]:
    """(English verses, Spanish verses, cost) of each last step a path to (i, j) may take."""
    a, b = (la[i - 1] if i else -1), (lb[j - 1] if j else -1)
    if a >= 0:
        yield 1, 0, _SKIP if a else 0.0
    if b >= 0:
        yield 0, 1, _SKIP if b else 0.0
    if min(a, b) == 0 and max(a, b) > 0:
        yield 1, 1, _OMIT
    if min(a, b) <= 0:
        return
    yield 1, 1, pair_cost(a, b)
    if i >= 2 and j >= 2 and la[i - 2] and lb[j - 2]:
        yield 2, 2, _MERGE + pair_cost(a + la[i - 2] + 1, b + lb[j - 2] + 1)
    for k in range(2, min(_MAX_MERGE, i) + 1):  # k English verses, one Spanish verse
        if not la[i - k] or (a := a + la[i - k] + 1) > 2.5 * b + 50:
            break
        yield k, 1, _MERGE + k - 2 + pair_cost(a, b)
    for k in range(2, min(_MAX_MERGE, j) + 1):  # one English verse, k Spanish verses
        if not lb[j - k] or (b := b + lb[j - k] + 1) > 2.5 * la[i - 1] + 50:
            break
        yield 1, k, _MERGE + k - 2 + pair_cost(la[i - 1], b)


def align(english: list[str], spanish: list[str]) -> list[tuple[range, range]]:
    """Cheapest monotone alignment of two equally long verse lists (a Gale & Church style dynamic program).

    Returns (English indices, Spanish indices) of each group of verses that pair up, both sides non-empty.
    """
    n, la, lb = len(english), [len(t) for t in english], [len(t) for t in spanish]
    cost = [[math.inf] * (2 * _BAND + 1) for _ in range(n + 1)]  # cost[i][j - i + _BAND]
    back = [[(0, 0)] * (2 * _BAND + 1) for _ in range(n + 1)]
    cost[0][_BAND] = 0.0
    for i in range(n + 1):
        for j in range(max(0, i - _BAND), min(n, i + _BAND) + 1):
            d = j - i + _BAND
            for di, dj, step in _steps(i, j, la, lb) if i or j else ():
                if 0 <= d - dj + di <= 2 * _BAND and cost[i - di][d - dj + di] + step < cost[i][d]:
                    cost[i][d], back[i][d] = cost[i - di][d - dj + di] + step, (di, dj)
    groups, i, j = [], n, n
    while i or j:
        di, dj = back[i][j - i + _BAND]
        if di and dj and la[i - 1] and lb[j - 1]:
            groups.append((range(i - di, i), range(j - dj, j)))
        i, j = i - di, j - dj
    return groups[::-1]


def align_book(english: list[str], spanish: list[str]) -> list[tuple[range, range]]:
    """Verse i pairs with verse i, except in windows around verses that fit badly, which ``align`` redoes.

    On this Bible that gives what ``align`` gives on whole books, five times faster.
    """
    n, windows = len(english), []
    for i in range(n):
        if bool(english[i]) != bool(spanish[i]) or pair_cost(len(english[i]), len(spanish[i])) > _FLAG:
            lo, hi = max(0, i - _REACH), min(n, i + _REACH + 1)
            if windows and lo <= windows[-1][1]:
                windows[-1][1] = hi
            else:
                windows.append([lo, hi])
    groups, done = [], 0
    for lo, hi in [*windows, [n, n]]:
        groups += [(range(i, i + 1), range(i, i + 1)) for i in range(done, lo) if english[i] and spanish[i]]
        for a, b in align(english[lo:hi], spanish[lo:hi]):
            groups.append((range(lo + a.start, lo + a.stop), range(lo + b.start, lo + b.stop)))
        done = hi
    return groups


def build_rows() -> list[tuple[str, int, int, str, str]]:
    """(book, chapter, verse, english, spanish) in canonical order; a row of several verses has the first's number."""
    english, spanish = english_text(read_bible(ENGLISH)), spanish_text(read_bible(SPANISH))
    rows = []
    for osis, name, _ in books():
        keys = [key for key in english if key[0] == osis]
        for en, es in align_book([english[k] for k in keys], [spanish[k] for k in keys]):
            _, chapter, verse = keys[en[0]]
            texts = [" ".join(t[keys[k]] for k in span) for t, span in ((english, en), (spanish, es))]
            rows.append((name, chapter, verse, *texts))
    for book, chapter, verse, en_words, es_words in SPOT_CHECKS:
        row = next((r for r in rows if r[:3] == (book, chapter, verse)), None)
        if row is None or en_words not in row[3] or es_words not in row[4]:
            raise ValueError(f"{book} {chapter}:{verse} came out wrong: {row}")
    return rows


def tsv_bytes(rows: list[tuple[str, int, int, str, str]]) -> bytes:
    """The rows as tab-separated UTF-8 lines, the file's content before compression."""
    lines = ["\t".join(map(str, row)) + "\n" for row in rows]
    if any(line.count("\t") != 4 or line.count("\n") != 1 for line in lines):
        raise ValueError("a tab or a line break inside a verse")
    return "".join(lines).encode("utf-8")


def build(path: Path = OUT) -> int:
    """Write the rows to ``path``, xz-compressed; returns the number of rows."""
    rows = build_rows()
    path.write_bytes(lzma.compress(tsv_bytes(rows), format=lzma.FORMAT_XZ, preset=9))  # deterministic
    return len(rows)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    print(f"{build(target)} verse pairs -> {target} ({target.stat().st_size:,} bytes)")
