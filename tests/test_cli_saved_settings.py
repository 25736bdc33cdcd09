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
    run trained before they were refused (or honoured) holds them."""
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


def test_a_captioned_files_run_that_read_every_image_past_its_n_train_evaluates_and_resumes(tmp_path, caplog):
    """Captioned files once read every image whatever n_train and n_eval said: such a run is rebuilt reading
    them all again (its saved description counts them), not cut to the caps it never trained with."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "tasks"))
    from test_data_edges import _caption_folder

    captions = _caption_folder(tmp_path, n=20)  # 16 train, 2 val, 2 test
    run = tmp_path / "run"
    argv = ["train", "--model.name=test-show-tell", "--task.name=captioning", "--task.source=folder"]
    argv += [
        f"--task.captions={captions}",
        "--task.image_size=16",
        "--task.batch_size=4",
        "--train.eval_batches=1",
    ]
    argv += ["--train.progress=false", "--out", str(run)]
    assert main([*argv, "--train.steps=2"]) == 0
    _as_an_older_seqlab_saved_it(run, n_train=4, n_eval=1)  # the description's n_images: all were read
    caplog.clear()
    assert main(["eval", "--checkpoint", str(run), "--beam", "0"]) == 0
    said = "task.n_train=4, but the run read all 16 train images of source='folder'"
    assert said in caplog.text and "task.n_eval=1, but the run read all 2 val images" in caplog.text
    assert main([*argv, "--train.steps=3", "--resume"]) == 0
    assert (run / "latest").read_text().strip().endswith("step-00000003")
    fresh = tmp_path / "fresh"  # a new run with the caps reads 4 and 1
    assert main([*argv[:-1], str(fresh), "--train.steps=1", "--task.n_train=4", "--task.n_eval=1"]) == 0
    config = json.loads(next(fresh.glob("checkpoints/step-*/config.json")).read_text(encoding="utf-8"))
    assert config["task"]["n_images"] == {"train": 4, "val": 1, "test": 1}
