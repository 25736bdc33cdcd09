"""First-hour CLI habits: `seqlab train` alone prints its help instead of starting a run, its help lists every
registered task, and --resume names each given setting that the saved run overrides."""

import argparse
import logging

from seqlab.cli import main
from seqlab.run import settings_diff
from seqlab.tasks import list_tasks

RUN = [
    "train",
    "--model.name=test-lstm-lm",
    "--task.name=adding",
    "--task.seq_len=8",
    "--task.batch_size=4",
    "--train.eval_every=0",
    "--train.progress=false",
]


def test_train_alone_prints_help_and_starts_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train"]) == 2
    captured = capsys.readouterr()
    assert "usage: seqlab train" in captured.out and "--defaults" in captured.out
    assert "nothing to train" in captured.err
    assert not (tmp_path / "runs").exists()
    for name in list_tasks():
        assert name in captured.out.replace("\n", " "), name


def test_resume_names_the_settings_that_differ(tmp_path, caplog):
    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=4", "--out", out]) == 0
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert (
            main([*RUN, "--train.steps=6", "--train.lr=0.01", "--task.seq_len=9", "--out", out, "--resume"])
            == 0
        )
    (diff,) = [r.getMessage() for r in caplog.records if "resuming with the settings saved" in r.getMessage()]
    assert "task.seq_len: 8 -> 9" in diff and "train.lr:" in diff and "-> 0.01" in diff
    assert "train.steps" not in diff  # more steps is what a resume may change ...
    assert "train.steps changes from 4 to 6: the learning-rate schedule" in caplog.text  # ... with a warning
    # still in the 100-step warmup, step 5's rate is the same: said so, not as "x instead of x"
    assert " as before (in the warmup); the steps after it decay more slowly" in caplog.text


def test_a_longer_resume_past_the_warmup_names_the_rate_it_jumps_to(tmp_path, caplog):
    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=4", "--train.warmup_steps=0", "--out", out]) == 0
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert main([*RUN, "--train.steps=8", "--train.warmup_steps=0", "--out", out, "--resume"]) == 0
    assert "step 5 trains at 0.00" in caplog.text and " instead of " in caplog.text


def test_a_resume_may_raise_the_time_budget_and_change_the_device(tmp_path, caplog):
    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=6", "--train.max_minutes=0.00001", "--out", out]) == 0
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert main([*RUN, "--train.steps=6", "--train.max_minutes=10", "--train.device=cpu", "--out", out,
                     "--resume"]) == 0  # fmt: skip
    assert "resuming with the settings saved" not in caplog.text
    assert (tmp_path / "run" / "checkpoints" / "step-00000006").is_dir()  # ran to the end in one resume


def test_a_resume_on_another_thread_count_says_it_matches_to_rounding(tmp_path, caplog):
    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=4", "--train.threads=1", "--out", out]) == 0
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert main([*RUN, "--train.steps=4", "--train.threads=1", "--out", out, "--resume"]) == 0
        assert "threads" not in caplog.text
        assert main([*RUN, "--train.steps=6", "--train.threads=2", "--out", out, "--resume"]) == 0
    assert "resuming with train.threads 1 -> 2: float sums run in another order" in caplog.text
    assert "resuming with the settings saved" not in caplog.text  # a change a resume may make


def test_a_resume_that_leaves_out_a_setting_is_not_warned_about(tmp_path, caplog):
    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=4", "--train.save_every=2", "--out", out]) == 0
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert main([*RUN, "--train.steps=4", "--out", out, "--resume"]) == 0  # the saved save_every stands
    assert "resuming with the settings saved" not in caplog.text


def test_settings_diff_is_nested_and_names_unset_fields():
    saved = {"model": {"name": "a", "d_model": 8}, "train": {"lr": 0.1}}
    given = {"model": {"name": "a", "d_model": 16}, "train": {"lr": 0.1, "seed": 3}}
    assert settings_diff(saved, given) == ["model.d_model: 8 -> 16", "train.seed: '(unset)' -> 3"]
    # a setting the first run gave and the resume does not is no contradiction: the saved value stands, unsaid
    assert settings_diff({"train": {"lr": 0.1, "save_every": 10}}, {"train": {"lr": 0.1}}) == []


