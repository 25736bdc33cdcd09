"""Caption metrics: sacrebleu's BLEU-4 and pycocoevalcap's CIDEr-D, checked against values worked out by hand
from the metrics' definitions (which shows the libraries are called the right way)."""

from __future__ import annotations

import math

import pytest

from seqlab.tasks.caption_metrics import bleu4, caption_scores, cider_d

pytest.importorskip("pycocoevalcap.cider.cider", reason="pip install pycocoevalcap")


def test_identical_captions_score_bleu_100():
    refs = [["a small red circle above a large blue square"], ["a large green triangle"]]
    assert bleu4([r[0] for r in refs], refs) == pytest.approx(100.0)


def test_bleu_by_hand_with_brevity_penalty_and_uneven_reference_counts():
    hyps = ["a red circle above a blue square", "a green circle"]
    refs = [
        ["a red circle above a blue square", "a blue square below a red circle"],
        ["a small green circle"],
    ]
    # Corpus counts (clipped matches / hypothesis n-grams), summed over both images:
    #   1-grams 7/7 + 3/3 = 10/10;  2-grams 6/6 + 1/2 ("green circle") = 7/8
    #   3-grams 5/5 + 0/1 = 5/6;    4-grams 4/4 + 0/0 = 4/4
    # Lengths: hypotheses 7 + 3 = 10, closest references 7 + 4 = 11 -> BP = exp(1 - 11/10).
    # No order is without a match, so sacrebleu's default "exp" smoothing does not act.
    expected = 100 * math.exp(1 - 11 / 10) * (1 * 7 / 8 * 5 / 6 * 1) ** (1 / 4)
    assert bleu4(hyps, refs) == pytest.approx(expected, rel=1e-9)


def test_bleu_exp_smoothing_when_an_order_has_no_match():
    # sacrebleu's README example: 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3, same length (BP 1).
    # "exp" smoothing (mteval-v13a, Chen & Cherry 2014 method 3) scores the first empty order 1 / (2 * 3).
    expected = 100 * (5 / 6 * 3 / 5 * 1 / 4 * 1 / 6) ** (1 / 4)  # = 100 * 48 ** -0.25 = 37.99
    assert bleu4(["the cat sat on the mat"], [["the cat is on the mat"]]) == pytest.approx(expected, rel=1e-9)


def test_cider_d_by_hand_on_three_images():
    hyps = ["a red circle", "a blue blue circle", "a blue square"]
    refs = [["a red circle"], ["a blue circle"], ["a blue square", "a square"]]
    # idf(w) = log(N / max(1, df(w))) with N = 3 images and df counted over each image's references:
    #   "a": 3 images -> 0;  "circle", "blue", "a blue": 2 -> log 1.5;  every other n-gram: 1 (or 0) -> log 3
    l3, l15 = math.log(3), math.log(1.5)
    gauss = math.exp(-(1**2) / (2 * 6.0**2))  # length penalty for a one-word difference, sigma = 6
    # image 1: hypothesis = reference: cosine 1 for n = 1, 2, 3; no 4-grams: 0.
    image1 = 10 * (1 + 1 + 1 + 0) / 4
    # image 2, "a blue blue circle" vs "a blue circle" (one word longer):
    #   n=1: hyp (a 0, blue 2·l15, circle l15), ref (a 0, blue l15, circle l15); clipping min(2·l15, l15) = l15
    cos1 = (l15 * l15 + l15 * l15) / (math.sqrt(5) * l15 * math.sqrt(2) * l15)
    #   n=2: hyp (a blue l15, blue blue l3, blue circle l3), ref (a blue l15, blue circle l3)
    cos2 = (l15**2 + l3**2) / (math.sqrt(l15**2 + 2 * l3**2) * math.sqrt(l15**2 + l3**2))
    #   n=3: no trigram in common; n=4: the reference has none
    image2 = 10 * gauss * (cos1 + cos2 + 0 + 0) / 4
    # image 3, two references averaged: "a blue square" itself (1, 1, 1, 0), and "a square" (one word
    # shorter): n=1 hyp (a 0, blue l15, square l3), ref (a 0, square l3); no common bigram; no trigram
    cos_short = l3**2 / (math.sqrt(l15**2 + l3**2) * l3)
    image3 = 10 / 2 * ((1 + 1 + 1 + 0) / 4 + gauss * (cos_short + 0 + 0 + 0) / 4)
    expected = (image1 + image2 + image3) / 3
    assert cider_d(hyps, refs) == pytest.approx(expected, rel=1e-12)
    assert caption_scores(hyps, refs)["cider_d"] == pytest.approx(expected, rel=1e-12)


def test_cider_d_idf_comes_from_the_evaluated_set():
    # One image: every reference n-gram occurs in all (1) images, so every weight is log(1/1) = 0.
    assert cider_d(["a red circle"], [["a red circle"]]) == 0.0
    # Disjoint images, perfect 3-word captions: cosine 1 for n = 1..3, nothing for n = 4.
    caps = ["a red circle", "the blue square", "one green triangle"]
    assert cider_d(caps, [[c] for c in caps]) == pytest.approx(10 * 3 / 4)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="got 2 hypotheses but 1 reference lists"):
        bleu4(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="got 1 hypotheses but 2 reference lists"):
        cider_d(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError, match="at least one hypothesis"):
        caption_scores([], [])
    with pytest.raises(ValueError, match=r"references\[1\] must be a non-empty list"):
        bleu4(["a", "b"], [["a"], []])
    with pytest.raises(ValueError, match=r"references\[0\] holds an empty"):
        cider_d(["a"], [["  "]])
    with pytest.raises(ValueError, match="got a string"):
        bleu4("a red circle", [["a red circle"]])
