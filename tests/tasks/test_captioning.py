"""The captioning task: batches, the loss with Show-Attend-Tell's regularization, scores of decoded captions,
the file sources, and a golden tiny training run on generated scenes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from seqlab.models import create
from seqlab.tasks import create_task
from seqlab.tasks.captioning import BOS, EOS, PAD, CaptioningTask
from seqlab.tasks.image_files import TUXPAINT_DIR


@pytest.fixture(scope="module")
def task() -> CaptioningTask:
    return CaptioningTask(image_size=32, n_train=300, n_eval=40, batch_size=16)


def _model(task, name="test-show-attend-tell", **over):
    torch.manual_seed(0)
    return create(name, **{**task.model_overrides(), "channels": [8, 16], **over})


def test_batches_hold_the_caption_between_bos_and_eos(task):
    batch = task.get_batch("train", 3)
    assert batch["images"].shape == (16, 3, 32, 32) and batch["images"].dtype == torch.float32
    for i in range(16):
        caption = task.references("train")[int(batch["index"][i])][0]
        ids = task.encode(caption)
        n = len(ids)
        assert batch["tgt_in"][i, : n + 1].tolist() == [BOS, *ids]
        assert batch["tgt_out"][i, : n + 1].tolist() == [*ids, EOS]
        assert (batch["tgt_in"][i, n + 1 :] == PAD).all() and (batch["tgt_out"][i, n + 1 :] == PAD).all()
        assert task.decode(batch["tgt_out"][i]) == caption
    again = task.get_batch("train", 3)
    assert torch.equal(again["images"], batch["images"]) and torch.equal(again["tgt_in"], batch["tgt_in"])


def test_one_epoch_shows_every_training_scene_once(task):
    seen = torch.cat([task.get_batch("train", i)["index"] for i in range(300 // 16)])
    assert len(set(seen.tolist())) == len(seen)


def test_the_loss_adds_the_doubly_stochastic_penalty_of_the_real_words(task):
    model = _model(task, attention_penalty=0.5)
    batch = task.get_batch("val", 0)
    loss, metrics, _ = task.loss(model, batch)
    logits, alpha = model(batch["images"], batch["tgt_in"], return_attention=True)
    real = batch["tgt_out"] != PAD
    coverage = (alpha * real.unsqueeze(-1)).sum(1)  # (b, L): Σ over the real words only
    reg = ((1 - coverage) ** 2).mean()
    nll = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD
    )
    torch.testing.assert_close(loss, nll + 0.5 * reg, rtol=1e-5, atol=1e-6)
    assert metrics["attention_reg"] == pytest.approx(reg.item(), rel=1e-5)
    no_penalty = _model(task, "test-show-tell")
    _, metrics, _ = task.loss(no_penalty, batch)
    assert "attention_reg" not in metrics and metrics["loss"] == pytest.approx(metrics["nll"])


def test_scores_of_the_references_themselves_are_perfect(task, monkeypatch):
    refs = [r[0] for r in task.references("val")]
    monkeypatch.setattr(task, "caption", lambda model, images, beam_size=1: refs[: len(images)])
    scores = task.score(None, "val")
    assert scores["exact"] == 1.0 and scores["parsed"] == 1.0 and scores["bleu4"] == pytest.approx(100.0)


def test_evaluate_reports_token_and_caption_metrics(task):
    metrics = task.evaluate(_model(task), max_batches=2, split="heldout")
    for key in ("nll", "ppl", "acc", "bleu4", "cider_d", "exact", "colour", "shape", "size", "parsed"):
        assert f"heldout_{key}" in metrics
    with pytest.raises(ValueError, match="split must be one of"):
        task.evaluate(_model(task), split="dev")


def test_golden_show_attend_tell_learns_single_object_scenes():
    """100 steps on 1,500 one-object 32×32 scenes: the captions read back right (measured: exact 0.96)."""
    torch.manual_seed(0)
    task = CaptioningTask(image_size=32, n_train=1500, n_eval=100, max_objects=1, batch_size=32)
    model = create("test-show-attend-tell", **{**task.model_overrides(), "channels": [16, 32]})
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for i in range(100):
        loss, _, _ = task.loss(model, task.get_batch("train", i))
        opt.zero_grad()
        loss.backward()
        opt.step()
    scores = task.score(model, "val")
    assert scores["exact"] >= 0.8, scores


def _write_images(folder, n):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        path = folder / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (12 + i, 10, 3), dtype=np.uint8)).save(path)
        rows.append({"image": path.name, "caption": f"Picture number {i % 3}."})
    return rows


def test_a_captions_file_gives_an_image_split_with_every_caption_as_reference(tmp_path):
    rows = _write_images(tmp_path, 12)
    rows.append({"image": "img0.png", "caption": "Another caption"})
    captions = tmp_path / "captions.jsonl"
    captions.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    task = create_task("captioning", source="folder", captions=str(captions), image_size=16, batch_size=4)
    assert sum(task.n_images.values()) == 12 and task.n_images["train"] == 9
    assert "heldout" not in task.splits()
    all_refs = [refs for split in task.splits() for refs in task.references(split)]
    assert sorted(all_refs, key=len)[-1] == ["Picture number 0.", "Another caption"]
    assert task.images("train").shape == (9, 3, 16, 16)
    assert task.decode(task.encode("picture number 2 .")) == "picture number 2 ."


def test_a_captions_file_naming_missing_images_fails_before_any_work(tmp_path):
    captions = tmp_path / "c.csv"
    captions.write_text("image,caption\nnothere.png,a cat\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"nothere\.png"):
        create_task("captioning", source="folder", captions=str(captions))
    with pytest.raises(ValueError, match="captions=PATH"):
        create_task("captioning", source="folder")


def test_tuxpaint_stamps_are_a_captioning_source():
    import os

    if not os.path.isdir(TUXPAINT_DIR):
        pytest.skip(
            "Tux Paint stamps not installed: apt-get install -y --no-install-recommends tuxpaint-stamps-default"
        )
    task = create_task("captioning", source="tuxpaint", image_size=32)
    total = sum(task.n_images.values())
    assert 500 < total < 1000
    assert task.images("val").shape[1:] == (3, 32, 32)
    assert task.vocab_size > 200


def test_a_captions_file_without_the_folder_source_is_refused(tmp_path):
    """The generated scenes trained instead, the file ignored."""
    for source in ("scenes", "tuxpaint"):
        with pytest.raises(
            ValueError, match=rf"captions=PATH belongs to source='folder' \(this run has source='{source}'\)"
        ):
            CaptioningTask(source=source, captions=str(tmp_path / "my.csv"))
