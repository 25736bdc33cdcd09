"""The figure and sampling commands refuse what they would ignore or could not finish, before any work: sizes
past their bounds, options that do not apply to the checkpoint's model, an --out that cannot be written, and
list patterns that match nothing; and their messages name only options the command has."""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from seqlab.cli import main

TEXT = "ROMEO: but soft, what light through yonder window breaks?\n" * 20


def _train(out, *argv) -> None:
    common = ["--train.steps=2", "--train.warmup_steps=1", "--train.eval_batches=1", "--train.progress=false"]
    common.append("--train.threads=1")
    assert main(["train", *argv, *common, "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    (root / "play.txt").write_text(TEXT, encoding="utf-8")
    text = [
        f"--task.source={root / 'play.txt'}",
        "--task.seq_len=16",
        "--task.batch_size=4",
        "--task.sampling=random",
    ]
    _train(root / "run", "--model.name=test-gpt", "--task.name=text", *text)
    return root / "run"


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    out = tmp_path_factory.mktemp("vit") / "run"
    _train(out, "--model.name=test-vit", "--task.name=image_classification", "--task.source=digits")
    return out


@pytest.fixture(scope="module")
def captioner(tmp_path_factory):
    out = tmp_path_factory.mktemp("cap") / "run"
    scenes = ["--task.name=captioning", "--task.image_size=32", "--task.n_train=16", "--task.n_eval=4"]
    _train(out, "--model.name=test-show-attend-tell", *scenes, "--task.batch_size=4")
    return out


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(np.full((20, 20, 3), 90, dtype=np.uint8)).save(path)
    return str(path)


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    return err


def _parse_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def _never(*args, **kwargs):
    raise AssertionError("the command did its work before refusing")


# ---- sizes ------------------------------------------------------------------------------------------------


def test_gradient_sizes_are_bounded_before_any_unroll(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("seqlab.viz.gradients.gradient_flow", _never)
    err = _parse_error(
        capsys, ["viz", "gradients", "--length", "100000000", "--out", str(tmp_path / "g.png")]
    )
    assert "--length: must be an integer <= 5,000, got '100000000'" in err
    argv = ["viz", "gradients", "--length", "5000", "--d-model", "512", "--out", str(tmp_path / "g.png")]
    assert "length x d_model <= 640,000" in _error(capsys, argv)
    assert not (tmp_path / "g.png").exists()


def test_generate_and_caption_lengths_and_temperature_are_refused_at_parse_time(capsys):
    argv = ["generate", "--checkpoint", "nowhere", "--max-new-tokens", "100000000000"]
    assert "must be an integer <= 10,000" in _parse_error(capsys, argv)
    assert "finite" in _parse_error(capsys, ["generate", "--checkpoint", "nowhere", "--temperature", "inf"])
    argv = ["caption", "--checkpoint", "nowhere", "--scene", "test:0", "--max-new-tokens", "100000000"]
    assert "must be an integer <= 100," in _parse_error(capsys, argv)
    assert "invalid choice: 'dev'" in _parse_error(
        capsys, ["viz", "video", "--checkpoint", "x", "--split", "dev"]
    )


# ---- viz attention: options of the model's kind -----------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layers", "99"], "--layers 99 out of range: the model has 2 layers (0 ... 1)"),
        (["--layers", "0,1"], "give one index"),
        (["--heads", "1"], "--heads does not apply to a ViT's attention"),
        (["--per-head"], "--per-head does not apply to a ViT's attention"),
        (["--text", "hi"], "--text does not apply to a ViT's attention"),
        (["--out", "v.txt"], ".txt is not a figure format"),
    ],
)
def test_vit_attention_refuses_what_it_would_ignore(vit, image, capsys, tmp_path, extra, message):
    out = ["--out", str(tmp_path / "v.png")] if "--out" not in extra else []
    argv = ["viz", "attention", "--checkpoint", str(vit), "--image", image, *out, *extra]
    if "--out" in extra:
        argv[-1] = str(tmp_path / extra[-1])
    assert message in _error(capsys, argv)
    assert list(tmp_path.iterdir()) == [tmp_path / "x.png"]  # nothing written


def test_vit_attention_draws_the_chosen_layer(vit, image, capsys, tmp_path):
    outs = [tmp_path / "last.png", tmp_path / "first.png"]
    assert main(["viz", "attention", "--checkpoint", str(vit), "--image", image, "--out", str(outs[0])]) == 0
    argv = ["viz", "attention", "--checkpoint", str(vit), "--image", image, "--layers", "0"]
    assert main([*argv, "--out", str(outs[1])]) == 0
    assert outs[0].is_file() and outs[1].is_file() and outs[0].read_bytes() != outs[1].read_bytes()
    err = _error(capsys, ["viz", "attention", "--checkpoint", str(vit), "--out", str(tmp_path / "n.png")])
    assert "give exactly one image: --image FILE or --test-image N" in err and "--scene" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--image", "missing.png"], "--image does not apply to a language model's attention"),
        (["--test-image", "0"], "--test-image does not apply to a language model's attention"),
        (["--layers", "5"], "--layers 5 out of range: the model has 2 layers (0 ... 1)"),
        (["--heads", "9"], "--heads 9 out of range: the model has"),
        (["--per-head", "--out", "att.png"], "--per-head writes one figure per map; give a folder"),
    ],
)
def test_lm_attention_refuses_what_it_would_ignore(lm, capsys, tmp_path, extra, message):
    extra = [str(tmp_path / e) if e.endswith(".png") else e for e in extra]
    out = [] if "--out" in extra else ["--out", str(tmp_path / "att")]
    assert message in _error(
        capsys, ["viz", "attention", "--checkpoint", str(lm), "--text", "ROMEO", *out, *extra]
    )
    assert list(tmp_path.iterdir()) == []


