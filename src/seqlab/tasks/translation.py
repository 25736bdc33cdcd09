"""Machine translation: sentence pairs, subword vocabularies, teacher-forced training, BLEU and chrF.

Data (``source``):

* ``"bible"`` (built in, any machine): 31k English–Spanish verse pairs, the World English Bible and the
  Reina-Valera 1909 (both public domain), shipped with seqlab; split by book, so no verse of a test book is
  seen in training (``seqlab.tasks.parallel.BIBLE_SPLIT``).
* ``"freedict"``: German–English example sentences of the Debian package dict-freedict-deu-eng, read where
  installed (GPL, never copied into seqlab); split by dictionary entry.
* a path to a file of ``source<TAB>target`` lines (an optional third column names a group to split by), of
  at most ``max_bytes`` (200 MB unless raised: preparing it takes about 5 times the file's size in memory).
  The random splits (freedict and files) are the same for every seed (``base.SPLIT_SEED``).

``src_lang`` and ``tgt_lang`` choose a built-in corpus's direction (one named alone implies the other); a
file's columns fix its direction, so there they are refused, as ``max_bytes`` is for a built-in corpus
(``translation_sources``).

Tokens: byte-level BPE through Hugging Face ``tokenizers``, trained on the training split only, one shared
vocabulary for both sides (the default: it lets a model tie its tables) or one per side; ``<pad>``, ``<s>`` and
``</s>`` are ids 0, 1 and 2. A source is its tokens then ``</s>``; the decoder reads ``<s> y`` and predicts
``y </s>``. Pairs with more than ``max_len`` tokens on either side are left out of every split (``describe``
reports how many). The ids are kept flat, one int32 array a side of a split (``pair_ids.TokenRows``); preparing
a corpus of 100,000 pairs or more says what it does at INFO level (``seqlab train`` shows it).

Batches: each epoch shuffles the training pairs with the task's seed, sorts windows of 50 batches by source
length (little padding) and shuffles the batches; batch ``i`` is a pure function of the seed and ``i``.
Loss: cross-entropy with label smoothing over the real target tokens; metrics ``nll`` (nats per target token,
no smoothing), ``ppl`` and ``acc``. ``score`` translates a split and scores it with sacrebleu (BLEU, chrF).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import (
    Batch,
    Task,
    check_bool,
    check_index,
    check_int,
    check_split,
    model_device,
)
from seqlab.tasks.pair_ids import BOS, EOS, PAD, epoch_batches, fixed_batches, prepare
from seqlab.tasks.parallel import MAX_BYTES, Pair, check_eval_splits, check_fits
from seqlab.tasks.tokenizers import TranslationTokenizer
from seqlab.tasks.translation_sources import read_source

__all__ = ["TranslationTask"]

WINDOW = 50  # batches per length-sorted window
MAX_VOCAB = 1_000_000  # far past any translation vocabulary (32k-64k is usual)


class TranslationTask(Task):
    """Translate ``src_lang`` into ``tgt_lang`` (a built-in corpus's; a file's first column into its second).
    Models: family 'seq2seq' or 'transformer'."""

    name = "translation"
    model_families = ("seq2seq", "transformer")
    derived = (
        "source_vocab_size",
        "target_vocab_size",
        "train_pairs",
        "val_pairs",
        "test_pairs",
        "dropped_long",
    )

    def __init__(
        self,
        source: str = "bible",
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        vocab_size: int = 8000,
        shared_vocab: bool = True,
        max_len: int = 96,
        batch_size: int = 64,
        label_smoothing: float = 0.1,
        seed: int = 0,
        max_bytes: int = MAX_BYTES,
    ):
        self.source, self.seed = source, seed
        self.max_bytes = check_int("max_bytes", max_bytes, 1)
        self.vocab_size = check_int("vocab_size", vocab_size, 256 + len(TranslationTokenizer.SPECIALS))
        if vocab_size > MAX_VOCAB:  # the BPE trainer sizes its tables by it: 1e9 aborted the process (70 GB)
            raise ValueError(
                f"vocab_size must be at most {MAX_VOCAB:,} (BPE merges learnt), got {vocab_size:,}"
            )
        self.shared_vocab = check_bool("shared_vocab", shared_vocab)
        self.max_len = check_int("max_len", max_len, 2)
        self.batch_size = check_int("batch_size", batch_size, 1)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self.src_lang, self.tgt_lang, splits = read_source(source, src_lang, tgt_lang, self.max_bytes)
        if not splits["train"]:
            n = sum(len(v) for v in splits.values())
            raise ValueError(
                f"the training split of {source!r} is empty: its {n} pairs all went to validation and test "
                f"(identical pairs share a split); give more distinct pairs"
            )
        self.tokenizer, self.data = prepare(splits, vocab_size, shared_vocab, self.max_len)
        left_out = {k: len(splits[k]) - len(self.data[k][0]) for k in splits}  # pairs past max_len, per split
        self.dropped_long = sum(left_out.values())
        if left_out["val"] or left_out["test"]:  # the scores would be of the shorter, easier pairs only: said
            logging.getLogger("seqlab.tasks").warning(
                "max_len=%d leaves out %d of the %d validation and %d of the %d test pairs: their loss, BLEU and "
                "chrF are of the rest; raise task.max_len to score every pair",
                max_len,
                left_out["val"],
                len(splits["val"]),
                left_out["test"],
                len(splits["test"]),
            )
        if not self.data["train"][0]:
            raise ValueError(f"no training pair of {source!r} has at most max_len={max_len} tokens per side")
        check_eval_splits(source, splits, self.data, max_len)

    def check_model(self, model) -> None:
        """Before step 1: the longest sentences against the model's limit (:func:`parallel.check_fits`)."""
        check_fits(model, *(max(d[i].longest for d in self.data.values()) for i in (0, 1)), self.max_len)

    # ---- settings reported by describe() ---------------------------------------------------------------

    @property
    def source_vocab_size(self) -> int:
        return self.tokenizer.source.vocab_size

    @property
    def target_vocab_size(self) -> int:
        return self.tokenizer.target.vocab_size

    @property
    def train_pairs(self) -> int:
        return len(self.data["train"][0])

    @property
    def val_pairs(self) -> int:
        return len(self.data["val"][0])

    @property
    def test_pairs(self) -> int:
        return len(self.data["test"][0])

    def model_overrides(self) -> dict[str, Any]:
        return {
            "vocab_size": self.source_vocab_size,
            "tgt_vocab_size": None if self.shared_vocab else self.target_vocab_size,
            "pad_id": PAD,
            "bos_id": BOS,
            "eos_id": EOS,
        }

    # ---- data ----------------------------------------------------------------------------------------------

    @functools.lru_cache(maxsize=2)  # noqa: B019 - one task object per run; the cache lives as long as it
    def _epoch(self, epoch: int) -> list[np.ndarray]:
        """The training batches of one epoch, as arrays of pair indices (:func:`pair_ids.epoch_batches`)."""
        lengths = self.data["train"][0].lengths
        return epoch_batches(lengths, self.batch_size, WINDOW, self.seed * 1_000_003 + epoch)

    @functools.lru_cache(maxsize=3)  # noqa: B019
    def _fixed(self, split: str) -> list[np.ndarray]:
        """Validation and test batches: every pair once, sorted by source length."""
        return fixed_batches(self.data[split][0].lengths, self.batch_size)

    def batches_per_epoch(self, split: str = "train") -> int:
        check_split(split)
        return len(self._epoch(0)) if split == "train" else len(self._fixed(split))

    def get_batch(self, split: str, index: int) -> Batch:
        """{"x": source (b, s), "tgt_in": <s> y (b, t), "y": y </s> (b, t)}, padded with 0 on the right."""
        check_split(split), check_index(index)
        if split == "train":
            per = self.batches_per_epoch()
            rows = self._epoch(index // per)[index % per]
        else:
            fixed = self._fixed(split)
            if not fixed:
                raise ValueError(f"the {split} split of {self.source!r} is empty")
            rows = fixed[index % len(fixed)]
        src, tgt = self.data[split][0], self.data[split][1]
        return {"x": src.pad(rows), "tgt_in": tgt.pad(rows, start=BOS), "y": tgt.pad(rows)}

    def tokens_in(self, batch: Batch) -> int:
        return int((batch["y"] != PAD).sum())

    # ---- loss and scores -----------------------------------------------------------------------------------

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        dev = model_device(model)
        x, tgt_in, y = (batch[k].to(dev) for k in ("x", "tgt_in", "y"))
        out = model(x, tgt_in, src_mask=x != PAD)  # logits or log-probabilities (b, t, v)
        if not isinstance(out, Tensor) or out.shape[:2] != y.shape:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"translation expects model(src, tgt_in) of shape (b, t, v) with (b, t)={tuple(y.shape)}, got {got}"
            )
        flat, target = out.reshape(-1, out.size(-1)).float(), y.reshape(-1)
        loss, nll = smoothed_cross_entropy(flat, target, self.label_smoothing)
        with torch.no_grad():
            real = target != PAD
            acc = (flat.argmax(-1)[real] == target[real]).float().mean().item()
        return loss, {"loss": loss.item(), "nll": nll, "ppl": math.exp(min(nll, 50.0)), "acc": acc}, None

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        """Per-token means (nll, ppl, acc, loss) over the first ``max_batches`` batches of a held-out split
        (each pair once: fewer batches if the split is smaller)."""
        check_int("max_batches", max_batches, 1)
        was_training = model.training
        model.eval()
        totals, count = {"loss": 0.0, "nll": 0.0, "acc": 0.0}, 0
        try:
            for index in range(min(max_batches, self.batches_per_epoch(split))):
                batch = self.get_batch(split, index)
                n = self.tokens_in(batch)
                _, metrics, _ = self.loss(model, batch)
                for key in totals:
                    totals[key] += metrics[key] * n
                count += n
        finally:
            model.train(was_training)
        out = {f"{split}_{key}": value / count for key, value in totals.items()}
        out[f"{split}_ppl"] = math.exp(min(out[f"{split}_nll"], 50.0))
        return out

    def pairs(self, split: str) -> list[Pair]:
        """The sentence pairs of a split (those within max_len), in their stored order."""
        return self.data[check_split(split)][2]

    def translate(self, model, texts: list[str], *, beam_size: int = 5, batch_size: int = 64) -> list[str]:
        """Translate source sentences with the task's tokenizer (see :func:`translate`)."""
        return translate(model, self.tokenizer, texts, beam_size=beam_size, batch_size=batch_size)

    def score(
        self, model, split: str = "test", *, beam_size: int = 5, limit: int | None = None
    ) -> dict[str, Any]:
        """Translate a split (its first ``limit`` pairs) and score it: sacrebleu BLEU and chrF."""
        from sacrebleu.metrics import BLEU, CHRF

        pairs = self.pairs(split)[:limit]
        hyps = self.translate(model, [p.source for p in pairs], beam_size=beam_size)
        refs = [p.target for p in pairs]
        bleu, chrf = BLEU(), CHRF()
        return {
            "bleu": bleu.corpus_score(hyps, [refs]).score,
            "chrf": chrf.corpus_score(hyps, [refs]).score,
            "signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
            "sentences": len(pairs),
            "hypotheses": hyps,
        }


