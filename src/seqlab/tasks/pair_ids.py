"""The translation task's sentence pairs as token ids, stored flat, and the batches drawn from them.

One side of one split (every source sentence of the training split, say) is a :class:`TokenRows`: one int32
array of ids, each sentence's ids then ``</s>``, and int64 offsets, sentence ``i`` being
``ids[offsets[i]:offsets[i + 1]]``. A million pairs of about 25 tokens a side take some 200 MB so, where lists of
Python ints took gigabytes. The pairs are encoded in chunks of :data:`CHUNK` sentences (the tokenizer's own
output for a chunk lives only until it is copied), with a progress line every :data:`EVERY_S` seconds for a
corpus of :data:`LARGE` pairs or more.

Batches: :func:`epoch_batches` (shuffled, length-sorted windows) and :func:`fixed_batches` (every pair once,
sorted by length) return arrays of row numbers; :meth:`TokenRows.pad` makes a batch's (b, t) tensor.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from seqlab.tasks.parallel import Pair
from seqlab.tasks.tokenizers import TranslationTokenizer

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "TokenRows",
    "encode_pairs",
    "epoch_batches",
    "fixed_batches",
    "prepare",
    "say",
]

PAD, BOS, EOS = 0, 1, 2
CHUNK = 10_000  # sentences encoded at once
LARGE = 100_000  # pairs from which preparing the data says what it does at INFO level (DEBUG below)
EVERY_S = 10.0  # seconds between two progress lines while encoding

log = logging.getLogger("seqlab.tasks")


def say(n_pairs: int, message: str, *args) -> None:
    """Log a step of preparing ``n_pairs`` pairs: at INFO level from :data:`LARGE` pairs, at DEBUG below."""
    log.log(logging.INFO if n_pairs >= LARGE else logging.DEBUG, message, *args)


class TokenRows:
    """Many sentences' token ids in one flat array: row ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.

    ids int32 (n_tokens,), offsets int64 (n + 1,), offsets[0] = 0. Reads as a sequence of int32 arrays (``len``,
    ``rows[i]``, iteration); ``lengths`` and ``longest`` without a loop.

    Examples::

        >>> rows = TokenRows.from_lengths(np.array([5, 6, 2, 7, 2], np.int32), np.array([3, 2]))
        >>> len(rows), rows[1].tolist(), rows.pad([1, 0]).tolist()
        (2, [7, 2], [[7, 2, 0], [5, 6, 2]])
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    @classmethod
    def from_lengths(cls, ids: np.ndarray, lengths: np.ndarray) -> TokenRows:
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(ids, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        i = range(len(self))[i]  # a negative i counts from the end; past the end: IndexError
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self):
        return (self.ids[a:b] for a, b in itertools.pairwise(self.offsets.tolist()))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def longest(self) -> int:
        return int(self.lengths.max(initial=0))

    def pad(self, rows, start: int | None = None) -> Tensor:
        """The rows ``rows`` as a (b, t) long tensor, padded with PAD on the right to the longest; with ``start``,
        each row shifted right by one behind it (``<s> y`` from ``y </s>``: the same length, the last id gone)."""
        rows = np.asarray(rows, dtype=np.int64)
        begin, length = self.offsets[rows], self.offsets[rows + 1] - self.offsets[rows]  # (b,)
        cols = np.arange(int(length.max()))  # (t,)
        fill = cols < length[:, None]  # (b, t): True where the row has an id
        shift = int(start is not None)
        if shift:
            fill[:, 0] = False
        out = np.zeros(fill.shape, dtype=np.int64)
        out[fill] = self.ids[(begin[:, None] + cols - shift)[fill]]
        if shift:
            out[:, 0] = start
        return torch.from_numpy(out)


