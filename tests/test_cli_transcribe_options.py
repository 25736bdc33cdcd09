"""`seqlab transcribe` and `seqlab viz speech` options that a checkpoint's kind of model cannot use are
refused, naming the option and the kind, before the model loads or any file is decoded: a keyword model has
no beam search (--beam-size) and no path to choose (--greedy); --greedy and --beam-size contradict on a CTC
model; viz's --split picks a --test-item's split and means nothing beside a WAV file."""

import pytest

from seqlab.cli import main
from test_cli_speech import TRAIN, _folder  # the same folder (pytest puts it on sys.path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(data folder, keyword run, CTC run): three training steps each on a folder of tone 'words'."""
    root = tmp_path_factory.mktemp("speech-options")
    folder = _folder(root / "data")
    out = {}
    for kind, model in (("keywords", "test-speech"), ("speech_ctc", "test-speech-ctc")):
        out[kind] = root / kind
        argv = ["train", f"--model.name={model}", f"--task.name={kind}", "--task.source=folder"]
        argv += [f"--task.path={folder}", "--task.n_mels=16", *TRAIN, "--out", str(out[kind])]
        assert main(argv) == 0
    return folder, out["keywords"], out["speech_ctc"]


@pytest.mark.parametrize(
    "option,says",
    [
        (["--beam-size", "4"], "--beam-size 4: "),
        (["--greedy"], "--greedy: "),
        (["--greedy", "--beam-size", "4"], "--greedy and --beam-size 4: "),
    ],
)
def test_a_keyword_checkpoint_refuses_decoding_options(runs, capsys, option, says):
    folder, keywords, _ = runs
    capsys.readouterr()
    assert main(["transcribe", "--checkpoint", str(keywords), *option, str(folder / "u0.wav")]) == 2
    printed = capsys.readouterr()
    assert says in printed.err and "a keyword-spotting model (task 'keywords')" in printed.err
    assert "speech_ctc" in printed.err and printed.out == ""


def test_a_ctc_checkpoint_refuses_greedy_with_a_beam_size(runs, capsys):
    folder, _, ctc = runs
    capsys.readouterr()
    argv = ["transcribe", "--checkpoint", str(ctc), "--greedy", "--beam-size", "4", str(folder / "u0.wav")]
    assert main(argv) == 2
    printed = capsys.readouterr()
    assert "--greedy and --beam-size 4 contradict" in printed.err and printed.out == ""


def test_the_options_a_checkpoint_can_use_still_transcribe(runs, capsys):
    folder, keywords, ctc = runs
    for argv in ([str(keywords)], [str(ctc), "--greedy"], [str(ctc), "--beam-size", "1"], [str(ctc)]):
        capsys.readouterr()
        assert main(["transcribe", "--checkpoint", *argv, str(folder / "u0.wav")]) == 0
        assert capsys.readouterr().out.startswith(f"{folder / 'u0.wav'}\t")


def test_viz_speech_refuses_split_beside_a_wav_file(runs, tmp_path, capsys):
    folder, _, ctc = runs
    capsys.readouterr()
    png = tmp_path / "fig.png"
    argv = [
        "viz",
        "speech",
        "--checkpoint",
        str(ctc),
        str(folder / "u0.wav"),
        "--split",
        "val",
        "--out",
        str(png),
    ]
    assert main(argv) == 2
    assert "--split val picks the split of --test-item" in capsys.readouterr().err and not png.exists()


def test_viz_speech_refuses_an_unknown_split_before_building_the_task(runs, capsys):
    _, _, ctc = runs
    with pytest.raises(SystemExit) as caught:
        main(["viz", "speech", "--checkpoint", str(ctc), "--test-item", "0", "--split", "dev"])
    assert caught.value.code == 2
    assert "invalid choice: 'dev'" in capsys.readouterr().err
