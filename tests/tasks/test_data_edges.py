"""Edges of users' data that gave wrong numbers or failed late: caption references scored in the vocabulary's
form, splits of a user's files that do not move with the training seed, repeated clips, empty evaluation
splits, stray image folders, non-finite series values and samples, speakers named on some rows only, and the
last character of a text."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from seqlab.tasks import create_task
from seqlab.tasks.clip_files import read_clip_folder
from seqlab.tasks.corpus import read_text_file
from seqlab.tasks.series_data import macro_f1
from seqlab.tasks.speech_data import read_wav, split_by_speaker
from seqlab.tasks.text import CharLMTask
from seqlab.tasks.translation import TranslationTask


def _caption_folder(folder, n=20):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (10, 10, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        rows.append({"image": f"img{i}.png", "caption": f"A Red ladybug, number {i % 3}!"})
    captions = folder / "captions.jsonl"
    captions.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    return str(captions)


def test_a_caption_equal_to_its_reference_scores_full_marks_whatever_the_case_and_punctuation(tmp_path):
    task = create_task("captioning", source="folder", captions=_caption_folder(tmp_path), image_size=16)
    refs = task.references("test")
    assert refs[0][0][0] == "A" and refs[0][0].endswith("!")  # the references as the file gives them
    perfect = [task.decode(task.encode(r[0])) for r in refs]  # what a model emitting each caption decodes to
    assert perfect[0].startswith("a red ladybug ,")
    task.caption = lambda model, images, beam_size=1: perfect[: len(images)]
    scores = task.score(model=None, split="test")
    assert scores["bleu4"] == pytest.approx(100.0)


def test_a_users_files_split_the_same_way_for_every_seed(tmp_path):
    captions = _caption_folder(tmp_path)
    a, b = (
        create_task("captioning", source="folder", captions=captions, image_size=16, seed=s) for s in (0, 1)
    )
    assert torch.equal(a.images("test"), b.images("test"))
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"word{i} one\tmot{i} un\n" for i in range(60)), encoding="utf-8")
    t0, t1 = (TranslationTask(source=str(tsv), vocab_size=300, seed=s) for s in (0, 1))
    assert t0.pairs("test") == t1.pairs("test")


def test_captioning_evaluation_counts_each_image_once(tmp_path):
    task = create_task(
        "captioning", source="folder", captions=_caption_folder(tmp_path, 30), image_size=16, batch_size=2
    )
    n = len(task.references("val"))
    assert n % 2 == 1  # the last batch wraps around
    seen = []
    task.loss = lambda model, batch, state=None: (None, {"nll": 1.0, "acc": 0.5}, seen.append(batch["index"]))
    task.score = lambda model, split, limit=None: {}
    task.evaluate(torch.nn.Linear(1, 1), split="val")
    rows = torch.cat(seen).tolist()
    assert sorted(rows) == list(range(n))


def test_a_clip_named_twice_in_labels_csv_is_refused(tmp_path):
    for name in ("c0", "c1"):
        np.save(tmp_path / f"{name}.npy", np.zeros((4, 8, 8), dtype=np.uint8))
    (tmp_path / "labels.csv").write_text(
        "clip,caption\nc0,a dog\nc1,a cat\nc0,a dog runs\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"line 4: clip 'c0' is named again \(first at line 2\)"):
        read_clip_folder(tmp_path)


def test_translation_refuses_a_file_too_small_for_validation_and_test(tmp_path):
    tsv = tmp_path / "two_groups.tsv"
    tsv.write_text("".join(f"w{i}\tm{i}\t{'ab'[i % 2]}\n" for i in range(40)), encoding="utf-8")
    with pytest.raises(ValueError, match=r"the val split .* is empty: its pairs make 2 distinct groups"):
        TranslationTask(source=str(tsv), vocab_size=300)


def _class_folder(root, classes, per_class):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (6, 6), (i * 20, 0, 0)).save(root / c / f"{i}.png")


def test_an_image_folder_skips_hidden_folders_and_refuses_a_class_without_images(tmp_path):
    _class_folder(tmp_path, ["cat", "dog"], 5)  # 10 images: the default validation split still holds one
    (tmp_path / ".ipynb_checkpoints").mkdir()
    task = create_task("image_classification", source="folder", data_dir=str(tmp_path), image_size=8)
    assert task.classes == ["cat", "dog"] and task.n_val == 1
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\['notes'\] hold no image"):
        create_task("image_classification", source="folder", data_dir=str(tmp_path), image_size=8)


def test_folder_images_are_shifted_over_their_white_canvas(tmp_path):
    _class_folder(tmp_path, ["a", "b"], 6)
    task = create_task("image_classification", source="folder", data_dir=str(tmp_path), image_size=8, shift=3)
    x = task._augment(torch.full((8, 3, 8, 8), 0.5), torch.Generator().manual_seed(0))
    assert set(x.unique().tolist()) <= {0.5, 1.0} and (x == 1.0).any()


def test_a_series_with_an_infinite_value_is_refused_where_it_is(tmp_path):
    path = tmp_path / "inf.csv"
    values = [str(np.sin(i / 5)) for i in range(200)]
    values[179] = "Infinity"
    path.write_text("value\n" + "\n".join(values) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"holds inf at data row 180 \(line 181 of the file\)"):
        create_task("forecast", source=str(path), column="value", context=12, horizon=4)


def test_macro_f1_leaves_out_classes_absent_from_the_split():
    truth = np.array([0, 0, 2, 2])
    assert macro_f1(truth.copy(), truth, n_classes=4) == 1.0  # classes 1 and 3 never occur
    assert macro_f1(np.array([0, 1, 2, 2]), truth, n_classes=4) == pytest.approx((2 / 3 + 0 + 1) / 3)


def test_speakers_named_on_some_rows_only_are_refused_and_a_nan_sample_too(tmp_path):
    with pytest.raises(ValueError, match=r"12 of the 13 utterances name a speaker but utterance 13"):
        split_by_speaker(["alice"] * 4 + ["bob"] * 4 + ["carol"] * 4 + [""], 0)
    import soundfile as sf

    wave = (0.3 * np.sin(np.arange(8000) / 5)).astype(np.float32)
    wave[100] = np.nan
    sf.write(tmp_path / "nan.wav", wave, 16000, subtype="FLOAT")
    with pytest.raises(ValueError, match=r"nan\.wav holds 1 non-finite"):
        read_wav(tmp_path / "nan.wav", 16000)
    sf.write(tmp_path / "nan8k.wav", wave, 8000, subtype="FLOAT")  # counted as stored, not after resampling
    with pytest.raises(ValueError, match=r"nan8k\.wav holds 1 non-finite"):
        read_wav(tmp_path / "nan8k.wav", 16000)


def test_audio_too_short_or_too_slowly_sampled_for_speech_is_refused(tmp_path):
    import soundfile as sf

    sf.write(tmp_path / "one.wav", np.array([0.5], dtype=np.float32), 16000, subtype="FLOAT")
    with pytest.raises(ValueError, match=r"one\.wav is 0\.1 ms long \(1 samples at 16000 Hz\): too short"):
        read_wav(tmp_path / "one.wav", 16000)
    tone = (0.3 * np.sin(np.arange(4000) / 5)).astype(np.float32)
    sf.write(tmp_path / "slow.wav", tone, 2000, subtype="FLOAT")
    with pytest.raises(ValueError, match=r"slow\.wav is sampled at 2000 Hz: speech needs at least 4000 Hz"):
        read_wav(tmp_path / "slow.wav", 16000)
    sf.write(tmp_path / "ok.wav", tone[:1600], 16000, subtype="FLOAT")  # 0.1 s: long enough
    assert read_wav(tmp_path / "ok.wav", 16000).shape == (1600,)


def test_random_windows_reach_the_last_character(tmp_path):
    path = tmp_path / "alphabet.txt"
    path.write_text("abcdefghijklmnopqrstuvwxyz" * 4, encoding="utf-8")
    task = CharLMTask(str(path), seq_len=4, batch_size=64, sampling="random", val_fraction=0.2)
    data = task.val_data
    last = data[-1].item()
    targets = torch.cat([task.get_batch("val", i)["y"][:, -1] for i in range(20)])
    assert (targets == last).any()


def test_every_spelling_of_utf8_drops_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffhello".encode())
    assert read_text_file(path, encoding="U8") == "hello"


def test_translation_says_when_max_len_leaves_evaluation_pairs_out(tmp_path, caplog):
    tsv = tmp_path / "pairs.tsv"
    long = " ".join(f"w{j}" for j in range(40))
    tsv.write_text("".join(f"a{i} {long if i % 2 else ''}\tb{i}\n" for i in range(200)), encoding="utf-8")
    with caplog.at_level("WARNING", logger="seqlab.tasks"):
        task = TranslationTask(source=str(tsv), vocab_size=300, max_len=16)
    assert "max_len=16 leaves out" in caplog.text and "raise task.max_len to score every pair" in caplog.text
    assert task.dropped_long > 0


def test_float_and_32_bit_images_are_scaled_by_their_range_not_clipped(tmp_path):
    from seqlab.tasks.image_files import _open_rgb

    ramp = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(8, 8)
    for name, values, mode in (("unit.tif", ramp, "F"), ("wide.tif", (ramp * 65535).astype(np.int32), "I")):
        Image.fromarray(values, mode=mode).save(tmp_path / name)
        got = np.asarray(_open_rgb(tmp_path / name))[..., 0]
        assert got.min() == 0 and got.max() == 255  # was black for [0, 1] floats (Pillow clips, no scaling)
    Image.fromarray(ramp - 0.5, mode="F").save(tmp_path / "negative.tif")
    with pytest.raises(ValueError, match=r"negative.tif: a mode 'F' image with values from -0.5"):
        _open_rgb(tmp_path / "negative.tif")
