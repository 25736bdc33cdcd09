r"""Caption metrics computed by the field's reference libraries: BLEU-4 (sacrebleu) and CIDEr-D (pycocoevalcap).

Inputs: ``hypotheses`` is one caption per image; ``references`` one list of reference captions per image,
the lists may differ in length. Captions are compared as whitespace-separated tokens, case-sensitively:
lowercase and tokenize them (split punctuation off) before calling, as the COCO evaluation does with its
PTB tokenizer; nothing is normalized here.

BLEU-4 (Papineni et al. 2002), corpus level, 0..100: sacrebleu's ``BLEU`` with ``tokenize="none"`` (the
captions are already tokens) and its defaults otherwise, i.e. n-gram orders 1..4, clipped counts summed
over the corpus, brevity penalty from the reference length closest to each hypothesis, and "exp"
smoothing (an order with no match counts precision 1 / (2^k · total), the k-th such order), which only
matters when some order has no match anywhere in the corpus.

CIDEr-D (Vedantam, Zitnick & Parikh 2015, arXiv:1411.5726, Sec. 3-4): ``pycocoevalcap.cider.Cider``, the
implementation behind the COCO caption leaderboard (pure Python; its Java-based tokenizer, METEOR and
SPICE are not used). For each image i, n-gram order n in 1..4 and reference s_ij:

    g^n(s)     tf-idf vector of the n-grams of s: tf(w, s) · log(N / max(1, df(w)))
    CIDEr-D_n  = 10/m_i Σ_j exp(-(l(c_i) - l(s_ij))² / (2σ²)) · (min(g^n(c_i), g^n(s_ij)) · g^n(s_ij))
                 / (‖g^n(c_i)‖ ‖g^n(s_ij)‖)           with σ = 6; min is elementwise (the "clipping")
    CIDEr-D    = mean over n of CIDEr-D_n, then mean over the N images

where df(w) counts the images whose references contain w, m_i is the number of references of image i,
and l is a length. The idf comes from the references of the evaluated set itself, so the score depends
on the whole set: an n-gram in every image's references weighs 0, and a single image scores 0 whatever
its caption. (The library measures l in bigrams, words - 1, which gives the same differences.)
"""

from __future__ import annotations

from collections.abc import Sequence

from seqlab.tasks.base import MissingDependencyError

__all__ = ["bleu4", "caption_scores", "cider_d"]

PYCOCOEVALCAP_INSTALL = "pip install pycocoevalcap"


def _check(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
    """One string per image, a non-empty list of non-empty reference strings per image."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise ValueError("hypotheses and references must be lists (one entry per image), got a string")
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses but {len(references)} reference lists")
    if not hypotheses:
        raise ValueError("caption metrics need at least one hypothesis")
    for i, (hyp, refs) in enumerate(zip(hypotheses, references, strict=True)):
        if not isinstance(hyp, str):
            raise ValueError(f"hypothesis {i} must be a string, got {type(hyp).__name__}")
        if isinstance(refs, str) or not refs:
            raise ValueError(f"references[{i}] must be a non-empty list of strings, got {refs!r}")
        if any(not isinstance(r, str) or not r.strip() for r in refs):
            raise ValueError(f"references[{i}] holds an empty or non-string reference: {list(refs)!r}")


def bleu4(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU-4 in 0..100 through sacrebleu; images may have different numbers of references."""
    from sacrebleu.metrics import BLEU

    _check(hypotheses, references)
    # sacrebleu takes reference *streams*: stream j holds every image's j-th reference, None where an image
    # has fewer than j + 1 (sacrebleu drops the Nones per image).
    n_streams = max(len(refs) for refs in references)
    streams = [[refs[j] if j < len(refs) else None for refs in references] for j in range(n_streams)]
    bleu = BLEU(tokenize="none", force=True)  # force: no warning about tokenized periods, they are wanted
    return float(bleu.corpus_score(list(hypotheses), streams).score)


def cider_d(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean CIDEr-D over the images (about 0..10) through pycocoevalcap; idf from these references."""
    try:
        from pycocoevalcap.cider.cider import Cider
    except ImportError as e:
        raise MissingDependencyError(
            f"CIDEr-D needs pycocoevalcap. Install it with: {PYCOCOEVALCAP_INSTALL}"
        ) from e
    _check(hypotheses, references)
    gts = {i: list(refs) for i, refs in enumerate(references)}
    res = {i: [hyp] for i, hyp in enumerate(hypotheses)}
    score, _ = Cider(n=4, sigma=6.0).compute_score(gts, res)
    return float(score)


def caption_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """``{"bleu4": corpus BLEU-4 (0..100), "cider_d": mean CIDEr-D}`` of the hypotheses."""
    return {"bleu4": bleu4(hypotheses, references), "cider_d": cider_d(hypotheses, references)}
