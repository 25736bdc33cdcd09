"""`seqlab viz attention` on a GPT checkpoint trained for a few steps; `seqlab generate` on the same."""

import pytest
import torch

from seqlab.cli import main
from seqlab.models import create
from seqlab.tasks.text import CharTokenizer
from seqlab.viz.attention import write_attention_maps

TEXT = "".join(f"KING:\nline {i}, my lord, the quick brown fox.\n\n" for i in range(200))


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt")
    src = tmp / "play.txt"
    src.write_text(TEXT, encoding="utf-8")
    out = tmp / "run"
    args = ["train", "--model.name=test-gpt", "--task.name=text", f"--task.source={src}", "--task.seq_len=16"]
    args += ["--task.batch_size=4", "--task.sampling=random", "--train.steps=4", "--train.eval_every=4"]
    args += ["--train.eval_batches=1", "--train.progress=false", "--train.warmup_steps=1", "--out", str(out)]
    assert main(args) == 0
    return out


def test_viz_attention_writes_heatmaps(gpt_run, tmp_path, capsys):
    out = tmp_path / "maps"
    cmd = ["viz", "attention", "--checkpoint", str(gpt_run), "--text", "KING: my lord"]
    assert main([*cmd, "--layers", "0,1", "--heads", "0,3", "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["attention.png"]  # one overview: layers x heads
    assert "attention.png" in capsys.readouterr().out
    assert main([*cmd, "--layers", "0,1", "--heads", "0,3", "--out", str(out), "--per-head"]) == 2
    assert "already holds figures this command writes" in capsys.readouterr().err  # never overwritten
    (out / "attention.png").unlink()
    assert main([*cmd, "--layers", "0,1", "--heads", "0,3", "--out", str(out), "--per-head"]) == 0
    files = sorted(p.name for p in out.iterdir())
    heads = ["layer0-head0.png", "layer0-head3.png", "layer1-head0.png", "layer1-head3.png"]
    assert files == ["attention.png", *heads]
    assert all((out / f).read_bytes()[:4] == b"\x89PNG" for f in files)
    assert "and 4 per-head maps" in capsys.readouterr().out
    assert main([*cmd, "--layers", "5", "--out", str(tmp_path / "other")]) == 2
    assert "out of range" in capsys.readouterr().err


def test_generate_from_gpt_checkpoint(gpt_run, capsys):
    assert (
        main(["generate", "--checkpoint", str(gpt_run), "--prompt", "KING:", "--max-new-tokens", "20"]) == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("KING:") and len(text.rstrip("\n")) >= 20
    # far past the learned positions (max_seq_len 64): the context slides instead of failing
    assert (
        main(["generate", "--checkpoint", str(gpt_run), "--prompt", "KING:", "--max-new-tokens", "500"]) == 0
    )
    assert len(capsys.readouterr().out) == len("KING:") + 500 + 1  # print adds one newline


def test_write_attention_maps_api(tmp_path):
    torch.manual_seed(0)
    tok = CharTokenizer.from_text("abc ")
    model = create("test-gpt", vocab_size=tok.vocab_size)
    paths = write_attention_maps(model, tok, "abc cab", tmp_path, layers=[1], heads=[2])
    assert [p.name for p in paths] == ["attention.png"]
    paths = write_attention_maps(model, tok, "abc cab", tmp_path, layers=[0, 1], heads=[2], per_head=True)
    assert [p.name for p in paths] == ["attention.png", "layer0-head2.png", "layer1-head2.png"]
    with pytest.raises(ValueError, match="heads"):
        write_attention_maps(model, tok, "abc", tmp_path, layers=[0], heads=[9])
