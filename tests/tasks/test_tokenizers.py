"""Subword tokenizers through HF tokenizers: training on Shakespeare, round trips, JSON save/load, dispatch."""

import pytest
import torch

from seqlab.tasks.text import CharTokenizer

pytest.importorskip("tokenizers")

from seqlab.tasks.tokenizers import BPETokenizer, WordPieceTokenizer, tokenizer_from_json


@pytest.fixture(scope="module")
def text():
    from seqlab.tasks.corpus import shakespeare_text

    return shakespeare_text()[:300_000]


def test_bpe_is_lossless_and_compresses(text, tmp_path):
    tok = BPETokenizer.train(text, vocab_size=600)
    assert tok.vocab_size == 600
    sample = text[1000:3000]
    ids = tok.encode(sample)
    assert ids.dtype == torch.long and len(ids) < len(sample) / 2.0  # merges shorten the text
    assert tok.decode(ids) == sample
    odd = "Zwölf naïve cafés — 東京 🙂"
    assert tok.decode(tok.encode(odd)) == odd  # unseen characters still encode, as bytes
    tok.save(tmp_path / "bpe.json")
    again = BPETokenizer.load(tmp_path / "bpe.json")
    assert torch.equal(again.encode(sample), ids)
    assert isinstance(tokenizer_from_json(tok.to_json()), BPETokenizer)


def test_wordpiece_round_trip_and_specials(text):
    tok = WordPieceTokenizer.train(text, vocab_size=800)
    assert tok.token_to_id("[PAD]") == 0 and tok.token_to_id("[MASK]") == 4
    line = "Now is the winter of our discontent"
    ids = tok.encode(line)
    assert tok.decode(ids) == line
    assert tok.encode("Ωmega").tolist()[0] == tok.token_to_id("[UNK]")
    again = tokenizer_from_json(tok.to_json())
    assert isinstance(again, WordPieceTokenizer) and torch.equal(again.encode(line), ids)


def test_dispatch_and_errors():
    char = CharTokenizer.from_text("abc")
    assert isinstance(tokenizer_from_json(char.to_json()), CharTokenizer)
    with pytest.raises(ValueError, match="unknown tokenizer type"):
        tokenizer_from_json('{"type": "sentencepiece"}')
    with pytest.raises(ValueError, match="not a bpe"):
        BPETokenizer.from_json(char.to_json())
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.train("abc", vocab_size=100)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "tokenizer.json is not valid JSON"),
        ("[1, 2]", "unknown tokenizer type None"),
        ('{"type": "char"}', "of type 'char' is not one seqlab wrote \\(KeyError"),
        ('{"type": "char", "chars": ["ab", "c"]}', "chars must be a non-empty string"),
        ('{"type": "bpe", "tokenizer": {"model": 3}}', "of type 'bpe' is not one seqlab wrote"),
        ('{"type": "translation", "source": {}, "shared": true}', "of type 'translation' is not one seqlab"),
    ],
)
def test_a_tokenizer_json_seqlab_did_not_write_is_one_clear_error(text, match):
    with pytest.raises(ValueError, match=match):
        tokenizer_from_json(text)