def test_params_does_not_invent_per_token_flops_for_image_encoders(capsys):
    assert main(["params", "video-lstm"]) == 0
    out = capsys.readouterr().out
    assert "video-lstm: 137,304 parameters" in out and "not given for the 'video' family" in out
    assert main(["params", "gpt-tiny"]) == 0
    assert "forward FLOPs per token at context" in capsys.readouterr().out


def _options_without_help(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options_without_help(sub, f"{path} {name}")
        elif not action.help and not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_option_of_every_command_has_help_text():
    from seqlab.cli import make_parser

    assert list(_options_without_help(make_parser(), "seqlab")) == []


def test_every_viz_picture_defaults_under_runs():
    from seqlab.cli import make_parser

    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    viz = next(a for a in sub.choices["viz"]._actions if isinstance(a, argparse._SubParsersAction))
    defaults = {
        name: next(a.default for a in p._actions if "--out" in a.option_strings)
        for name, p in viz.choices.items()
    }
    assert len(defaults) >= 7
    assert all(str(d).startswith("runs/viz/") for d in defaults.values()), defaults


def test_a_resume_with_an_overridden_setting_builds_the_task_once(tmp_path, caplog, monkeypatch):
    import seqlab.run

    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=4", "--out", out]) == 0
    built, build_task = [], seqlab.run.build_task
    monkeypatch.setattr(
        seqlab.run, "build_task", lambda run, *a: built.append(run["task"]) or build_task(run, *a)
    )
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert main([*RUN, "--train.steps=6", "--task.seq_len=9", "--out", out, "--resume"]) == 0
    assert "task.seq_len: 8 -> 9" in caplog.text
    assert [t["seq_len"] for t in built] == [8]  # the saved task only: data prepared once


def test_a_resume_refuses_a_misspelt_setting_as_a_new_run_does(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=4", "--out", out]) == 0
    capsys.readouterr()
    assert main([*RUN, "--train.steps=6", "--task.seq_lenn=9", "--out", out, "--resume"]) == 2
    assert "unknown argument(s) ['seq_lenn'] for task 'adding'" in capsys.readouterr().err
    assert main([*RUN, "--train.steps=6", "--model.d_modell=9", "--out", out, "--resume"]) == 2
    assert "d_modell" in capsys.readouterr().err
    assert main([*RUN, "--train.steps=6", "--train.lrr=1", "--out", out, "--resume"]) == 2
    assert "unknown train field(s) ['lrr']" in capsys.readouterr().err


def test_fewer_steps_on_a_resume_are_refused_before_any_word_on_the_schedule(tmp_path, capsys, caplog):
    out = str(tmp_path / "run")
    assert main([*RUN, "--train.steps=4", "--out", out]) == 0
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert main([*RUN, "--train.steps=2", "--out", out, "--resume"]) == 2
    assert "train.steps=2 is below the step 4" in capsys.readouterr().err
    assert "stretched" not in caplog.text


def test_a_pinned_thread_count_holds_while_the_task_prepares_its_data(tmp_path, monkeypatch):
    import torch

    import seqlab.run

    seen, build_task = [], seqlab.run.build_task
    monkeypatch.setattr(
        seqlab.run, "build_task", lambda run, *a: seen.append(torch.get_num_threads()) or build_task(run, *a)
    )
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main([*RUN, "--train.steps=2", "--train.threads=1", "--out", str(tmp_path / "run")]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


def test_a_copied_run_folder_resumes_in_its_new_place_unwarned(tmp_path, caplog):
    import shutil

    from seqlab.training.checkpoint import load_config, resolve_checkpoint

    assert main([*RUN, "--train.steps=2", "--out", str(tmp_path / "a")]) == 0
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        assert main([*RUN, "--train.steps=4", "--out", str(tmp_path / "b"), "--resume"]) == 0
    assert "resuming with the settings saved" not in caplog.text
    assert load_config(resolve_checkpoint(tmp_path / "b"))["run"]["out"] == str(tmp_path / "b")
