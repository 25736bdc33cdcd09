"""The translation commands end to end: train an encoder–decoder on a pairs file, then translate, eval, draw
the alignment, resume; and the mistakes a user makes with them, each one `error:` line with status 2."""

from __future__ import annotations

import json

import pytest

from seqlab.cli import main

EN = ["the", "a", "cat", "dog", "sees", "eats", "big", "small", "red", "house", "tree", "runs"]
ES = ["el", "un", "gato", "perro", "ve", "come", "grande", "pequeño", "rojo", "casa", "árbol", "corre"]


def _pairs(n: int = 400) -> str:
    """A toy word-for-word language: distinct random sentences of 2-6 words."""
    import random

    rng, lines = random.Random(0), set()
    while len(lines) < n:
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(2, 6))]
        lines.add(" ".join(EN[i] for i in idx) + "\t" + " ".join(ES[i] for i in idx))
    return "\n".join(sorted(lines)) + "\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A trained tiny seq2seq run on a pairs file (module-scoped: the commands below only read it)."""
    root = tmp_path_factory.mktemp("translation")
    pairs = root / "pairs.tsv"
    pairs.write_text(_pairs(), encoding="utf-8")
    out = root / "run"
    argv = [
        "train",
        "--model.name=test-seq2seq",
        "--task.name=translation",
        f"--task.source={pairs}",
        "--task.vocab_size=300",
        "--task.batch_size=16",
        "--model.d_model=32",
        "--train.steps=150",
        "--train.lr=0.01",
        "--train.warmup_steps=2",
        "--train.eval_batches=2",
        "--train.progress=false",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out, argv


def test_train_writes_a_checkpoint_with_the_translation_tokenizer(run, capsys):
    out, _ = run
    tok = json.loads(next(out.glob("checkpoints/step-*/tokenizer.json")).read_text(encoding="utf-8"))
    assert tok["type"] == "translation" and tok["shared"] is True
    config = json.loads(next(out.glob("checkpoints/step-*/config.json")).read_text(encoding="utf-8"))
    assert config["family"] == "seq2seq"


def test_translate_eval_and_alignment(run, tmp_path, capsys):
    out, _ = run
    capsys.readouterr()
    assert (
        main(["translate", "--checkpoint", str(out), "--text", "the big dog sees a tree", "--beam", "3"]) == 0
    )
    words = capsys.readouterr().out.split()
    assert words and set(words) <= set(ES)  # Spanish words of the toy language
    hyps = tmp_path / "hyps.txt"
    assert (
        main(["eval", "--checkpoint", str(out), "--beam", "2", "--limit", "8", "--hypotheses", str(hyps)])
        == 0
    )
    scores = json.loads(capsys.readouterr().out)
    assert scores["test_bleu"] > 15 and scores["sacrebleu"].startswith("nrefs:1") and scores["test_acc"] > 0.5
    assert "hypotheses" not in scores  # the sentences go to the file, not onto the metrics' line
    lines = hyps.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 8 and all(set(line.split()) <= set(ES) for line in lines)
    assert main(["eval", "--checkpoint", str(out), "--hypotheses", str(hyps)]) == 2  # never overwritten
    assert "hyps.txt exists" in capsys.readouterr().err
    png = tmp_path / "alignment.png"
    assert (
        main(["viz", "alignment", "--checkpoint", str(out), "--text", "the cat eats", "--out", str(png)]) == 0
    )
    assert png.stat().st_size > 1000 and "wrote" in capsys.readouterr().out


def test_resume_continues_to_more_steps(run, tmp_path, capsys):
    out, argv = run
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(out, copy)
    resumed = [a if a != str(out) else str(copy) for a in argv]
    resumed = [a if not a.startswith("--train.steps") else "--train.steps=155" for a in resumed]
    assert main([*resumed, "--resume"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 155


@pytest.mark.parametrize(
    "argv,message",
    [
        (["translate", "--text", ""], "give a sentence to translate"),
        (["translate", "--text", "the cat " * 40], "this model accepts at most max_src_len=64"),
        (["translate", "--file", "/nonexistent/file.txt"], "No such file"),
        (["viz", "alignment", "--text", " "], "--text is empty: give the sentence whose alignment to draw"),
        (["eval", "--hypotheses", "/sys/h.txt"], "--hypotheses /sys/h.txt: the folder /sys is not writable"),
    ],
)
def test_translation_command_mistakes(run, capsys, argv, message):
    out, _ = run
    head = argv[:2] if argv[0] == "viz" else argv[:1]
    assert main([*head, "--checkpoint", str(out), *argv[len(head) :]]) == 2
    assert message in capsys.readouterr().err


def test_an_lm_checkpoint_cannot_translate(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("abc " * 400, encoding="utf-8")
    out = tmp_path / "lm"
    argv = [
        "train",
        "--model.name=test-gru-lm",
        "--task.name=text",
        f"--task.source={text}",
        "--task.seq_len=8",
    ]
    assert main([*argv, "--train.steps=2", "--train.progress=false", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(out), "--text", "abc"]) == 2
    assert "translation needs an encoder–decoder" in capsys.readouterr().err
    hyps = tmp_path / "hyps.txt"  # eval --hypotheses: translation only, said rather than ignored
    assert main(["eval", "--checkpoint", str(out), "--hypotheses", str(hyps)]) == 2
    assert "--hypotheses is for translation checkpoints" in capsys.readouterr().err and not hyps.exists()
    assert main(["eval", "--checkpoint", str(out), "--hypotheses", str(text / "h.txt")]) == 2  # under a file
    assert "t.txt is a file, not a folder" in capsys.readouterr().err


def test_a_translation_model_on_an_lm_task_and_back(tmp_path, capsys):
    assert (
        main(["train", "--model.name=test-seq2seq", "--task.name=adding", "--out", str(tmp_path / "a")]) == 2
    )
    assert "trains models of family 'lm'" in capsys.readouterr().err
    pairs = tmp_path / "p.tsv"
    pairs.write_text(_pairs(60), encoding="utf-8")
    argv = ["train", "--model.name=test-gpt", "--task.name=translation", f"--task.source={pairs}"]
    assert main([*argv, "--task.vocab_size=260", "--out", str(tmp_path / "b")]) == 2
    assert "'seq2seq' or 'transformer'" in capsys.readouterr().err


def test_a_pairs_file_with_a_missing_tab(tmp_path, capsys):
    pairs = tmp_path / "p.tsv"
    pairs.write_text("a\tb\nno tab here\n", encoding="utf-8")
    argv = ["train", "--model.name=test-seq2seq", "--task.name=translation", f"--task.source={pairs}"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "p.tsv:2: no tab" in err and err.startswith("error:")


def test_alignment_of_a_model_without_attention_is_refused(tmp_path, capsys):
    pairs = tmp_path / "p.tsv"
    pairs.write_text(_pairs(60), encoding="utf-8")
    out = tmp_path / "none"
    argv = ["train", "--model.name=test-seq2seq", "--model.attention=none", "--task.name=translation"]
    argv += [f"--task.source={pairs}", "--task.vocab_size=300", "--train.steps=2", "--train.progress=false"]
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "viz",
                "alignment",
                "--checkpoint",
                str(out),
                "--text",
                "the cat",
                "--out",
                str(tmp_path / "a.png"),
            ]
        )
        == 2
    )
    assert "has no attention" in capsys.readouterr().err and not (tmp_path / "a.png").exists()


def test_generate_refuses_an_encoder_decoder_and_names_the_checkpoint(run, capsys):
    out, _ = run
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--prompt", "the"]) == 2
    err = capsys.readouterr().err
    assert "step-00000150 (step 150, seq2seq model)" in err and "translate with `seqlab translate`" in err


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["compare", "--suite", "quick", "--minutes", "3"],
            "--minutes sets the translation and captioning suites'",
        ),
        (["compare", "--suite", "translation", "--mixers", "lstm"], "the translation suite has none"),
    ],
)
def test_compare_refuses_options_of_the_other_kind_of_suite(argv, message, capsys, monkeypatch):
    from seqlab import lab
    from seqlab.lab import translation

    def never_runs(*args, **kwargs):
        raise AssertionError("a suite started")

    monkeypatch.setattr(lab, "compare", never_runs)
    monkeypatch.setattr(translation, "compare_translation", never_runs)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_translate_inputs_are_checked_by_name(run, tmp_path, capsys):
    out, _ = run
    base = ["translate", "--checkpoint", str(out)]
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("el niño\n".encode("latin-1"))
    for extra, message in [
        (["--text", "a", "--file", str(latin)], "give --text or --file, not both"),
        (["--file", str(latin)], "is not UTF-8 text (byte 5)"),
        (["--file", str(tmp_path / "none.txt")], "No such file"),
        (["--file", str(tmp_path)], "not a file"),
    ]:
        capsys.readouterr()
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
    capsys.readouterr()
    assert main([*base, "--text", "the cat \udcff"]) == 2  # a non-UTF-8 byte in argv, as Python decodes it
    assert "--text is not valid UTF-8" in capsys.readouterr().err
    for beam in ("1001", "1000000000"):  # refused by the parser, not allocated
        with pytest.raises(SystemExit) as exc:
            main([*base, "--text", "the cat", "--beam", beam])
        assert exc.value.code == 2 and "a beam width from 1 to 1000" in capsys.readouterr().err