def test_lm_attention_out_is_a_file_with_a_figure_suffix_and_a_folder_without(lm, capsys, tmp_path):
    argv = ["viz", "attention", "--checkpoint", str(lm), "--text", "ROMEO"]
    assert main([*argv, "--out", str(tmp_path / "att.png")]) == 0
    assert (tmp_path / "att.png").is_file()  # it made a folder named att.png
    assert main([*argv, "--out", str(tmp_path / "maps"), "--per-head"]) == 0
    assert (tmp_path / "maps" / "attention.png").is_file() and (
        tmp_path / "maps" / "layer1-head0.png"
    ).is_file()
    assert "--text TEXT" in _error(capsys, ["viz", "attention", "--checkpoint", str(lm)])


def test_other_models_are_pointed_to_the_command_that_reads_them(captioner, image, capsys):
    err = _error(capsys, ["viz", "attention", "--checkpoint", str(captioner), "--image", image])
    assert (
        "'captioner' model" in err and "`seqlab viz caption`" in err and "language model's attention" in err
    )
    err = _error(capsys, ["generate", "--checkpoint", str(captioner)])
    assert "describe an image with `seqlab caption`" in err and "not trained on text" not in err
    err = _error(capsys, ["caption", "--checkpoint", str(captioner)])
    assert "give exactly one image: --image FILE or --scene SPLIT:N" in err and "--test-image" not in err


def test_attention_maps_of_a_model_without_them_point_to_viz_alignment():
    from seqlab.viz.attention import write_attention_maps

    with pytest.raises(ValueError, match="seqlab viz alignment"):
        write_attention_maps(torch.nn.Linear(2, 2), None, "x", ".")


# ---- --out ------------------------------------------------------------------------------------------------


@pytest.fixture
def unwritable(tmp_path):
    """A folder this process cannot write in: /sys as root (chmod does not stop root), else a chmod 555 one."""
    if os.geteuid() == 0:
        yield "/sys"
        return
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    yield str(folder)
    folder.chmod(0o755)


def test_an_unwritable_out_is_refused_before_the_work(unwritable, capsys, monkeypatch):
    monkeypatch.setattr("seqlab.viz.gradients.gradient_flow_groups", _never)
    monkeypatch.setattr("seqlab.training.checkpoint.resolve_checkpoint", _never)
    err = _error(capsys, ["viz", "gradients", "--out", f"{unwritable}/grad.png"])
    assert f"the folder {unwritable} is not writable" in err
    err = _error(capsys, ["export", "--checkpoint", "x", "--out", f"{unwritable}/exp_x"])
    assert f"--out {unwritable}/exp_x: the folder {unwritable} is not writable" in err and ".tmp-" not in err


@pytest.mark.parametrize(
    ("name", "message"), [(".png", "a suffix without a name"), ("x.png.", "ends in a dot")]
)
def test_a_figure_name_without_a_name_is_refused(name, message, capsys, tmp_path):
    argv = [
        "viz",
        "positions",
        "--positions",
        "8",
        "--d-model",
        "8",
        "--grid",
        "2",
        "--out",
        str(tmp_path / name),
    ]
    assert message in _error(capsys, argv)
    assert list(tmp_path.iterdir()) == []


# ---- messages and warnings --------------------------------------------------------------------------------


def test_a_text_file_named_npy_is_refused_without_pickle_advice(tmp_path):
    from seqlab.commands_video import _check_npy

    bad = tmp_path / "bad.npy"
    bad.write_text("not an array\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"not a \.npy array file") as e:
        _check_npy(str(bad))
    assert "pickle" not in str(e.value)
    np.save(tmp_path / "good.npy", np.zeros((2, 4, 4), dtype=np.uint8))
    _check_npy(str(tmp_path / "good.npy"))


def test_figures_log_missing_glyphs_once_and_a_clip_draws_without_warnings(tmp_path, caplog):
    from seqlab.viz.figures import pyplot, save_figure
    from seqlab.viz.video import plot_clip

    fig, ax = pyplot().subplots()
    ax.set_title("你好 你好")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING):
            save_figure(fig, tmp_path / "t.png")
        frames = torch.zeros(3, 1, 8, 8, dtype=torch.uint8)
        plot_clip(frames, tmp_path / "clip.png", title="t", true_labels=["a"] * 3, predicted=["a", "b", "a"])
    assert [r.getMessage().count("你") for r in caplog.records] == [1]
    assert (tmp_path / "clip.png").is_file()


# ---- list -------------------------------------------------------------------------------------------------


def test_list_patterns_filter_every_section_case_insensitively(capsys):
    assert main(["list", "--mixers", "lstm*"]) == 0
    out = capsys.readouterr().out
    assert "\nlstm " in out and "mamba" not in out and "gru" not in out
    assert main(["list", "LSTM*"]) == 0
    out = capsys.readouterr().out
    assert "lstm-lm-small" in out and "\nlstm " in out and "gpt-tiny" not in out and "shakespeare" not in out
    assert main(["list", "shakes"]) == 0  # a word without wildcards: the names containing it
    assert "tasks: shakespeare" in capsys.readouterr().out
    err = _error(capsys, ["list", "nomatch"])
    assert "no preset, task or mixer matches 'nomatch'" in err and "the mixers: rnn, lstm" in err
    assert "no mixer matches 'nomatch'; the mixers: rnn" in _error(capsys, ["list", "--mixers", "nomatch"])
