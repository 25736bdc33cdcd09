"""``task.max_bytes`` from the command line: a pairs file over the limit is refused with a message that names the
setting, the setting raises the limit, and a run saved before the setting existed still evaluates and resumes."""

from __future__ import annotations

import json
import random

from seqlab.cli import main
from seqlab.training.manifest import file_digest, read_manifest, write_manifest

EN = ["the", "a", "cat", "dog", "sees", "eats", "big", "red", "house", "tree"]
ES = ["el", "un", "gato", "perro", "ve", "come", "grande", "rojo", "casa", "árbol"]


def _pairs_file(tmp_path, n: int = 200):
    rng, lines = random.Random(0), set()
    while len(lines) < n:
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(2, 6))]
        lines.add(" ".join(EN[i] for i in idx) + "\t" + " ".join(ES[i] for i in idx))
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(sorted(lines)) + "\n", encoding="utf-8")
    return path


def test_a_file_over_max_bytes_says_how_to_raise_it_and_the_setting_does(tmp_path, capsys):
    pairs = _pairs_file(tmp_path)
    size = pairs.stat().st_size
    argv = ["train", "--model.name=test-seq2seq", "--task.name=translation", f"--task.source={pairs}"]
    argv += ["--task.vocab_size=300", "--model.d_model=32", "--train.steps=4", "--train.eval_batches=1"]
    argv += ["--train.progress=false"]
    assert main([*argv, "--task.max_bytes=1000", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert (
        "over the limit of 1,000: " in err and f"--task.max_bytes={size}" in err and "read_pairs_tsv" in err
    )
    out = tmp_path / "b"
    assert main([*argv, f"--task.max_bytes={size}", "--out", str(out)]) == 0
    capsys.readouterr()
    # a run saved before task.max_bytes existed: no such field in its settings or its task's description
    entries = read_manifest(out / "checkpoints")
    for config in out.glob("checkpoints/step-*/config.json"):
        saved = json.loads(config.read_text(encoding="utf-8"))
        saved["run"]["task"].pop("max_bytes")
        saved["task"].pop("max_bytes")
        config.write_text(json.dumps(saved), encoding="utf-8")
        entries[config.parent.name]["files"]["config.json"] = file_digest(config)  # as seqlab wrote it
    write_manifest(out / "checkpoints", entries)
    assert main(["eval", "--checkpoint", str(out), "--beam", "0"]) == 0
    assert "test_nll" in json.loads(capsys.readouterr().out)
    resumed = [a if not a.startswith("--train.steps") else "--train.steps=6" for a in argv]
    assert main([*resumed, "--out", str(out), "--resume"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 6