def _with_eos(ids: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths) of the rows where ``keep`` is True, each followed by </s>."""
    ids, lengths = ids[np.repeat(keep, lengths)], lengths[keep] + 1
    out = np.empty(int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths) - 1  # where each row's </s> goes
    tokens = np.ones(len(out), dtype=bool)
    tokens[ends] = False
    out[tokens], out[ends] = ids, EOS
    return out, lengths


def encode_pairs(
    tokenizer: TranslationTokenizer,
    pairs: list[Pair],
    max_len: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[TokenRows, TokenRows, list[Pair]]:
    """(source ids + </s>, target ids + </s>, the pairs) of the pairs with fewer than ``max_len`` tokens on both
    sides (</s> not counted), in their order; encoded :data:`CHUNK` pairs at a time, ``progress(n)`` called after
    each chunk of ``n``."""
    parts: list[tuple] = []
    kept: list[Pair] = []
    for start in range(0, len(pairs), CHUNK):
        chunk = pairs[start : start + CHUNK]
        src, n_src = tokenizer.source.encode_flat([p.source for p in chunk])
        tgt, n_tgt = tokenizer.target.encode_flat([p.target for p in chunk])
        keep = (n_src < max_len) & (n_tgt < max_len)
        parts.append((*_with_eos(src, n_src, keep), *_with_eos(tgt, n_tgt, keep)))
        kept += itertools.compress(chunk, keep.tolist())
        if progress is not None:
            progress(len(chunk))

    def joined(k: int, dtype) -> np.ndarray:
        return np.concatenate([np.empty(0, dtype), *(part[k] for part in parts)])

    source = TokenRows.from_lengths(joined(0, np.int32), joined(1, np.int64))
    return source, TokenRows.from_lengths(joined(2, np.int32), joined(3, np.int64)), kept


class _Progress:
    """``progress(n)`` for :func:`encode_pairs`: a line 'encoded k of n pairs' every :data:`EVERY_S` seconds."""

    def __init__(self, total: int):
        self.total, self.done, self.last = total, 0, time.perf_counter()

    def __call__(self, n: int) -> None:
        self.done += n
        if time.perf_counter() - self.last >= EVERY_S and self.done < self.total:
            self.last = time.perf_counter()
            say(self.total, "translation data: encoded %s of %s pairs", f"{self.done:,}", f"{self.total:,}")


def prepare(
    splits: dict[str, list[Pair]], vocab_size: int, shared: bool, max_len: int
) -> tuple[TranslationTokenizer, dict[str, tuple[TokenRows, TokenRows, list[Pair]]]]:
    """The tokenizer learnt on the training split, and every split encoded (:func:`encode_pairs`), each step
    said (:func:`say`: a million pairs take a minute or two)."""
    total, train = sum(map(len, splits.values())), splits["train"]
    t0 = time.perf_counter()
    n_train = f"{len(train):,}"
    say(total, "translation data: learning a BPE vocabulary of %d on %s training pairs", vocab_size, n_train)
    sources, targets = [p.source for p in train], [p.target for p in train]
    tokenizer = TranslationTokenizer.train(sources, targets, vocab_size, shared)
    t1 = time.perf_counter()
    say(total, "translation data: vocabulary learnt in %.0f s; encoding %s pairs", t1 - t0, f"{total:,}")
    progress = _Progress(total)
    data = {name: encode_pairs(tokenizer, pairs, max_len, progress) for name, pairs in splits.items()}
    n_ids = sum(len(rows.ids) for d in data.values() for rows in d[:2])
    seconds, megabytes = time.perf_counter() - t1, n_ids * 4 / 1e6
    say(total, "translation data: encoded in %.0f s, %s ids (%.0f MB)", seconds, f"{n_ids:,}", megabytes)
    return tokenizer, data


def epoch_batches(lengths: np.ndarray, batch_size: int, window: int, seed: int) -> list[np.ndarray]:
    """One epoch's training batches as arrays of row numbers: the rows shuffled (a generator seeded with ``seed``),
    each run of ``window`` batches sorted by length (ties in shuffled order), the batches shuffled."""
    n = len(lengths)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g).numpy()
    windows = np.arange(n) // (window * batch_size)
    order = order[np.lexsort((lengths[order], windows))]  # by window, then length; stable
    starts = np.arange(0, n, batch_size)  # a window holds whole batches: all start at multiples of batch_size
    perm = torch.randperm(len(starts), generator=g).numpy()
    return [order[s : s + batch_size] for s in starts[perm].tolist()]


def fixed_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Every row once in batches of ``batch_size``, sorted by length (ties in row order)."""
    order = np.argsort(lengths, kind="stable")
    return [order[j : j + batch_size] for j in range(0, len(order), batch_size)]
