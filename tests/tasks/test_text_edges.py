"""User text at the edges: encodings a file names by its byte-order mark, codecs that are not text, lone
surrogates, a text edited within its old characters, a bare file name, a checkpoint's tokenizer.json gone."""

import json

import pytest
import torch

from seqlab.cli import main
from seqlab.tasks.corpus import read_text_file
from seqlab.training.checkpoint import resolve_checkpoint

TRAIN = ["--train.steps=2", "--train.eval_every=0", "--train.progress=false", "--train.warmup_steps=0"]


def test_encodings_that_cannot_give_text_are_named(tmp_path):
    utf16 = tmp_path / "notepad.txt"
    utf16.write_bytes("héllo wörld\n".encode("utf-16"))  # with its byte-order mark, as Notepad's "Unicode"
    with pytest.raises(ValueError, match=r"--task\.encoding=utf-16 \(its byte-order mark says so\)"):
        read_text_file(utf16)
    assert read_text_file(utf16, "utf-16") == "héllo wörld\n"
    plain = tmp_path / "plain.txt"
    plain.write_text("abc def\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown text encoding 'rot13'"):  # a codec, not a text encoding
        read_text_file(plain, "rot13")
    escaped = tmp_path / "escaped.txt"
    escaped.write_bytes(b"ab \\ud800 cd\n")
    with pytest.raises(
        ValueError, match=r"lone surrogate '\\ud800' at character 3"
    ):  # saved nothing at the end
        read_text_file(escaped, "unicode_escape")


def _train(tmp_path, source: str, out: str) -> None:
    argv = ["train", "--model.name=test-lm-gru", "--task.name=text", f"--task.source={source}"]
    assert main([*argv, "--task.seq_len=8", "--task.batch_size=4", *TRAIN, "--out", out]) == 0


def test_eval_refuses_a_text_edited_within_its_characters_and_reads_a_bare_name_from_anywhere(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mycorpus").write_text("the cat sat on the mat. " * 40, encoding="utf-8")
    _train(tmp_path, "mycorpus", "run")  # no folder, no suffix: still a file, saved absolute
    saved = json.loads((resolve_checkpoint(tmp_path / "run") / "config.json").read_text())
    assert saved["run"]["task"]["source"] == str(tmp_path / "mycorpus")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["eval", "--checkpoint", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    (tmp_path / "mycorpus").write_text("the cat sat on the mat. " * 120, encoding="utf-8")  # same characters
    assert main(["eval", "--checkpoint", str(tmp_path / "run")]) == 2
    assert "changed since the checkpoint was trained on it: train_chars is now" in capsys.readouterr().err


def test_a_tokenizer_json_gone_from_a_checkpoint_is_named_missing(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("abcd efgh. " * 60, encoding="utf-8")
    _train(tmp_path, str(tmp_path / "t.txt"), str(tmp_path / "run"))
    (resolve_checkpoint(tmp_path / "run") / "tokenizer.json").unlink()
    assert main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "ab"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json is missing" in err and "not trained on text" not in err


def test_the_default_prompt_says_it_is_a_newline_when_the_text_has_none(tmp_path, capsys):
    (tmp_path / "one-line.txt").write_text("abcd efgh. " * 60, encoding="utf-8")  # no newline anywhere
    _train(tmp_path, str(tmp_path / "one-line.txt"), str(tmp_path / "run"))
    assert main(["generate", "--checkpoint", str(tmp_path / "run")]) == 2
    assert "(the default prompt, a newline: this text has none; give --prompt)" in capsys.readouterr().err


def test_decoding_an_id_outside_the_vocabulary_is_refused():
    import numpy as np

    from seqlab.tasks.text import CharTokenizer
    from seqlab.tasks.tokenizers import BPETokenizer

    chars = CharTokenizer("abc")
    assert chars.decode(np.array([2, 0])) == "ca"  # numpy's integers are integers
    with pytest.raises(ValueError, match=r"CharTokenizer\.decode: ids must be integers in \[0, 3\), got -1"):
        chars.decode([-1])  # read the vocabulary from its end: 'c'
    bpe = BPETokenizer.train("the cat sat on the mat " * 20, vocab_size=300)
    assert bpe.decode(bpe.encode("the cat")) == "the cat"
    with pytest.raises(
        ValueError, match=r"BPETokenizer\.decode: ids must be integers in \[0, \d+\), got 99999"
    ):
        bpe.decode([99999])  # decoded to nothing


def test_char_encode_is_the_per_character_lookup_for_any_code_point():
    """The vectorized encode (a code-point table) gives each character's index, astral and lone-surrogate
    characters included, and names the characters outside the vocabulary."""
    from seqlab.tasks.text import CharTokenizer

    tok = CharTokenizer("a\ud800é日\U0001f600\n")
    text = "日a\U0001f600\ud800é\na"
    assert (
        tok.encode(text).tolist() == [tok.index[ch] for ch in text] and tok.encode(text).dtype == torch.long
    )
    assert tok.encode("").shape == (0,)
    for bad, named in (("ab", "'b'"), ("a\U0001f601", "'\U0001f601'"), ("a\ud801", "'\\\\ud801'")):
        with pytest.raises(ValueError, match=f"characters not in the vocabulary: \\[{named}\\]"):
            tok.encode(bad)
