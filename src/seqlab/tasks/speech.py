r"""Speech as spectrogram slices: a keyword per utterance (many to one) and a transcript per utterance (many to
many, unaligned, CTC), on a corpus spoken by espeak-ng or on a user's folder of WAV files.

Notation: ``b`` batch, ``t`` feature frames, ``m`` mel bands, ``t'`` the model's output frames, ``K`` classes,
``v`` CTC outputs (the blank, id 0, then the tokens), ``L`` label length.

Sources (nothing is downloaded):

    generated  ``seqlab.tasks.speech_corpus``: espeak-ng voices, rates, pitches and noise, built once into the
               user's data folder; train, validation and test are spoken by disjoint voice variants, so the
               test scores are on voices never heard in training
    folder     a user's WAV files and ``transcripts.txt`` (``seqlab.tasks.speech_folder``), split 80/10/10 by
               speaker when the file names speakers, else by file (the same for every seed); a recording longer
               than ``max_seconds`` (default 60) is refused before any audio is read

A setting of the other source (``n_train``, ``n_eval``, ``snrs``, ``min_digits``, ``max_digits``,
``cache_dir`` and ``jobs`` shape the generated corpus, ``max_seconds`` a folder) is refused when given other
than its default (``seqlab.tasks.speech_settings``): it would change nothing.

Tasks:

    keywords    the word (10 digits and 10 commands, or a folder's distinct transcripts): cross-entropy of
                model(x, mask) (b, K); accuracy
    speech_ctc  the transcript of a spoken digit string ("seven three nine"), or a folder's transcripts, as
                characters (``units='chars'``: a-z, space, apostrophe) or words: the CTC loss
                (``torch.nn.functional.ctc_loss``) of model(x, mask) (b, t', v) against the labels, no alignment
                given; character and word error rates (``jiwer``) of greedy decoding and of prefix beam search
                (``seqlab.tasks.speech_decode``)

A generated corpus is one fixed data set for its settings (its own seed, not the task's: another ``seed``
orders the batches differently without building another corpus). Features are log-mel spectrograms,
normalized per utterance (``speech_data.Features``), so a WAV file at inference needs the feature settings
only, which ``describe`` saves with the checkpoint. Training batch ``i`` holds positions ``i b ...`` of an
endless sequence of seeded epochs; evaluation reads each utterance once. Batches are right-padded with zeros:
``x`` (b, t, m) float, ``mask`` (b, t) bool.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import (
    SPLIT_SEED,
    Batch,
    Task,
    check_choice,
    check_index,
    check_int,
    check_output,
    check_split,
    epoch_rows,
    model_device,
)
from seqlab.tasks.speech_data import Features, Utterances, split_by_speaker
from seqlab.tasks.speech_decode import ctc_frames_needed, decode_ids, transcribe_batch
from seqlab.tasks.speech_folder import MAX_SECONDS, check_max_seconds, read_speech_folder
from seqlab.tasks.speech_settings import check_snrs as _check_snrs
from seqlab.tasks.speech_settings import check_source_settings

__all__ = ["CHARACTERS", "KeywordTask", "SpeechCTCTask", "decode_ids", "transcribe_batch"]

log = logging.getLogger("seqlab.tasks")

Source = Literal["generated", "folder"]
Units = Literal["chars", "words"]
CHARACTERS = tuple(" abcdefghijklmnopqrstuvwxyz'")
BLANK = "<blank>"


class SpeechTask(Task):
    """What the two speech tasks share: the corpus, batches of padded features, evaluation over each
    utterance once. Subclasses set ``kind`` and implement ``_targets``, ``loss`` and ``_scores``."""

    model_families = ("speech",)
    kind = "keywords"

    def _setup(self, source, path, n_train, n_eval, snrs, n_mels, batch_size, seed, cache_dir, jobs) -> None:
        self.source, self.path = check_choice("source", source, Source), path
        self.n_train, self.n_eval = check_int("n_train", n_train, 1), check_int("n_eval", n_eval, 1)
        self.snrs = _check_snrs(snrs)
        self.n_mels, self.batch_size = check_int("n_mels", n_mels, 1), check_int("batch_size", batch_size, 1)
        self.seed, self.cache_dir, self.jobs = (
            check_int("seed", seed, 0),
            cache_dir,
            check_int("jobs", jobs, 1),
        )
        if (source == "folder") != (path is not None):
            raise ValueError(
                "source='folder' needs path=FOLDER (with transcripts.txt), and path belongs to it only"
            )
        self._features = Features(n_mels=n_mels)
        self.corpus_folder = None
        self.data = self._load_generated() if source == "generated" else self._load_folder()

    def _corpus_settings(self):
        from seqlab.tasks.speech_corpus import CorpusSettings

        extra = {} if self.snrs is None else {"snrs": tuple(self.snrs)}
        if self.kind == "digits":
            extra.update(min_digits=self.min_digits, max_digits=self.max_digits)
        return CorpusSettings(self.kind, self.n_train, self.n_eval, features=self._features, **extra)

    def _load_generated(self) -> dict[str, Utterances]:
        from seqlab.tasks.speech_corpus import load_corpus

        corpus, splits, self.corpus_folder = load_corpus(self._corpus_settings(), self.cache_dir, self.jobs)
        return {split: corpus.subset(rows) for split, rows in splits.items()}

    def _load_folder(self) -> dict[str, Utterances]:
        everything = read_speech_folder(self.path, self._features, self.max_seconds)
        if len(everything) < 10:
            raise ValueError(f"a speech folder needs at least 10 utterances to split, got {len(everything)}")
        return {
            k: everything.subset(rows)
            for k, rows in split_by_speaker(everything.speakers, SPLIT_SEED).items()
        }

    # ---- sizes ---------------------------------------------------------------------------------------------

    @property
    def features(self) -> dict[str, Any]:
        return asdict(self._features)

    @property
    def n_utterances(self) -> dict[str, int]:
        return {split: len(u) for split, u in self.data.items()}

    @property
    def corpus(self) -> str | None:
        """The generated corpus's cache folder (None for a user's folder)."""
        return None if self.corpus_folder is None else str(self.corpus_folder)

    def check_split(self, split: Any) -> str:
        return check_split(split)

    # ---- batches -------------------------------------------------------------------------------------------

    def get_batch(self, split: str, index: int) -> Batch:
        index, split = check_index(index), self.check_split(split)
        utts, b = self.data[split], self.batch_size
        if split == "train":
            rows = epoch_rows(self.seed, len(utts), index, b)
        else:
            rows = torch.arange(index * b, index * b + b) % len(utts)  # in order, wrapping
        return self.rows_batch(utts, rows)

    def rows_batch(self, utts: Utterances, rows: Tensor) -> Batch:
        x, mask = utts.batch(rows)
        return {"x": x, "mask": mask, "index": rows, **self._targets([utts.texts[int(r)] for r in rows])}

    def _targets(self, texts: list[str]) -> Batch:
        raise NotImplementedError

    def tokens_in(self, batch: Batch) -> int:
        """Feature frames read."""
        return int(batch["mask"].sum())

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        """Loss-weighted means over the first ``max_batches`` batches' utterances (each once) and the scores of
        the subclass (accuracy, or error rates)."""
        check_int("max_batches", max_batches, 1)
        utts, b = self.data[self.check_split(split)], self.batch_size
        n = min(len(utts), max_batches * b)
        was_training = model.training
        model.eval()
        try:
            totals, outputs = {}, []
            for start in range(0, n, b):
                rows = torch.arange(start, min(n, start + b))
                batch = self.rows_batch(utts, rows)
                _, metrics, _ = self.loss(model, batch)
                totals = {k: totals.get(k, 0.0) + v * len(rows) for k, v in metrics.items()}
                outputs.append(self.predict(model, batch["x"], batch["mask"]))
        finally:
            model.train(was_training)
        out = {k: v / n for k, v in totals.items()}
        out.update(self._scores(utts.texts[:n], [p for o in outputs for p in o]))
        return {f"{split}_{k}": v for k, v in out.items()}

    def predict(self, model, x: Tensor, mask: Tensor) -> list:
        raise NotImplementedError

    def _scores(self, texts: list[str], predictions: list) -> dict[str, float]:
        raise NotImplementedError


class KeywordTask(SpeechTask):
    """A spoken word -> its class; see the module docstring."""

    name = "keywords"
    kind = "keywords"
    derived = ("n_classes", "class_names", "n_utterances", "majority", "features", "corpus")

    def __init__(
        self,
        source: Source = "generated",
        path: str | None = None,
        n_train: int = 3000,
        n_eval: int = 500,
        snrs: list | None = None,
        n_mels: int = 40,
        batch_size: int = 32,
        seed: int = 0,
        cache_dir: str | None = None,
        jobs: int = 2,
        max_seconds: float = MAX_SECONDS,
    ):
        sizes = {"n_train": n_train, "n_eval": n_eval, "snrs": snrs, "cache_dir": cache_dir, "jobs": jobs}
        check_source_settings(KeywordTask, source, **sizes, max_seconds=max_seconds)
        self.max_seconds = check_max_seconds(max_seconds)  # a folder's longest recording
        self._setup(source, path, n_train, n_eval, snrs, n_mels, batch_size, seed, cache_dir, jobs)
        if source == "generated":
            from seqlab.tasks.speech_corpus import KEYWORDS

            self.class_names = list(KEYWORDS)
        else:
            self.class_names = sorted({t for u in self.data.values() for t in u.texts})
        self._ids = {w: i for i, w in enumerate(self.class_names)}

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def majority(self) -> float:
        """The accuracy of always answering the training set's most frequent word."""
        y = torch.tensor([self._ids[t] for t in self.data["train"].texts])
        return torch.bincount(y).max().item() / len(y)

    def model_overrides(self) -> dict[str, Any]:
        return {"head": "classify", "n_mels": self.n_mels, "n_outputs": self.n_classes}

    def _targets(self, texts: list[str]) -> Batch:
        return {"y": torch.tensor([self._ids[t] for t in texts])}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        dev = model_device(model)
        x, mask, y = batch["x"].to(dev), batch["mask"].to(dev), batch["y"].to(dev)
        logits = check_output("keywords", model(x, mask=mask), (x.size(0), self.n_classes), "logits (b, K)")
        nll = F.cross_entropy(logits.float(), y)
        acc = (logits.argmax(-1) == y).float().mean().item()
        return nll, {"loss": nll.item(), "acc": acc}, None

    @torch.no_grad()
    def predict(self, model, x: Tensor, mask: Tensor) -> list[str]:
        dev = model_device(model)
        logits = model(x.to(dev), mask=mask.to(dev))  # (b, K)
        return [self.class_names[i] for i in logits.argmax(-1).tolist()]

    def _scores(self, texts: list[str], predictions: list[str]) -> dict[str, float]:
        return {"acc": sum(p == t for p, t in zip(predictions, texts, strict=True)) / len(texts)}


