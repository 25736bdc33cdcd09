"""A run saved with a setting its data source ignores (allowed before such settings were refused) still
evaluates and resumes: the setting is warned about and kept as saved, while a new run giving it is refused."""

from __future__ import annotations

import json

from seqlab.cli import main
from seqlab.training.manifest import file_digest, read_manifest, write_manifest

PAIRS = "".join(f"the cat {w}\tel gato {w}\n" for w in ("runs", "eats", "sees", "sleeps", "jumps") * 12)


def _args(tmp_path, steps, *extra):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(PAIRS, encoding="utf-8")
    return [
        "train",
        "--model.name=test-seq2seq",
        "--task.name=translation",
        f"--task.source={pairs}",
        "--task.vocab_size=300",
        "--task.batch_size=8",
        f"--train.steps={steps}",
        "--train.warmup_steps=1",
        "--train.eval_batches=1",
        "--train.progress=false",
        "--out",
        str(tmp_path / "run"),
        *extra,
    ]


def _as_an_older_seqlab_saved_it(run, **settings):
    """``settings`` in the run's saved settings and description (and the manifest's digest of the file), as a
    run trained before they were refused holds them."""
    root = run / "checkpoints"
    entries = read_manifest(root)
    for name, entry in entries.items():
        config = root / name / "config.json"
        saved = json.loads(config.read_text(encoding="utf-8"))
        saved["run"]["task"].update(settings)
        saved["task"].update(settings)
        config.write_text(json.dumps(saved), encoding="utf-8")
        entry["files"]["config.json"] = file_digest(config)
    write_manifest(root, entries)


def test_a_saved_setting_its_source_ignores_is_warned_about_not_refused(tmp_path, capsys, caplog):
    assert main(_args(tmp_path, 2, "--task.src_lang=es")) == 2
    assert "task.src_lang='es' does not apply to a pairs file" in capsys.readouterr().err
    assert main(_args(tmp_path, 2)) == 0
    run = tmp_path / "run"
    _as_an_older_seqlab_saved_it(run, src_lang="es")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--beam", "0"]) == 0
    assert "test_nll" in json.loads(capsys.readouterr().out)
    said = "the run's saved settings: task.src_lang='es' does not apply to a pairs file"
    assert said in caplog.text and "kept as saved" in caplog.text
    caplog.clear()
    assert main([*_args(tmp_path, 3), "--resume"]) == 0
    assert said in caplog.text
    assert (run / "latest").read_text().strip().endswith("step-00000003")  # the run went on
