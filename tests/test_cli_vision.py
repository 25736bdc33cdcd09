"""The image commands end to end: train a tiny captioner on generated scenes and a tiny ViT on the digits
through `seqlab train`, then caption, draw the attention, evaluate; and the mistakes a user makes with them."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from seqlab.cli import main


def _train(out, *argv) -> None:
    common = ["--train.steps=4", "--train.eval_batches=1", "--train.progress=false", "--out", str(out)]
    assert main(["train", *argv, *common]) == 0


@pytest.fixture(scope="module")
def captioner(tmp_path_factory):
    out = tmp_path_factory.mktemp("caption") / "run"
    scenes = ["--task.name=captioning", "--task.image_size=32", "--task.n_train=64", "--task.n_eval=8"]
    _train(out, "--model.name=test-show-attend-tell", *scenes, "--task.batch_size=8")
    return out


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    out = tmp_path_factory.mktemp("vit") / "run"
    _train(out, "--model.name=test-vit", "--task.name=image_classification", "--task.source=digits")
    return out


def _vocabulary(run) -> list[str]:
    config = json.loads(next(run.glob("checkpoints/step-*/config.json")).read_text(encoding="utf-8"))
    return config["task"]["vocabulary"]


def test_caption_prints_words_of_the_vocabulary(captioner, capsys, tmp_path):
    assert main(["caption", "--checkpoint", str(captioner), "--scene", "heldout:2", "--beam", "2"]) == 0
    words = capsys.readouterr().out.split()
    assert set(words) <= set(_vocabulary(captioner))
    image = tmp_path / "scene.png"
    Image.fromarray(np.full((40, 30, 3), 60, dtype=np.uint8)).save(image)
    assert main(["caption", "--checkpoint", str(captioner), "--image", str(image)]) == 0
    assert set(capsys.readouterr().out.split()) <= set(_vocabulary(captioner))


def test_viz_caption_draws_one_panel_per_word(captioner, capsys, tmp_path):
    out = tmp_path / "fig.png"
    argv = ["viz", "caption", "--checkpoint", str(captioner), "--scene", "test:0", "--out", str(out)]
    assert main(argv) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert f"wrote {out}" in capsys.readouterr().out


def test_eval_scores_the_held_out_scenes(captioner, capsys):
    argv = ["eval", "--checkpoint", str(captioner), "--split", "heldout", "--beam", "2", "--batches", "1"]
    assert main(argv) == 0
    scores = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    for key in ("heldout_exact", "heldout_bleu4", "heldout_cider_d", "heldout_nll"):
        assert 0 <= scores[key] < float("inf"), key
    # --beam 0 skips decoding: the loss alone (it printed greedy captions' scores)
    assert main(["eval", "--checkpoint", str(captioner), "--beam", "0", "--batches", "1"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert "test_nll" in scores and not any(k.endswith(("bleu4", "cider_d", "exact")) for k in scores)


def test_vit_attention_and_eval(vit, capsys, tmp_path):
    out = tmp_path / "attention.png"
    assert main(["viz", "attention", "--checkpoint", str(vit), "--test-image", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.is_file() and "predicted: " in printed
    assert main(["eval", "--checkpoint", str(vit), "--split", "test"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert 0 <= scores["test_accuracy"] <= 1


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["caption", "--scene", "heldout:1", "--image", "x.png"], "exactly one image"),
        (["caption"], "exactly one image"),
        (["caption", "--scene", "dev:1"], "SPLIT:N"),
        (["caption", "--image", "missing.png"], "missing.png"),
    ],
)
def test_caption_mistakes_get_one_error_line(captioner, capsys, argv, match):
    assert main([*argv[:1], "--checkpoint", str(captioner), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and match in err


def test_commands_refuse_the_wrong_kind_of_checkpoint(captioner, vit, capsys):
    assert main(["caption", "--checkpoint", str(vit), "--image", "x.png"]) == 2
    assert "'captioner'" in capsys.readouterr().err
    assert main(["viz", "attention", "--checkpoint", str(vit)]) == 2
    assert "exactly one image" in capsys.readouterr().err
    assert main(["viz", "attention", "--checkpoint", str(captioner), "--image", "x.png"]) == 2
    assert "--text" in capsys.readouterr().err


def test_a_scene_past_the_limit_is_refused_before_drawing(captioner, capsys):
    """heldout:99999999 asked for 1.12 TiB: the scenes before it are drawn first."""
    assert main(["caption", "--checkpoint", str(captioner), "--scene", "heldout:99999999"]) == 2
    assert "N must be below 100,000" in capsys.readouterr().err


def test_an_image_for_a_digits_model_is_letterboxed_on_black_and_greyed_as_luma(tmp_path):
    import argparse

    from seqlab.commands_vision import image_from_args

    pixels = np.zeros((8, 4, 3), dtype=np.uint8)  # a tall black image, one pure red pixel
    pixels[4, 2] = (255, 0, 0)
    Image.fromarray(pixels).save(tmp_path / "tall.png")
    args = argparse.Namespace(image=str(tmp_path / "tall.png"), scene=None, test_image=None)
    grey = image_from_args(args, {"source": "digits"}, 8, 1)
    assert grey.shape == (1, 8, 8) and int(grey[0, :, :2].max()) == 0  # white bars read as ink before
    assert int(grey[0, 4, 4]) == round(0.299 * 255)  # Pillow's "L" of pure red (the channel mean gave 85)
    rgb = image_from_args(args, {"source": "folder"}, 8, 3)
    assert int(rgb[:, :, :2].min()) == 255  # a folder's images are letterboxed on white, as in training


def test_classify_names_a_class_per_image_and_the_top_k(vit, capsys, tmp_path):
    files = []
    for i, (h, w) in enumerate([(8, 8), (30, 12), (5, 40)]):  # any size, colour or grey
        files.append(tmp_path / f"img{i}.png")
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(files[-1])
    assert main(["classify", "--checkpoint", str(vit), *map(str, files)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == list(map(str, files))
    assert all(re.fullmatch(r"\d \(p = [01]\.\d\d\)", ln.split("\t")[1]) for ln in lines), lines
    assert main(["classify", "--checkpoint", str(vit), "--top", "3", str(files[0])]) == 0
    path, best = capsys.readouterr().out.strip().split("\t")
    probs = [float(p) for p in re.findall(r"\(p = ([01]\.\d\d)\)", best)]
    assert path == str(files[0]) and len(probs) == 3 and probs == sorted(probs, reverse=True)
    assert best.split(",")[0] == lines[0].split("\t")[1]  # the first of the top 3 is the best class


def test_classify_refuses_what_it_cannot_answer(vit, captioner, capsys, tmp_path):
    image = tmp_path / "a.png"
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(image)
    (tmp_path / "b.png").write_text("not an image", encoding="utf-8")
    cases = [
        (["--checkpoint", str(vit), "--top", "11", str(image)], "--top 11: the model in .* knows 10 classes"),
        (
            ["--checkpoint", str(vit), str(image), str(tmp_path / "b.png")],
            "b.png is not an image Pillow can read",
        ),
        (["--checkpoint", str(captioner), str(image)], "classify needs a 'vit' or a 'video' model"),
    ]
    for argv, match in cases:
        assert main(["classify", *argv]) == 2
        err = capsys.readouterr()
        assert re.search(match, err.err) and err.out == "", (argv, err)
