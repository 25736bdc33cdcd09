"""The translation task's flat token ids: the same ids as the tokenizer's plain encode, the same batches as the
list-based code they replaced (kept here as ``_ref``), and what preparing a large corpus says."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

import seqlab.tasks.pair_ids as pair_ids
import seqlab.tasks.tokenizers as tokenizers_module
from seqlab.tasks import create_task
from seqlab.tasks.pair_ids import BOS, EOS, PAD, TokenRows, encode_pairs, epoch_batches, fixed_batches
from seqlab.tasks.parallel import Pair
from seqlab.tasks.tokenizers import BPETokenizer, TranslationTokenizer
from seqlab.tasks.translation import WINDOW

WORDS = [
    "the",
    "cat",
    "sees",
    "a",
    "dog",
    "naïve",
    "café",
    "Zürich",
    "日本語",
    "Привет",
    "😀",
    "ᚠᛇᚻ",
    "42",
    "x-y",
]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(0, 30))]
    joints = [rng.choice([" ", " ", " ", "  ", ", ", "\u00a0", "\t"]) for _ in words]
    return "".join(w + j for w, j in zip(words, joints, strict=True)).strip(" ")


@pytest.fixture(scope="module")
def varied():
    """400 pairs: empty sides, unicode of every width, emoji, odd spaces, up to 30 words."""
    rng = random.Random(0)
    pairs = [Pair(_sentence(rng), _sentence(rng), "") for _ in range(400)]
    return [Pair("", "", ""), Pair("", "el gato", ""), Pair("😀😀", "", ""), *pairs]


@pytest.fixture(scope="module", params=[True, False], ids=["shared", "separate"])
def tokenizer(request, varied):
    return TranslationTokenizer.train(
        [p.source for p in varied[:200]], [p.target for p in varied[:200]], 400, shared=request.param
    )


def test_encode_flat_gives_the_ids_of_a_plain_encode(tokenizer, varied):
    for side, texts in (
        (tokenizer.source, [p.source for p in varied]),
        (tokenizer.target, [p.target for p in varied]),
    ):
        ids, lengths = side.encode_flat(texts)
        assert ids.dtype == np.int32 and lengths.dtype == np.int64 and lengths.sum() == len(ids)
        rows = np.split(ids, np.cumsum(lengths)[:-1])
        assert [r.tolist() for r in rows] == [side.tokenizer.encode(t).ids for t in texts]
        assert lengths[0] == 0 and lengths.max() > 40  # the empty text and long ones were among them


def test_without_encode_batch_fast_the_same_ids_and_one_note(tokenizer, varied, caplog):
    class OldTokenizers:  # a tokenizers before 0.20.1: encode_batch only
        def __init__(self, tok):
            self.encode_batch = tok.encode_batch

    texts = [p.source for p in varied]
    old = BPETokenizer(OldTokenizers(tokenizer.source.tokenizer))
    tokenizers_module._say_no_fast_encoder.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="seqlab.tasks"):
            for _ in range(2):
                for got, want in zip(
                    old.encode_flat(texts), tokenizer.source.encode_flat(texts), strict=True
                ):
                    np.testing.assert_array_equal(got, want)
    finally:
        tokenizers_module._say_no_fast_encoder.cache_clear()
    assert caplog.text.count("no encode_batch_fast") == 1  # said once, not at every call


def test_encode_pairs_keeps_pairs_within_max_len_across_chunks(tokenizer, varied, monkeypatch):
    monkeypatch.setattr(pair_ids, "CHUNK", 7)  # many chunks, a short last one
    calls = []
    src, tgt, kept = encode_pairs(tokenizer, varied, max_len=20, progress=calls.append)
    plain = [
        (tokenizer.source.tokenizer.encode(p.source).ids, tokenizer.target.tokenizer.encode(p.target).ids)
        for p in varied
    ]
    want = [(p, s, t) for p, (s, t) in zip(varied, plain, strict=True) if len(s) < 20 and len(t) < 20]
    assert 0 < len(want) < len(varied)  # some pairs were left out
    assert kept == [p for p, _, _ in want]
    assert [r.tolist() for r in src] == [[*s, EOS] for _, s, _ in want]
    assert [tgt[i].tolist() for i in range(len(tgt))] == [[*t, EOS] for _, _, t in want]
    assert sum(calls) == len(varied) and max(calls) == 7 and len(calls) == -(-len(varied) // 7)
    assert src.ids.dtype == np.int32 and src.longest == max(len(s) + 1 for _, s, _ in want)


def test_encode_pairs_of_no_pairs(tokenizer):
    src, tgt, kept = encode_pairs(tokenizer, [], max_len=20)
    assert len(src) == len(tgt) == 0 and kept == [] and not src and src.longest == 0


def _pad_ref(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long)


def test_token_rows_read_like_a_list_of_rows():
    lists = [[5, 6, EOS], [EOS], [7, 8, 9, 10, EOS], [3, EOS]]
    rows = TokenRows.from_lengths(np.array([i for r in lists for i in r], np.int32), np.array([3, 1, 5, 2]))
    assert len(rows) == 4 and [r.tolist() for r in rows] == lists and rows[-1].tolist() == [3, EOS]
    assert rows.lengths.tolist() == [3, 1, 5, 2] and rows.longest == 5
    with pytest.raises(IndexError):
        rows[4]
    for pick in ([2, 0, 1], [1], [3, 3], np.array([0, 2])):
        got = rows.pad(pick)
        assert got.dtype == torch.long and torch.equal(got, _pad_ref([lists[i] for i in pick]))
        shifted = rows.pad(pick, start=BOS)
        assert torch.equal(shifted, _pad_ref([[BOS, *lists[i][:-1]] for i in pick]))


def _epoch_ref(lengths: list[int], batch_size: int, window: int, seed: int) -> list[list[int]]:
    """The list-based epoch TranslationTask._epoch computed before the ids were stored flat."""
    n = len(lengths)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g).tolist()
    span, batches = window * batch_size, []
    for start in range(0, n, span):
        part = sorted(order[start : start + span], key=lambda i: lengths[i])
        batches += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


@pytest.mark.parametrize(
    ("n", "batch_size", "window"), [(1, 4, 50), (97, 4, 3), (1000, 16, 5), (640, 64, 10)]
)
def test_batches_are_those_of_the_list_based_code(n, batch_size, window):
    lengths = np.random.default_rng(n).integers(1, 12, n)  # few distinct lengths: many ties
    for seed in (0, 7):
        got = [b.tolist() for b in epoch_batches(lengths, batch_size, window, seed)]
        assert got == _epoch_ref(lengths.tolist(), batch_size, window, seed)
    ref = sorted(range(n), key=lambda i: lengths[i])
    assert [b.tolist() for b in fixed_batches(lengths, batch_size)] == [
        ref[j : j + batch_size] for j in range(0, n, batch_size)
    ]


def _pairs_file(path, n: int):
    rng = random.Random(1)
    sides = [(_sentence(rng) or "a").replace("\t", " ") for _ in range(2 * n)]  # no tab inside a side
    path.write_text(
        "".join(f"{s}\t{t}\n" for s, t in zip(sides[::2], sides[1::2], strict=True)), encoding="utf-8"
    )
    return path


def test_the_task_batches_are_those_of_lists_of_ids(tmp_path):
    """get_batch from the flat ids is what it was from lists of ids: the rows of the list-based epoch, padded."""
    task = create_task(
        "translation", source=str(_pairs_file(tmp_path / "p.tsv", 500)), vocab_size=300, batch_size=8
    )
    per = task.batches_per_epoch()
    cases = [("train", i) for i in (0, 5, per - 1, per, 3 * per + 2)] + [("val", 0), ("val", 3), ("test", 1)]
    for split, index in cases:
        src, tgt = ([r.tolist() for r in side] for side in task.data[split][:2])
        lengths = [len(r) for r in src]
        if split == "train":
            rows = _epoch_ref(lengths, 8, WINDOW, task.seed * 1_000_003 + index // per)[index % per]
        else:
            order = sorted(range(len(src)), key=lambda i: lengths[i])
            rows = [order[j : j + 8] for j in range(0, len(order), 8)][index]
        want = {
            "x": _pad_ref([src[i] for i in rows]),
            "tgt_in": _pad_ref([[BOS, *tgt[i][:-1]] for i in rows]),
            "y": _pad_ref([tgt[i] for i in rows]),
        }
        got = task.get_batch(split, index)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), (split, index)


def test_a_large_corpus_says_what_it_prepares(tmp_path, caplog, monkeypatch):
    path = _pairs_file(tmp_path / "pairs.tsv", 300)
    with caplog.at_level(logging.INFO, logger="seqlab.tasks"):
        create_task("translation", source=str(path), vocab_size=300, max_len=200)
    assert "translation data" not in caplog.text  # 300 pairs: quiet
    caplog.clear()
    monkeypatch.setattr(pair_ids, "LARGE", 100)
    monkeypatch.setattr(pair_ids, "EVERY_S", 0.0)
    monkeypatch.setattr(pair_ids, "CHUNK", 50)
    with caplog.at_level(logging.INFO, logger="seqlab.tasks"):
        create_task("translation", source=str(path), vocab_size=300, max_len=200)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("translation data")]
    assert said[0].startswith("translation data: read 300 pairs from")
    assert "learning a BPE vocabulary of 300 on" in said[1] and "vocabulary learnt" in said[2]
    assert "encoded 50 of 300 pairs" in said[3] and said[-1].startswith("translation data: encoded in")
