"""`seqlab train` on the speech tasks, `seqlab transcribe` and `seqlab viz speech` (through their argparse
adders, as seqlab.cli registers them), `seqlab compare --suite speech` errors."""

import argparse
import shutil

import numpy as np
import pytest
import torch

from seqlab.cli import _dispatch, main
from seqlab.commands_speech import add_transcribe, add_viz_speech, compare_speech_command
from seqlab.tasks.speech_data import write_wav

TONES = {"a": 300.0, "b": 900.0, "c": 2000.0}
TEXTS = ["ab", "ba", "abc", "c", "ca", "bb", "ac", "cab", "bc", "cc", "aa", "cb"]
TRAIN = ["--train.steps=3", "--train.eval_every=0", "--train.progress=false", "--task.batch_size=4"]


def _tone_wave(text: str, sr: int = 16000, seed: int = 0) -> np.ndarray:
    t = np.arange(int(0.12 * sr)) / sr
    parts = [np.zeros(800)] + [0.5 * np.sin(2 * np.pi * TONES[c] * t) for c in text] + [np.zeros(800)]
    wave = np.concatenate(parts)
    return (wave + np.random.default_rng(seed).normal(0, 0.01, wave.shape)).astype(np.float32)


def _folder(path):
    path.mkdir()
    for i, text in enumerate(TEXTS):
        write_wav(path / f"u{i}.wav", _tone_wave(text, seed=i), 16000)
    lines = [f"u{i}.wav\t{text}" for i, text in enumerate(TEXTS)]
    (path / "transcripts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _speech_cli(argv: list[str]) -> int:
    """The speech subcommands under a parser shaped as seqlab.cli's (`transcribe`, `viz speech`)."""
    p = argparse.ArgumentParser(prog="seqlab")
    sub = p.add_subparsers(dest="command", required=True)
    add_transcribe(sub)
    viz = sub.add_parser("viz")
    add_viz_speech(viz.add_subparsers(dest="viz_command", required=True))
    args = p.parse_args(argv)
    args.debug = False
    return _dispatch(args)


@pytest.fixture(scope="module")
def ctc_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech")
    folder = _folder(root / "data")
    out = root / "ctc"
    argv = ["train", "--model.name=test-speech-ctc", "--task.name=speech_ctc", "--task.source=folder"]
    assert main([*argv, f"--task.path={folder}", "--task.n_mels=16", *TRAIN, "--out", str(out)]) == 0
    return folder, out


def test_transcribe_and_viz_a_ctc_checkpoint(ctc_run, tmp_path, capsys):
    folder, out = ctc_run
    write_wav(tmp_path / "stereo-8k.wav", np.stack([_tone_wave("ab", 8000)] * 2, 1), 8000)
    assert (
        _speech_cli(
            ["transcribe", "--checkpoint", str(out), str(folder / "u0.wav"), str(tmp_path / "stereo-8k.wav")]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(str(folder / "u0.wav") + "\t")
    assert set(lines[0].split("\t")[1]) <= set("abc ")  # the vocabulary's characters only
    png = tmp_path / "fig.png"
    assert (
        _speech_cli(["viz", "speech", "--checkpoint", str(out), str(folder / "u1.wav"), "--out", str(png)])
        == 0
    )
    assert "predicted:" in capsys.readouterr().out and png.stat().st_size > 0
    png2 = tmp_path / "item.png"
    argv = ["viz", "speech", "--checkpoint", str(out), "--test-item", "0", "--out", str(png2)]
    assert _speech_cli(argv) == 0
    assert "true: " in capsys.readouterr().out and png2.stat().st_size > 0


def test_keyword_checkpoint_transcribes_to_a_word(tmp_path, capsys):
    folder = _folder(tmp_path / "data")
    out = tmp_path / "kw"
    argv = ["train", "--model.name=test-speech", "--task.name=keywords", "--task.source=folder"]
    assert main([*argv, f"--task.path={folder}", "--task.n_mels=16", *TRAIN, "--out", str(out)]) == 0
    assert _speech_cli(["transcribe", "--checkpoint", str(out), str(folder / "u3.wav")]) == 0
    word = capsys.readouterr().out.strip().split("\t")[1]
    assert word.split(" (p = ")[0] in TEXTS
    assert (
        _speech_cli(
            ["viz", "speech", "--checkpoint", str(out), "--test-item", "0", "--out", str(tmp_path / "k.png")]
        )
        == 0
    )


def test_speech_command_errors(ctc_run, tmp_path, capsys):
    folder, out = ctc_run
    write_wav(tmp_path / "silent.wav", np.zeros(4000), 16000)
    assert _speech_cli(["transcribe", "--checkpoint", str(out), str(tmp_path / "silent.wav")]) == 2
    assert "is silent" in capsys.readouterr().err
    assert _speech_cli(["transcribe", "--checkpoint", str(out), str(tmp_path / "none.wav")]) == 2
    assert "audio file not found" in capsys.readouterr().err
    write_wav(tmp_path / "short.wav", _tone_wave("a", seed=0)[:80], 16000)  # 5 ms
    # a missing or a too-short file after a good one: refused before any is decoded
    for second, says in (("no.wav", "audio file not found"), ("short.wav", "short.wav is 5.0 ms long")):
        argv = ["transcribe", "--checkpoint", str(out), str(folder / "u0.wav"), str(tmp_path / second)]
        assert _speech_cli(argv) == 2
        printed = capsys.readouterr()
        assert says in printed.err and "u0.wav" not in printed.out
    assert _speech_cli(["viz", "speech", "--checkpoint", str(out), "--out", str(tmp_path / "x.png")]) == 2
    assert "give a WAV file or --test-item N" in capsys.readouterr().err
    assert _speech_cli(["viz", "speech", "--checkpoint", str(out), "--test-item", "99"]) == 2
    assert "the test split has" in capsys.readouterr().err
    lm = tmp_path / "lm"
    assert main(["train", "--model.name=test-lm-gru", "--task.name=copy", *TRAIN[:3], "--out", str(lm)]) == 0
    assert _speech_cli(["transcribe", "--checkpoint", str(lm), str(folder / "u0.wav")]) == 2
    assert "needs a 'speech' model" in capsys.readouterr().err


def test_train_refuses_a_folder_with_a_long_recording_before_any_step(tmp_path, capsys):
    folder = _folder(tmp_path / "data")
    write_wav(folder / "u11.wav", np.tile(_tone_wave("cb"), 10), 16000)  # 3.4 s
    out = tmp_path / "run"
    argv = ["train", "--model.name=test-speech-ctc", "--task.name=speech_ctc", "--task.source=folder"]
    assert main([*argv, f"--task.path={folder}", "--task.max_seconds=2", *TRAIN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "1 of its 12 recordings is longer than max_seconds=2 s (line 12: u11.wav (3.4 s))" in err
    assert "Traceback" not in err and not (out / "checkpoints").exists()


def test_compare_speech_refuses_minutes_and_unknown_mixers(tmp_path):
    args = argparse.Namespace(
        minutes=2.0, threads=None, out=str(tmp_path), mixers=None, tasks=None, jobs=1, seed=0
    )
    with pytest.raises(ValueError, match="the speech suite counts steps"):
        compare_speech_command(args)
    args.minutes, args.mixers = None, ["xlstm"]
    with pytest.raises(ValueError, match="unknown speech suite mixer"):
        compare_speech_command(args)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng: apt-get install -y espeak-ng")
def test_train_on_a_tiny_generated_corpus(tmp_path, capsys):
    data = ["--task.name=speech_ctc", "--task.n_train=12", "--task.n_eval=4", f"--task.cache_dir={tmp_path}"]
    assert main(["train", "--model.name=test-speech-ctc", *data, *TRAIN, "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "latest").is_file()
    assert main(["train", "--model.name=test-speech-ctc", "--model.n_mels=16", *data, *TRAIN]) == 2
    assert "model.n_mels=16 (the task needs 40)" in capsys.readouterr().err


def test_a_long_recording_is_drawn_at_a_bounded_width(tmp_path):
    """A 10-minute file made a PNG 198,003 pixels wide: past a minute the figure keeps its width."""
    from PIL import Image

    from seqlab.commands_speech import plot_speech

    features = {"hop_length": 160, "sample_rate": 16000}  # 100 frames a second
    feats, probs = torch.randn(60_000, 16), torch.softmax(torch.randn(30_000, 8), -1)
    path = plot_speech(
        feats, probs, [str(k) for k in range(8)], tmp_path / "s.png", features, 2, "ten minutes"
    )
    with Image.open(path) as image:
        assert image.width <= 180 * 110 + 200  # 180 inches at the figures' 110 dpi, plus the margins
