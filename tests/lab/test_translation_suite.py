"""The translation suite's parts: width matching, BLEU by source length, the table and the plot."""

from __future__ import annotations

import pytest
import torch

from seqlab.lab.translation import BUCKETS, CONTENDERS, bucket_scores, match_width, write_plot, write_table
from seqlab.models import count_parameters, create
from seqlab.tasks import create_task


@pytest.mark.parametrize("label", ["no attention", "Bahdanau", "Luong"])
def test_rnn_contenders_are_matched_to_the_transformer(label):
    vocab = 2000
    target = count_parameters("transformer-small", vocab_size=vocab, **CONTENDERS["Transformer"][1])
    preset, fields = CONTENDERS[label]
    d = match_width(preset, fields, target, vocab)
    assert d % 8 == 0
    assert abs(count_parameters(preset, vocab_size=vocab, d_model=d, **fields) / target - 1) < 0.03


def test_bucket_scores_cover_every_test_sentence_once(tmp_path):
    lines = [
        f"{' '.join(['word'] * n)} {i}\t{' '.join(['palabra'] * n)} {i}" for i in range(60) for n in (3, 14)
    ]
    path = tmp_path / "p.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    task = create_task("translation", source=str(path), vocab_size=300)
    torch.manual_seed(0)
    model = create("test-seq2seq", **task.model_overrides())
    scores = bucket_scores(task, model, beam_size=2)
    assert sum(b["sentences"] for b in scores["buckets"].values()) == scores["sentences"] == task.test_pairs
    assert set(scores["buckets"]) <= {f"{lo}-{hi}" for lo, hi in BUCKETS}
    assert 0 <= scores["bleu"] <= 100 and len(scores["examples"]) == 3


def test_table_and_plot_from_records(tmp_path):
    records = [
        {
            "label": label,
            "fields": {"d_model": 16},
            "params": 1000 + i,
            "steps": 10,
            "train_minutes": 1.0,
            "val_nll": 3.0,
            "bleu": 5.0 + i,
            "chrf": 20.0,
            "buckets": {"1-10": {"bleu": 4.0 + i, "sentences": 3}, "11-20": {"bleu": 3.0, "sentences": 2}},
        }
        for i, label in enumerate(CONTENDERS)
    ]
    table = write_table(tmp_path, records, 1.0).read_text(encoding="utf-8")
    assert "| Luong | 16 | 1,002 | 10 | 1.0 | 3.000 | 7.00 | 20.0 | 6.0 | 3.0 |" in table
    assert write_plot(tmp_path, records).stat().st_size > 1000


def test_a_finished_contender_is_read_back_with_its_own_settings(tmp_path, monkeypatch):
    """Running the suite again reuses a finished run: no new calibration that could ask for fewer steps than
    the checkpoint holds, the same step count and the run untouched."""
    from seqlab.lab import translation

    lines = [
        f"{' '.join(['word'] * n)} {i}\t{' '.join(['palabra'] * n)} {i}" for i in range(40) for n in (2, 5)
    ]
    path = tmp_path / "p.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(translation, "TASK", {"name": "translation", "source": str(path), "vocab_size": 300})
    fields = {"d_model": 16, "dropout": 0.0, "max_src_len": 64}
    first = translation._run("Bahdanau", fields, tmp_path, minutes=0.01, seed=0)
    steps = first["steps"]  # the calibration's floor of 50, or more on a fast machine
    assert steps >= 50 and first["summary"]["step"] == steps
    latest = (tmp_path / "runs" / "bahdanau" / "latest").read_text()

    def no_calibration(*args, **kwargs):
        raise AssertionError("a finished run was calibrated again")

    monkeypatch.setattr(translation, "_planned", no_calibration)
    import logging

    torch.set_num_threads(2)  # a run in this process trains on its own thread count, then gives this one back
    try:
        again = translation._run("Bahdanau", fields, tmp_path, minutes=0.01, seed=0)
        assert torch.get_num_threads() == 2 and logging.getLogger("seqlab.train").level != logging.WARNING
    finally:
        torch.set_num_threads(1)
    assert again["steps"] == steps and again["summary"]["step"] == steps and again["threads"] == 1
    assert (tmp_path / "runs" / "bahdanau" / "latest").read_text() == latest
    # asked for with other settings, the finished run is an error, not a score under the new settings' name
    with pytest.raises(
        ValueError, match=r"other settings than this compare asks for \(minutes 0.01 -> 5.0\)"
    ):
        translation._run("Bahdanau", fields, tmp_path, minutes=5.0, seed=0)