def smoothed_cross_entropy(logits: Tensor, target: Tensor, smoothing: float) -> tuple[Tensor, float]:
    """(``F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=smoothing)``, the plain mean NLL of
    the same tokens) from one log-softmax: (1 - ε) NLL + ε (the mean of -log p over the vocabulary), averaged
    over the non-pad targets, as torch defines it (Szegedy et al. 2016). logits (n, v), target (n,)."""
    logp = F.log_softmax(logits, dim=-1)
    real = target != PAD
    count = real.sum().clamp_min(1)
    nll_i = -logp.gather(1, target.clamp_min(0)[:, None]).squeeze(1)  # (n,)
    nll = (nll_i * real).sum() / count
    if smoothing == 0:
        return nll, nll.item()
    smooth = (-logp.mean(-1) * real).sum() / count
    return (1 - smoothing) * nll + smoothing * smooth, nll.item()


def translate(
    model,
    tokenizer: TranslationTokenizer,
    texts: list[str],
    *,
    beam_size: int = 5,
    max_new_tokens: int | None = None,
    batch_size: int = 64,
    return_attention: bool = False,
) -> list[str] | tuple[list[str], list[tuple[list[str], list[str], Tensor]]]:
    """Translate ``texts`` with ``model.generate``, batched by length; results in input order.

    The longest batch goes first, so a source longer than the model accepts is refused (by the model's own
    check) before any other is decoded. ``max_new_tokens`` defaults, per sentence, to twice its source tokens
    (</s> included) plus 10, rounded up to a multiple of 16 (and at most a Transformer's position table); a
    batch holds sentences of one such limit, so what a sentence becomes never depends on the others beside it.
    With ``return_attention`` also, per sentence, (source tokens, target tokens, attention (n_target,
    n_source)) for alignment pictures.
    """
    if isinstance(texts, str) or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError("texts must be a list of non-empty strings")
    ids = tokenizer.source.encode_batch(list(texts))
    order = sorted(range(len(texts)), key=lambda i: len(ids[i]), reverse=True)
    out: list[str] = [""] * len(texts)
    maps: list = [None] * len(texts)
    dev = model_device(model)
    for rows, n_new in _batches(model, order, ids, max_new_tokens, batch_size):
        src = _pad([[*ids[i], EOS] for i in rows]).to(dev)
        hyp = model.generate(
            src,
            src_mask=src != PAD,
            max_new_tokens=n_new,
            beam_size=beam_size,
            return_attention=return_attention,
        )
        hyp, weights = hyp if return_attention else (hyp, None)
        for k, (i, row) in enumerate(zip(rows, hyp.tolist(), strict=True)):
            tgt = _strip(row)
            out[i] = tokenizer.target.decode(tgt)
            if weights is not None:
                maps[i] = _alignment(tokenizer, ids[i], tgt, weights[k])
    return (out, maps) if return_attention else out


