r"""Reading CTC posteriors: greedy decoding, prefix beam search, and the error rates of transcripts.

Notation: ``t`` frames, ``v`` outputs (the blank, id 0, then the tokens), ``π`` a frame-level path, ``B`` the
CTC collapse (merge repeats, then drop blanks: B(aa∅ab) = aab).

CTC (Graves et al. 2006) scores a label sequence y by summing over every path that collapses to it:

    p(y | x) = Σ_{π : B(π) = y} Π_τ p(π_τ | x)

* greedy (best path): y = B(argmax_v p(v | x)_τ for each τ). It finds the most probable *path*, which need
  not belong to the most probable *sequence*: with p(∅) = 0.6, p(a) = 0.4 at both of two frames, the best
  path ∅∅ gives "" (p = 0.36), while "a" collects aa, a∅ and ∅a (p = 0.64).
* prefix beam search (Hannun et al. 2014, arXiv 1408.2873, without a language model): keeps the
  ``beam_size`` most probable prefixes, each with the probability of its paths ending in a blank and in a
  non-blank, summing (log-adding) the paths that merge into one prefix. Here it is flashlight's lexicon-free
  CTC decoder (``flashlight-text``, the one ``torchaudio.models.decoder.ctc_decoder`` wraps) with a zero
  language model and log-add merging: a sequence's score is the log of its summed path probability.

Error rates come from ``jiwer``: CER = (S + D + I) / N over characters, WER the same over words, both summed
over the corpus (not averaged per utterance).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import Tensor

from seqlab.tasks.base import MissingDependencyError, model_device

__all__ = [
    "beam_search",
    "ctc_frames_needed",
    "decode_ids",
    "error_rates",
    "greedy_decode",
    "transcribe_batch",
]

BLANK = 0


def _checked(log_probs: Tensor, lengths: Tensor | None) -> Tensor:
    """log_probs (b, t, v) floats and lengths (b,) integers in [0, t] (None: every t) -> lengths on the CPU."""
    if not isinstance(log_probs, Tensor) or log_probs.dim() != 3 or not log_probs.is_floating_point():
        got = (
            f"{log_probs.dtype} of shape {tuple(log_probs.shape)}"
            if isinstance(log_probs, Tensor)
            else type(log_probs).__name__
        )
        raise ValueError(f"expected log_probs (b, t, v) as floats, got {got}")
    b, t, _ = log_probs.shape
    if lengths is None:
        return torch.full((b,), t)
    ok = isinstance(lengths, Tensor) and lengths.shape == (b,) and not lengths.is_floating_point()
    if (
        not ok
        or lengths.dtype == torch.bool
        or (b and not 0 <= int(lengths.min()) <= int(lengths.max()) <= t)
    ):
        got = f"{lengths.dtype} {lengths.tolist()}" if isinstance(lengths, Tensor) else type(lengths).__name__
        raise ValueError(
            f"lengths must be (b,) = ({b},) integers in [0, t = {t}] (frames per item), got {got}"
        )
    return lengths.cpu()


def greedy_decode(log_probs: Tensor, lengths: Tensor | None = None) -> list[list[int]]:
    """log_probs (b, t, v) -> the collapsed best path of each item, token ids without blanks."""
    lengths = _checked(log_probs, lengths)
    best = log_probs.argmax(-1).cpu()  # (b, t)
    out = []
    for row, n in zip(best.tolist(), lengths.tolist(), strict=True):
        out.append([k for k, _ in itertools.groupby(row[:n]) if k != BLANK])
    return out


def _flashlight():
    try:
        from flashlight.lib.text import decoder
    except ImportError as e:
        raise MissingDependencyError(
            f"CTC beam search uses flashlight's decoder: pip install flashlight-text ({e})"
        ) from e
    return decoder


def beam_search(log_probs: Tensor, lengths: Tensor | None = None, beam_size: int = 8) -> list[list[int]]:
    """log_probs (b, t, v) -> the most probable label sequence of each item found by prefix beam search.

    The decoder needs a word-boundary ("silence") token; an extra output of probability ≈ 0 serves, so that
    the vocabulary's own tokens (a space among them) are all ordinary tokens.
    """
    lengths = _checked(log_probs, lengths)  # the decoder reads n frames of memory as told: n <= t
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    fl = _flashlight()
    b, t, v = log_probs.shape
    options = fl.LexiconFreeDecoderOptions(
        beam_size=beam_size,
        beam_size_token=v,
        beam_threshold=50.0,
        lm_weight=0.0,
        sil_score=0.0,
        log_add=True,  # merged hypotheses add their probabilities: a prefix beam search, not a Viterbi one
        criterion_type=fl.CriterionType.CTC,
    )
    decoder = fl.LexiconFreeDecoder(options, fl.ZeroLM(), v, BLANK, [])  # silence: the extra output v
    padded = torch.cat([log_probs.detach().float().cpu(), torch.full((b, t, 1), -1e4)], -1)  # (b, t, v + 1)
    out = []
    for i in range(b):
        n = int(lengths[i])
        emissions = np.ascontiguousarray(padded[i, :n].numpy(), dtype=np.float32)  # (n, v + 1)
        best = decoder.decode(emissions.ctypes.data, n, v + 1)[0]
        out.append([k for k, _ in itertools.groupby(best.tokens) if k not in (BLANK, v)])
    return out


def error_rates(references: list[str], hypotheses: list[str]) -> dict[str, float]:
    """{'cer', 'wer'} of the hypotheses against non-empty references, with jiwer."""
    try:
        import jiwer
    except ImportError as e:
        raise MissingDependencyError(f"error rates use jiwer: pip install jiwer ({e})") from e
    if not references or any(not r.strip() for r in references):
        raise ValueError("error rates need a non-empty reference transcript for every utterance")
    hyps = [h if h.strip() else "" for h in hypotheses]
    return {"cer": float(jiwer.cer(references, hyps)), "wer": float(jiwer.wer(references, hyps))}


def ctc_frames_needed(ids: list[int]) -> int:
    """The fewest frames CTC can emit the labels ``ids`` from: one each, and a blank between equal neighbours."""
    return len(ids) + sum(a == b for a, b in itertools.pairwise(ids))


def decode_ids(ids: list[int], vocabulary: list[str], units: str) -> str:
    """CTC label ids (no blanks) -> the normalized transcript."""
    tokens = [vocabulary[i] for i in ids]
    return " ".join(("".join(tokens) if units == "chars" else " ".join(tokens)).split())


@torch.no_grad()
def transcribe_batch(
    model, x: Tensor, mask: Tensor, vocabulary: list[str], units: str, beam_size: int = 8
) -> list[tuple[str, str]]:
    """Features (b, t, m) and mask -> (greedy, prefix-beam-search) transcripts of a CTC model."""
    dev = model_device(model)
    log_probs = model(x.to(dev), mask=mask.to(dev)).float().log_softmax(-1).cpu()  # (b, t', v)
    lengths = model.output_lengths(mask.sum(1)).cpu()
    greedy = [decode_ids(ids, vocabulary, units) for ids in greedy_decode(log_probs, lengths)]
    if beam_size <= 1:
        return list(zip(greedy, greedy, strict=True))
    beam = [decode_ids(ids, vocabulary, units) for ids in beam_search(log_probs, lengths, beam_size)]
    return list(zip(greedy, beam, strict=True))
