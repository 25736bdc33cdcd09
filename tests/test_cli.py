import json

import pytest

from seqlab.cli import main
from seqlab.run import parse_overrides, parse_value

TEXT = "".join(f"KING:\nline {i}, my lord, the quick brown fox.\n\n" for i in range(300))


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "play.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def _train(text_file, out, *extra):
    return main(
        [
            "train",
            "--model.name=test-gru-lm",
            "--task.name=text",
            f"--task.source={text_file}",
            "--task.seq_len=16",
            "--task.batch_size=4",
            "--train.steps=12",
            "--train.eval_every=6",
            "--train.eval_batches=2",
            "--train.progress=false",
            "--train.warmup_steps",
            "2",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_train_then_generate(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(text_file, out) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step"] == 12 and summary["val_loss"] > 0
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "val"}
    assert main(["generate", "--checkpoint", str(out), "--prompt", "KING:", "--max-new-tokens", "30"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("KING:") and len(text.rstrip("\n")) >= 30
    # greedy decoding is deterministic
    main(["generate", "--checkpoint", str(out), "--prompt", "KING:", "--temperature", "0"])
    a = capsys.readouterr().out
    main(["generate", "--checkpoint", str(out), "--prompt", "KING:", "--temperature", "0"])
    assert capsys.readouterr().out == a


def test_generate_prints_the_sample_as_it_is_drawn(text_file, tmp_path, monkeypatch):
    """The text comes out in pieces while sampling goes on, and adds up to the sample drawn in one call."""
    import io
    import sys

    import torch

    from seqlab.training.checkpoint import load_model, load_tokenizer

    _train(text_file, tmp_path / "run", "--model.name=test-gpt", "--task.sampling=random")
    pieces = []

    class Recorder(io.StringIO):
        def write(self, text):
            pieces.append(text)
            return super().write(text)

    monkeypatch.setattr(sys, "stdout", Recorder())
    monkeypatch.setattr("seqlab.commands_generate._Stream.PERIOD", 0.0)  # 60 tokens take less than 0.1 s
    argv = ["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "KING:", "--max-new-tokens", "60"]
    assert main([*argv, "--seed", "5", "--temperature", "0.8"]) == 0
    model, tok = load_model(tmp_path / "run"), load_tokenizer(tmp_path / "run", "the test")
    ids = model.generate(tok.encode("KING:"), 60, temperature=0.8, generator=torch.Generator().manual_seed(5))
    assert sys.stdout.getvalue() == tok.decode(ids) + "\n"
    assert len([p for p in pieces if p.strip()]) > 5  # streamed, not one print at the end


def test_generate_stopped_by_ctrl_c_keeps_the_text_so_far_on_its_own_line(
    text_file, tmp_path, monkeypatch, capsys
):
    from seqlab.models.lm import LM

    _train(text_file, tmp_path / "run", "--model.name=test-gpt", "--task.sampling=random")
    real = LM.generate

    def interrupted(self, prompt, n, **kw):
        real(self, prompt, 3, **kw)  # three tokens streamed, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(LM, "generate", interrupted)
    monkeypatch.setattr("seqlab.commands_generate._Stream.PERIOD", 0.0)
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "KING:"]) == 130
    printed = capsys.readouterr()
    assert (
        printed.out.startswith("KING:")
        and printed.out.endswith("\n")
        and len(printed.out) == len("KING:") + 4
    )
    assert "stopped by Ctrl-C" in printed.err


def test_existing_run_is_never_overwritten(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(text_file, out) == 0
    before = (out / "latest").read_text()
    assert _train(text_file, out) == 2  # one error line, status 2 (a SystemExit of status 1 before)
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert (out / "latest").read_text() == before
    # resuming a finished run is a no-op that reports the same step
    assert _train(text_file, out, "--resume") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 12


def test_run_file_and_overrides(text_file, tmp_path, capsys):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        f"model: {{name: test-lstm-lm}}\ntask: {{name: text, source: {text_file}, seq_len: 8, "
        f"batch_size: 2}}\ntrain: {{steps: 3, lr: 3e-3, progress: false}}\n",
        encoding="utf-8",
    )
    assert main(["train", str(run_file), "--train.steps=4", "--out", str(tmp_path / "r")]) == 0
    cfg = json.loads(next((tmp_path / "r" / "checkpoints").iterdir()).joinpath("config.json").read_text())
    assert cfg["train"]["steps"] == 4 and cfg["train"]["lr"] == 0.003
    assert cfg["model"].get("mixer", cfg["model"].get("cell")) == "lstm"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.name=no-such"], "unknown model"),
        (["--model.name=test-lstm-lm", "--model.n_layer=3"], "['n_layer']"),
        (["--model.name=test-lstm-lm", "--train.stepz=3"], "unknown train field"),
        (["--model.name=test-lstm-lm", "--task.name=text"], "task.source"),
        (["--model.name=test-lstm-lm", "--task.name=nope"], "unknown task"),
    ],
)
def test_bad_runs_get_clear_errors(tmp_path, capsys, args, message):
    assert main(["train", *args, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err


def test_generate_errors(tmp_path, capsys):
    assert main(["generate", "--checkpoint", str(tmp_path / "none")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


def test_generate_rejects_unknown_characters(text_file, tmp_path, capsys):
    _train(text_file, tmp_path / "run")
    assert main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "Ωmega"]) == 2
    assert "the prompt cannot be encoded" in capsys.readouterr().err


def test_generate_on_a_terminal_without_the_characters(tmp_path, capsys, monkeypatch):
    """A sample in characters stdout's encoding lacks is printed escaped, with a note, not lost to a codec error."""
    import io
    import sys

    text = tmp_path / "accents.txt"
    text.write_text("".join(f"Ö ö é — line {i}.\n" for i in range(300)), encoding="utf-8")
    _train(text, tmp_path / "run")
    capsys.readouterr()
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert (
        main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "Ö ö", "--max-new-tokens", "5"])
        == 0
    )
    printed = raw.getvalue().decode("ascii")
    assert printed.startswith("\\xd6 \\xf6")  # the prompt, escaped
    assert "written as \\x/\\u escapes" in capsys.readouterr().err


def test_list_and_help(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "lstm-lm-small" in out and "shakespeare" in out
    for cmd in ("train", "generate", "list"):
        with pytest.raises(SystemExit) as exc:
            main([cmd, "--help"])
        assert exc.value.code == 0
        assert "usage: seqlab" in capsys.readouterr().out


def test_override_parsing():
    assert parse_overrides(["--model.n_layers=2", "--train.lr", "3e-4", "--train.grad_clip=null"]) == {
        "model": {"n_layers": 2},
        "train": {"lr": 3e-4, "grad_clip": None},
    }
    assert parse_value("true") is True and parse_value("1e-3") == 1e-3 and parse_value("abc") == "abc"
    with pytest.raises(ValueError, match="overrides look like"):
        parse_overrides(["--steps=3"])
    with pytest.raises(ValueError, match="must name a field"):
        parse_overrides(["--optim.lr=3"])


def test_list_names_every_registered_mixer_with_its_family_and_fields(capsys):
    from seqlab.layers import list_mixers, mixer_spec

    assert main(["list", "--mixers"]) == 0
    out = capsys.readouterr().out
    assert "lstm-lm-small" not in out  # the mixers only
    for name in list_mixers():
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{name} "))
        assert mixer_spec(name).family in line and mixer_spec(name).summary in line
    assert "n_heads=4" in out and "'zoh'" in out  # fields with defaults; a Literal field's choices
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "lstm-lm-small" in out and "linear-attention" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "--jobs", "0"], "--jobs: must be a positive integer, got '0'"),
        (["generate", "--checkpoint", "x", "--top-p", "1.5"], "--top-p: must be a probability in (0, 1]"),
        (["viz", "gradients", "--length", "1"], "--length: must be an integer >= 2, got '1'"),
        (["viz", "gradients", "--cells", "lstm,mamba"], "--cells: takes rnn, lstm, gru"),
        (["list", "--train.steps=3"], "unrecognized arguments: --train.steps=3"),
    ],
)
def test_arguments_are_checked_as_they_are_parsed(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_user_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    args = ["compare", "--out", str(tmp_path), "--suite", "huge"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown suite") and "Traceback" not in err and err.count("\n") == 1
    with pytest.raises(ValueError, match="unknown suite"):
        main(["--debug", *args])


def test_a_bug_shows_its_traceback(monkeypatch, tmp_path, capsys):
    import seqlab.lab

    def broken(*args, **kwargs):
        raise RuntimeError("shapes do not match")

    monkeypatch.setattr(seqlab.lab, "compare", broken)
    assert main(["compare", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: shapes do not match" in err and "--debug" in err
    with pytest.raises(RuntimeError, match="shapes do not match"):
        main(["--debug", "compare", "--out", str(tmp_path)])


def test_version_and_bare_command_print_help(capsys):
    from seqlab import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"seqlab {__version__}"
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: seqlab") and "translate" in out and "compare" in out


def test_ctrl_c_outside_the_training_loop_is_one_line_and_status_130(
    text_file, tmp_path, monkeypatch, capsys
):
    _train(text_file, tmp_path / "run")
    capsys.readouterr()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("seqlab.training.checkpoint.load_model", interrupted)
    assert main(["generate", "--checkpoint", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "stopped by Ctrl-C" and "Traceback" not in err


def test_settings_of_the_wrong_kind_are_one_error_line(tmp_path, capsys):
    """Each was a traceback: a mixer_config that is not a mapping, snrs that are not a list, and --nproc runs
    whose every process failed the same check after torchrun started them."""
    base = ["train", "--model.name=test-gpt", "--task.name=adding", "--train.steps=1"]
    for value in ("7", "[1,2]", "abc"):
        assert main([*base, f"--model.mixer_config={value}", "--out", str(tmp_path / "a")]) == 2
        assert "mixer_config must be a mapping of the mixer's fields" in capsys.readouterr().err
    from seqlab.tasks.speech import _check_snrs

    for bad in (5, ["abc"], "x", [], [float("nan")], [None, float("inf")]):  # none to draw; no ratio at all
        with pytest.raises(
            ValueError, match="snrs must be a non-empty list of finite signal-to-noise ratios"
        ):
            _check_snrs(bad)
    assert _check_snrs([None, 20, "10"]) == [None, 20.0, 10.0]
    afile = tmp_path / "afile"
    afile.write_text("mine", encoding="utf-8")
    assert main([*base, "--nproc", "2", "--out", str(afile)]) == 2  # refused before torchrun starts
    assert "is a file" in capsys.readouterr().err
    assert main([*base, "--task.batch_size=3", "--nproc", "2", "--out", str(tmp_path / "b")]) == 2
    assert "cannot be split over --nproc 2 processes" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_run_file_that_sets_nothing_does_not_start_the_defaults(tmp_path, capsys):
    for text in ("", "# my run\n", "out: somewhere\n"):
        run_file = tmp_path / "c.yaml"
        run_file.write_text(text, encoding="utf-8")
        assert main(["train", str(run_file), "--out", str(tmp_path / "r")]) == 2
        assert "sets nothing to train" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_windows_longer_than_the_position_table_are_refused_before_training(text_file, tmp_path, capsys):
    args = [
        "train",
        "--model.name=test-gpt",
        "--task.name=text",
        f"--task.source={text_file}",
        "--task.sampling=random",
    ]
    assert main([*args, "--task.seq_len=100", "--train.steps=1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "task.seq_len=100 is longer than the model's table of 64 learned positions" in err
    assert not (tmp_path / "r").exists()


def test_eval_of_a_text_lm_on_heldout_is_refused(text_file, tmp_path, capsys):
    """It reported the val loss labelled heldout_loss."""
    _train(text_file, tmp_path / "run")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), "--split", "heldout"]) == 2
    err = capsys.readouterr().err
    assert "--split heldout is the captioning scenes' split of unseen pairs" in err
    assert "'text' run: use --split val\n" in err


def test_eval_of_a_text_lm_refuses_what_it_cannot_measure(text_file, tmp_path, capsys):
    """--split test printed test_loss computed on the val windows; --beam and --limit were ignored."""
    _train(text_file, tmp_path / "run")
    run = str(tmp_path / "run")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", run, "--split", "test"]) == 2
    assert (
        "a text run has one held-out part, val (the last task.val_fraction of the text), no test split"
        in (capsys.readouterr().err)
    )
    assert main(["eval", "--checkpoint", run, "--beam", "3", "--limit", "4"]) == 2
    err = capsys.readouterr().err
    assert "--beam and --limit set the decoding of translation and captioning runs" in err
    assert "'text' run, scored by its loss (--batches) only" in err
    assert main(["eval", "--checkpoint", run, "--beam", "0", "--hypotheses", str(tmp_path / "h.txt")]) == 2
    assert "--hypotheses writes the decoded sentences, and --beam 0 decodes none" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", run, "--batches", "2"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"val_loss"}


def test_an_override_followed_by_an_option_has_no_value(tmp_path, capsys):
    """`--train.steps --out x1` took --out as the steps and x1 as the run file ('run file not found: x1')."""
    assert main(["train", "--model.name=test-gpt", "--train.steps", "--out", str(tmp_path / "x1")]) == 2
    assert "override '--train.steps' has no value (write --train.steps=VALUE)" in capsys.readouterr().err
    assert parse_overrides(["--train.seed", "-1"]) == {"train": {"seed": -1}}  # a negative number is a value