class SpeechCTCTask(SpeechTask):
    """An utterance -> its transcript, by CTC; see the module docstring."""

    name = "speech_ctc"
    kind = "digits"
    derived = ("vocabulary", "n_utterances", "features", "corpus")

    def __init__(
        self,
        source: Source = "generated",
        path: str | None = None,
        n_train: int = 3000,
        n_eval: int = 500,
        min_digits: int = 2,
        max_digits: int = 5,
        units: Units = "chars",
        beam_size: int = 8,
        snrs: list | None = None,
        n_mels: int = 40,
        batch_size: int = 32,
        seed: int = 0,
        cache_dir: str | None = None,
        jobs: int = 2,
        max_seconds: float = MAX_SECONDS,
    ):
        sizes = {"n_train": n_train, "n_eval": n_eval, "snrs": snrs, "cache_dir": cache_dir, "jobs": jobs}
        digits = {"min_digits": min_digits, "max_digits": max_digits}
        check_source_settings(SpeechCTCTask, source, **sizes, **digits, max_seconds=max_seconds)
        self.max_seconds = check_max_seconds(max_seconds)  # a folder's longest recording
        self.min_digits, self.max_digits = (
            check_int("min_digits", min_digits, 1),
            check_int("max_digits", max_digits, 1),
        )
        if max_digits < min_digits:
            raise ValueError(f"max_digits={max_digits} must be >= min_digits={min_digits}")
        self.units, self.beam_size = check_choice("units", units, Units), check_int("beam_size", beam_size, 1)
        self._setup(source, path, n_train, n_eval, snrs, n_mels, batch_size, seed, cache_dir, jobs)
        self.vocabulary = [BLANK, *self._tokens()]
        self._ids = {tok: i for i, tok in enumerate(self.vocabulary)}

    def _tokens(self) -> list[str]:
        if self.source == "generated":
            from seqlab.tasks.speech_corpus import DIGITS

            return list(CHARACTERS) if self.units == "chars" else list(DIGITS)
        texts = [t for u in self.data.values() for t in u.texts]
        return sorted({c for t in texts for c in (t if self.units == "chars" else t.split())})

    def model_overrides(self) -> dict[str, Any]:
        return {"head": "ctc", "n_mels": self.n_mels, "n_outputs": len(self.vocabulary)}

    def encode(self, text: str) -> list[int]:
        return [self._ids[tok] for tok in (text if self.units == "chars" else text.split())]

    def decode(self, ids: list[int]) -> str:
        return decode_ids(ids, self.vocabulary, self.units)

    def _targets(self, texts: list[str]) -> Batch:
        labels = [torch.tensor(self.encode(t)) for t in texts]
        targets = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True)  # (b, L), padded with the blank
        return {"targets": targets, "target_lengths": torch.tensor([len(y) for y in labels])}

    def check_model(self, model) -> None:
        """Before step 1: CTC reads a transcript of L labels (r of them repeats of the one before) from at least
        L + r output frames. A split where none has them: refused; some: a warning with the count (they add
        nothing to the loss, and a batch of only such utterances stops the run)."""
        short, example = {}, ""
        for split, utts in self.data.items():
            have = model.output_lengths(utts.lengths)  # (n,) output frames t'
            need = torch.tensor([ctc_frames_needed(self.encode(t)) for t in utts.texts])  # (n,)
            short[split] = int((have < need).sum())
            if short[split] and not example:
                i = int((have < need).nonzero()[0])
                example = f"e.g. {utts.texts[i]!r} needs {int(need[i])} and has {int(have[i])}"
        hint = "use shorter transcripts (units='words'), longer recordings or a model that subsamples less"
        for split, k in short.items():
            if k == len(self.data[split]):
                raise ValueError(
                    f"speech_ctc: none of the {k} {split} utterances has as many output frames as its "
                    f"transcript needs (its labels plus their repeats): {example}; {hint}"
                )
        if any(short.values()):
            log.warning(
                "speech_ctc: %s utterance(s) have fewer output frames than their transcripts need (%s): they "
                "add nothing to the loss, and a batch of only such utterances stops the run; %s",
                ", ".join(f"{k} of {len(self.data[s])} {s}" for s, k in short.items() if k),
                example,
                hint,
            )

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        dev = model_device(model)
        x, mask = batch["x"].to(dev), batch["mask"].to(dev)
        logits = model(x, mask=mask)
        lengths = model.output_lengths(mask.sum(1))  # (b,) frames t' of each utterance
        shape = (x.size(0), int(lengths.max()), len(self.vocabulary))
        logits = check_output("speech_ctc", logits, shape, "per-frame logits (b, t', v)")
        log_probs = logits.float().log_softmax(-1)  # (b, t', v)
        targets, target_lengths = batch["targets"].to(dev), batch["target_lengths"].to(dev)
        nll = F.ctc_loss(
            log_probs.transpose(0, 1),  # (t', b, v), as torch wants
            targets,
            lengths,
            target_lengths,
            blank=0,
            reduction="none",
            zero_infinity=True,  # an utterance too short for its label (t' < L + repeats): no loss, no gradient
        )  # (b,)
        fits = torch.tensor(
            [ctc_frames_needed(y[:n].tolist()) for y, n in zip(targets, target_lengths, strict=True)]
        )
        fits = fits.to(dev) <= lengths
        if not fits.any():  # its loss would read 0, a perfect score
            raise ValueError(
                f"speech_ctc: no utterance of this batch has as many output frames as its transcript needs "
                f"(output frames {lengths.tolist()}, transcript lengths {target_lengths.tolist()}); shorten the "
                "transcripts or lengthen the recordings"
            )
        nll = (nll / target_lengths.clamp_min(1))[fits].mean()  # torch's "mean", over the utterances that fit
        return nll, {"loss": nll.item()}, None

    @torch.no_grad()
    def predict(self, model, x: Tensor, mask: Tensor) -> list[tuple[str, str]]:
        """(greedy transcript, beam-search transcript) per utterance (the beam's is greedy's at beam_size 1)."""
        return transcribe_batch(model, x, mask, self.vocabulary, self.units, self.beam_size)

    def _scores(self, texts: list[str], predictions: list[tuple[str, str]]) -> dict[str, float]:
        from seqlab.tasks.speech_decode import error_rates

        out = error_rates(texts, [g for g, _ in predictions])
        out["exact"] = sum(g == t for (g, _), t in zip(predictions, texts, strict=True)) / len(texts)
        if self.beam_size > 1:
            out.update({f"beam_{k}": v for k, v in error_rates(texts, [b for _, b in predictions]).items()})
        return out
