"""The captioning suite's parts: matched parameter counts, one contender trained and scored in this process,
the table, the plot and the attention figures."""

from __future__ import annotations

import pytest

from seqlab.lab import captioning
from seqlab.models import count_parameters


@pytest.mark.parametrize("label", list(captioning.CONTENDERS))
def test_contenders_are_matched_to_show_attend_tell(label):
    fields = captioning.plan()
    size = {"vocab_size": 21, "image_size": 64}
    target = count_parameters(
        captioning.CONTENDERS[captioning.REFERENCE][0], **size, **fields[captioning.REFERENCE]
    )
    got = count_parameters(captioning.CONTENDERS[label][0], **size, **fields[label])
    assert abs(got / target - 1) < 0.03


def test_the_grammar_has_the_vocabulary_the_plan_assumes():
    from seqlab.tasks.captioning import CaptioningTask

    assert CaptioningTask(image_size=32, n_train=400, n_eval=4).vocab_size == 21


def test_a_tiny_suite_trains_scores_and_reports(tmp_path, monkeypatch):
    tiny = {
        "name": "captioning",
        "source": "scenes",
        "image_size": 32,
        "batch_size": 8,
        "n_train": 48,
        "n_eval": 6,
    }
    monkeypatch.setattr(captioning, "TASK", tiny)
    monkeypatch.setattr(
        captioning,
        "CONTENDERS",
        {
            "Show and Tell": ("test-show-tell", {}),
            "Show, Attend and Tell": ("test-show-attend-tell", {}),
            "ViT + Transformer": ("test-vit-captioner", {"patch_size": 8}),
        },
    )
    from seqlab.lab.translation import _run
    from seqlab.run import build_task

    task = build_task({"task": {**tiny, "seed": 0}})
    records = []
    for label, (_, fields) in captioning.CONTENDERS.items():
        trained = _run(label, fields, tmp_path, 0.001, 0, captioning._planned)  # in process: the patches hold
        assert trained["steps"] == 50 == trained["summary"]["step"]
        records.append(captioning._score(label, fields, trained, task, tmp_path, beam_size=2))
    for r in records:
        for split in ("test", "heldout"):
            assert 0 <= r[split]["exact"] <= 1 and 0 <= r[split]["bleu4"] <= 100
    table = captioning.write_table(tmp_path, records, 0.001, 2).read_text(encoding="utf-8")
    assert table.count("\n| ") == 4 and "Show, Attend and Tell" in table
    assert captioning.write_plot(tmp_path, records).stat().st_size > 1000
    figures = captioning.write_attention(tmp_path, task, 0)
    assert len(figures) == 2 and all(p.stat().st_size > 1000 for p in figures.values())