def default_max_new_tokens(n_source: int, model=None) -> int:
    """The default length limit of one sentence's translation: 2 (n_source + 1) + 10 tokens (</s> counted in the
    source), rounded up to a multiple of 16, at most a Transformer's position table (``max_seq_len``)."""
    n = -(-(2 * (n_source + 1) + 10) // 16) * 16
    return min(n, getattr(getattr(model, "config", None), "max_seq_len", n))


def _batches(model, order: list[int], ids: list[list[int]], max_new_tokens: int | None, batch_size: int):
    """(rows, max_new_tokens) of each batch: runs of one limit in ``order`` (sorted by length), batch_size at most."""

    def limit(i: int) -> int:
        return max_new_tokens or default_max_new_tokens(len(ids[i]), model)

    for n_new, run in itertools.groupby(order, key=limit):
        run = list(run)
        for j in range(0, len(run), batch_size):
            yield run[j : j + batch_size], n_new


def _alignment(tokenizer: TranslationTokenizer, src: list[int], tgt: list[int], weights: Tensor):
    """(source tokens, target tokens, weights (n_target, n_source)) of one sentence, </s> on both sides."""
    n_src, n_tgt = len(src) + 1, min(len(tgt) + 1, weights.size(0))
    names = [tokenizer.source.decode([t]) for t in src] + ["</s>"]
    outs = ([tokenizer.target.decode([t]) for t in tgt] + ["</s>"])[:n_tgt]
    return names, outs, weights[:n_tgt, :n_src].float().cpu()


def _pad(rows: list[list[int]]) -> Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long)


def _strip(ids: list[int]) -> list[int]:
    """Generated ids without <s>, cut at the first </s>; pads dropped."""
    out = []
    for i in ids[1:] if ids and ids[0] == BOS else ids:
        if i == EOS:
            break
        if i != PAD:
            out.append(i)
    return out