def test_translate_file_lines_match_the_output_lines(run, tmp_path, capsys, monkeypatch):
    """One line out per line in: blank lines stay blank, only newlines end a line (not U+2028 or a form feed),
    a byte-order mark is not part of the first sentence, and '-' reads standard input."""
    import io
    import sys

    out, _ = run
    base = ["translate", "--checkpoint", str(out), "--beam", "1"]
    assert main([*base, "--text", "the cat"]) == 0
    alone = capsys.readouterr().out.strip()
    text = "\ufeffthe cat\n\n  \nthe big dog\u2028sees a tree\r\nthe\x0cred house\n"
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    assert main([*base, "--file", str(src)]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == 5  # five lines in (the BOM line, 2 blank, 2 more)
    assert lines[0] == alone and lines[1] == lines[2] == "" and lines[3] and lines[4]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    assert main([*base, "--file", "-"]) == 0
    assert capsys.readouterr().out.split("\n") == lines


def test_a_long_file_prints_each_chunk_as_it_is_translated_with_the_same_lines(
    run, tmp_path, capsys, monkeypatch
):
    import seqlab.commands
    import seqlab.tasks.translation

    out, _ = run
    src = tmp_path / "in.txt"
    src.write_text("the cat\n\nthe big dog\nthe red house\n\n\nthe cat sees a tree\n", encoding="utf-8")
    base = ["translate", "--checkpoint", str(out), "--beam", "1", "--file", str(src)]
    assert main(base) == 0
    whole = capsys.readouterr().out
    printed, translate = [], seqlab.tasks.translation.translate

    def recorded(model, tok, texts, **kw):  # what was printed before each chunk's translation began
        printed.append(capsys.readouterr().out)
        return translate(model, tok, texts, **kw)

    monkeypatch.setattr(seqlab.commands, "TRANSLATE_CHUNK", 2)
    monkeypatch.setattr(seqlab.tasks.translation, "translate", recorded)
    assert main(base) == 0
    rest = capsys.readouterr().out
    # lines printed since the last chunk began: none; 1-2; 3-4 and the blank 5-6 (nothing to translate), then 7
    assert [p.count("\n") for p in printed] == [0, 2, 4] and rest.count("\n") == 1
    assert "".join(printed) + rest == whole  # the same lines as translated at once


def test_sentences_translated_to_nothing_are_counted_in_a_note(run, tmp_path, capsys, monkeypatch):
    """A wide beam on an undertrained model can return the empty translation (ending at once scores best): the
    blank output lines are then said to be the model's answer, not a lost line."""
    import seqlab.tasks.translation

    out, _ = run
    src = tmp_path / "in.txt"
    src.write_text("the cat\n\nthe big dog\nthe red house\n", encoding="utf-8")
    base = ["translate", "--checkpoint", str(out), "--beam", "7", "--file", str(src)]
    assert main(base) == 0
    assert "note:" not in capsys.readouterr().err  # the trained model translates every line
    translate = seqlab.tasks.translation.translate

    def some_empty(model, tok, texts, **kw):
        done = translate(model, tok, texts, **kw)
        return ["" if t == "the big dog" else y for t, y in zip(texts, done, strict=True)]

    monkeypatch.setattr(seqlab.tasks.translation, "translate", some_empty)
    assert main(base) == 0
    printed = capsys.readouterr()
    assert printed.out.split("\n")[1:3] == ["", ""]  # the blank line, then the empty translation
    assert "note: 1 of 3 sentence(s) translated to nothing" in printed.err and "--beam 7" in printed.err


def test_a_line_too_long_for_the_model_is_named_by_its_number(run, tmp_path, capsys):
    out, _ = run
    src = tmp_path / "in.txt"
    src.write_text("the cat\n\n" + "the cat " * 40 + "\nthe dog\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(out), "--file", str(src)]) == 2
    err = capsys.readouterr().err
    assert f"line 3 of {src} has" in err and "at most max_src_len=64" in err


def test_a_sentence_translates_the_same_whatever_shares_its_batch(run):
    """The default length limit is the sentence's own, so an untrained model (which never stops by itself)
    gives the same tokens for a sentence alone as beside a longer one."""
    from seqlab.tasks.translation import default_max_new_tokens, translate
    from seqlab.training.checkpoint import load_model, load_tokenizer

    out, _ = run
    model = load_model(out).eval()
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))  # no longer trained: no </s> in sight
    tok = load_tokenizer(out, "", model)
    short, long = "the cat", "the big red dog sees a small house and the tree runs"
    for beam in (1, 3):
        alone = translate(model, tok, [short], beam_size=beam)
        beside = translate(model, tok, [long, short], beam_size=beam)
        assert beside[1] == alone[0]
    assert default_max_new_tokens(3) == 32 and default_max_new_tokens(11) == 48


@pytest.mark.parametrize("model", ["test-seq2seq", "test-transformer"])
def test_a_sentence_longer_than_the_model_accepts_is_refused_before_step_1(tmp_path, capsys, model):
    """task.max_len (96 by default) kept a pair longer than the model's max_src_len / max_seq_len (64): the run
    failed at the step whose batch held it. Now refused before step 1, naming both settings."""
    pairs = tmp_path / "pairs.tsv"
    long = " ".join(EN[(i * 5) % len(EN)] for i in range(40))  # 66 tokens: within 96, past 64
    pairs.write_text(_pairs(60) + f"{long}\t{long}\n", encoding="utf-8")
    argv = ["train", f"--model.name={model}", "--task.name=translation", f"--task.source={pairs}"]
    argv += ["--task.vocab_size=300", "--train.steps=2", "--train.progress=false"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "task.max_len=96 keeps sentences of up to" in err and "set task.max_len=64" in err
    assert not (tmp_path / "a" / "checkpoints").exists() or not any(
        (tmp_path / "a" / "checkpoints").iterdir()
    )
    assert main([*argv, "--task.max_len=64", "--out", str(tmp_path / "b")]) == 0
