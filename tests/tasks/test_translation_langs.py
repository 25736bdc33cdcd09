"""Which translation settings apply to which source: ``task.src_lang`` and ``task.tgt_lang`` choose the
direction of a built-in corpus and are refused for a pairs file (whose columns fix it); ``task.max_bytes``
limits a pairs file and is refused for a built-in corpus. Nothing is silently ignored, and a saved
description builds again."""

from __future__ import annotations

import random

import pytest

from seqlab.cli import main
from seqlab.tasks import create_task
from seqlab.tasks import translation_sources as sources

EN = ["the", "a", "cat", "dog", "sees", "eats", "big", "red", "house", "tree"]
ES = ["el", "un", "gato", "perro", "ve", "come", "grande", "rojo", "casa", "árbol"]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    rng, lines = random.Random(0), set()
    while len(lines) < 200:
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(2, 6))]
        lines.add(" ".join(EN[i] for i in idx) + "\t" + " ".join(ES[i] for i in idx))
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    path.write_text("\n".join(sorted(lines)) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "langs,says",
    [
        ({"src_lang": "es"}, "task.src_lang='es' does not apply to a pairs file"),
        ({"tgt_lang": "en"}, "task.tgt_lang='en' does not apply to a pairs file"),
        ({"src_lang": "es", "tgt_lang": "en"}, "task.src_lang='es' and task.tgt_lang='en' do not apply"),
        ({"src_lang": "src", "tgt_lang": "en"}, "task.tgt_lang='en' does not apply"),
    ],
)
def test_a_pairs_file_refuses_languages_it_cannot_honour(pairs_file, langs, says):
    with pytest.raises(ValueError, match="swap the file's columns") as caught:
        create_task("translation", source=str(pairs_file), vocab_size=300, **langs)
    assert says in str(caught.value) and "bible (en, es)" in str(caught.value)


def test_a_pairs_file_takes_back_the_labels_it_reports(pairs_file):
    """A saved description (src_lang 'src', tgt_lang 'tgt') given again as settings builds the same task."""
    task = create_task("translation", source=str(pairs_file), vocab_size=300)
    described = task.describe()
    assert (described["src_lang"], described["tgt_lang"]) == ("src", "tgt")
    settings = {
        k: described[k] for k in ("source", "src_lang", "tgt_lang", "vocab_size", "max_bytes", "seed")
    }
    again = create_task("translation", **settings)
    assert again.tokenizer.to_json() == task.tokenizer.to_json()
    assert again.pairs("test") == task.pairs("test") and again.describe() == described


def test_train_refuses_src_lang_for_a_pairs_file_before_any_step(pairs_file, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model.name=test-seq2seq", "--task.name=translation", f"--task.source={pairs_file}"]
    argv += ["--task.vocab_size=300", "--task.src_lang=es", "--train.steps=2", "--out", str(out)]
    assert main(argv) == 2
    assert "task.src_lang='es' does not apply to a pairs file" in capsys.readouterr().err
    assert not (out / "checkpoints").exists()


@pytest.mark.parametrize("source", ["bible", "freedict"])
def test_max_bytes_is_refused_for_a_built_in_corpus(source):
    with pytest.raises(
        ValueError, match=rf"task.max_bytes=1,000 does not apply to the built-in corpus '{source}'"
    ):
        create_task("translation", source=source, max_bytes=1000)


@pytest.mark.parametrize(
    "source,given,direction",
    [
        ("bible", {}, ("en", "es")),
        ("bible", {"src_lang": "es"}, ("es", "en")),
        ("bible", {"tgt_lang": "en"}, ("es", "en")),
        ("bible", {"tgt_lang": "es"}, ("en", "es")),
        ("freedict", {"src_lang": "en"}, ("en", "de")),
        ("freedict", {"tgt_lang": "de"}, ("en", "de")),
    ],
)
def test_one_language_of_a_built_in_corpus_names_the_other(monkeypatch, source, given, direction):
    """Naming one side of a two-language corpus chooses the direction (it was refused as 'both es')."""
    asked = []

    def reader(src_lang, tgt_lang):
        asked.append((src_lang, tgt_lang))
        raise LookupError("read no further")

    monkeypatch.setattr(sources, f"{source}_pairs", reader)
    with pytest.raises(LookupError, match="read no further"):
        create_task("translation", source=source, **given)
    assert asked == [direction]


@pytest.mark.parametrize(
    "given,says",
    [
        ({"src_lang": "fr"}, "task.src_lang='fr': the built-in corpus 'bible' is in 'en' and 'es'"),
        ({"tgt_lang": "de"}, "task.tgt_lang='de': the built-in corpus 'bible' is in 'en' and 'es'"),
        ({"src_lang": "en", "tgt_lang": "en"}, "task.src_lang and task.tgt_lang are both 'en'"),
    ],
)
def test_a_built_in_corpus_names_the_setting_it_refuses(given, says):
    with pytest.raises(ValueError, match=says):
        create_task("translation", source="bible", **given)
