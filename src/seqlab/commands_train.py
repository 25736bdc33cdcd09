"""``seqlab train``: the run file and dotted overrides merged, the run directory checked (never overwritten, a
resume only where a checkpoint is), the model and task built, the trainer run; with nothing given, the help."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import textwrap
from pathlib import Path

__all__ = ["add_train"]

TRAIN_HELP = """\
Train a model on a task. Settings come from an optional YAML run file, then dotted overrides:

  seqlab train configs/lstm-shakespeare.yaml
  seqlab train --model.name=gru-lm-small --task.name=shakespeare --train.steps=3000
  seqlab train --model.name=lstm-lm-small --task.name=text --task.source=my.txt --out runs/mine
  seqlab train configs/lstm-shakespeare.yaml --out runs/demo --resume     # continue an interrupted run
  seqlab train configs/lstm-shakespeare.yaml --nproc 2                    # 2 processes (DDP, torchrun)
  torchrun --standalone --nproc_per_node 2 -m seqlab train configs/lstm-shakespeare.yaml   # the same, by hand

Sections: model (name: a preset from `seqlab list`, then config fields), task (name: {tasks}; then its
arguments), train (steps, lr, warmup_steps, weight_decay, grad_clip, grad_accum, eval_every, save_every,
max_minutes, seed, device, strategy, precision, loggers, ...). With neither a run file nor overrides, `--defaults` trains lstm-lm-small on
Shakespeare (about 17 minutes on 2 cores).
"""


def _load_train_run(args: argparse.Namespace) -> tuple[dict, Path]:
    """The merged run dict and its directory; refuses to overwrite a run or to resume a missing one."""
    from seqlab.run import resolve_run
    from seqlab.training.checkpoint import holds_run

    run, out = resolve_run(args.run_file, args.overrides, args.out)
    has_ckpt = holds_run(out)  # not 'latest' alone: checkpoints without it are a run too
    if args.resume and not has_ckpt:
        raise ValueError(f"--resume given but {out} holds no checkpoint to resume from")
    if has_ckpt and not args.resume:
        raise ValueError(
            f"{out} already holds a run; pass --resume to continue it, or choose another "
            f"--out (nothing is overwritten)"
        )
    return run, out


# train settings a resume may change: the length and budget of the run, where and how it runs, what it shows
# and keeps. Of these, steps stretch the schedule (warned), and threads (or a device) change the order of
# float sums, so the continued run matches an uninterrupted one to rounding, not bit for bit (threads: said)
RESUME_MAY_CHANGE = ("steps", "max_minutes", "device", "threads", "progress", "loggers", "keep_checkpoints")


def _say_what_a_resume_changes(saved: dict, given: dict, where: Path) -> None:
    """The train settings a resume may change, each said where it changes what the run computes."""
    _warn_if_schedule_stretches(saved, given, where)
    _say_if_rounding_changes(saved, given)


def _say_if_rounding_changes(saved: dict, given: dict) -> None:
    """A resume on another thread count: the sums of each step run in another order."""
    if "threads" in given and given["threads"] != saved.get("threads"):  # None: PyTorch's default, governed
        logging.getLogger("seqlab").warning(
            "resuming with train.threads %s -> %s: float sums run in another order, so the continued run matches "
            "an uninterrupted one to rounding (about 1e-7 in float32), not bit for bit",
            saved.get("threads"),
            given["threads"],
        )


def _warn_if_schedule_stretches(saved: dict, given: dict, where: Path) -> None:
    """More steps on a resume stretch the cosine schedule over the new length: say so, with the jump it makes."""
    import dataclasses

    from seqlab.training import TrainConfig
    from seqlab.training.checkpoint import load_trainer_state
    from seqlab.training.optim import lr_at

    c = {f.name: f.default for f in dataclasses.fields(TrainConfig)} | saved  # (not built: no device checks)
    steps = given.get("steps", c["steps"])
    if steps == c["steps"]:
        return
    step = int(load_trainer_state(where)["step"])
    if steps < step:  # refused before anything is built or said about the schedule
        raise ValueError(
            f"train.steps={steps} is below the step {step} of the checkpoint {where}; "
            f"pass train.steps >= {step} to continue this run"
        )
    min_lr = c["min_lr"] if c["min_lr"] is not None else c["lr"] / 10
    rate = [lr_at(step, c["lr"], n, c["warmup_steps"], min_lr) for n in (c["steps"], steps)]
    same = abs(rate[1] - rate[0]) <= 1e-9 * max(abs(rate[0]), 1e-30)  # still warming up: no jump yet
    jump = "the steps after it decay more slowly" if steps > c["steps"] else "the steps after it decay faster"
    logging.getLogger("seqlab").warning(
        "train.steps changes from %d to %d: the learning-rate schedule (cosine to min_lr at the last step) is "
        "stretched over the new length, so step %d trains at %s",
        c["steps"],
        steps,
        step + 1,
        f"{rate[1]:.3g} as before (in the warmup); {jump}"
        if same
        else f"{rate[1]:.3g} instead of {rate[0]:.3g}",
    )


def _resumed_run(run: dict, where: Path, out: Path) -> dict:
    """The settings a resume runs with: those saved with the checkpoint ``where``, but for the train settings of
    RESUME_MAY_CHANGE given in ``run``; other settings given that differ are named in a warning, after the names
    are checked as a fresh run checks them (a misspelt field is an error, not a difference)."""
    from seqlab.run import check_names, settings_diff
    from seqlab.training.run_dir import saved_run

    resume_in_python = "resume it from Python: Trainer(model, task, config, out_dir).fit(resume=True)"
    saved = saved_run(where, ("model", "task", "train"), resume_in_python)
    _say_what_a_resume_changes(saved["train"], run["train"], where)
    saved["train"].update({k: v for k, v in run["train"].items() if k in RESUME_MAY_CHANGE})
    saved["out"] = run["out"]  # where the run is now (a folder may be moved or copied)
    if saved != run:
        check_names(run)
        if changes := "; ".join(settings_diff(saved, run)):  # settings given that the saved ones override
            logging.getLogger("seqlab").warning(
                "resuming with the settings saved in %s, not (saved -> given) %s", out, changes
            )
    return saved


def _sets_anything(run_file: str) -> bool:
    """Whether the run file sets a model, task or train field (an empty file, comments or only 'out' do not)."""
    from seqlab.run import load_run_file

    return any(load_run_file(run_file).get(section) for section in ("model", "task", "train"))


def _launch(args: argparse.Namespace, out: Path) -> int:
    """``--nproc N``: the same command in N processes through torchrun's launcher (torch.distributed.run).

    torchrun runs in a session of its own, so a Ctrl-C reaches this process only, which hands it to the
    training processes (not to torchrun, which would kill them): they finish the step, save, and stop together.
    SIGTERM and SIGHUP (kill, a job scheduler's cancel, a closed terminal) are handed on the same way.
    """
    import signal
    import subprocess

    argv = [a for a in args.argv if a != f"--nproc={args.nproc}"]
    if "--nproc" in argv:
        i = argv.index("--nproc")
        del argv[i : i + 2]
    # --standalone: a rendezvous on a free local port, so two runs on one machine do not both take 29500
    cmd = ["--standalone", "--nproc_per_node", str(args.nproc), "-m", "seqlab", *argv]
    stopped: list[int] = []
    proc: subprocess.Popen | None = None

    def stop(signum: int, frame=None) -> None:  # the training processes save and stop together
        stopped.append(signum)
        ranks = [] if proc is None else _children(proc.pid)
        for pid in ranks:
            os.kill(pid, signal.SIGINT)
        if proc is not None and not ranks:  # torchrun has started none yet: it stops, with nothing to save
            proc.terminate()

    # installed before torchrun starts: a signal at any moment stops the training too (it runs in a session of
    # its own, which neither the terminal's Ctrl-C nor a kill of this process reaches)
    before = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        print(f"torchrun {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *cmd], start_new_session=True)
        if stopped:  # a signal came while it started
            proc.terminate()
        status = proc.wait()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if stopped:
        from seqlab.training.checkpoint import holds_run

        name = "Ctrl-C" if stopped[0] == signal.SIGINT else signal.Signals(stopped[0]).name
        then = (
            "continue with the same command and --resume"
            if holds_run(out)
            else ("it saved no checkpoint yet, so there is nothing to resume: run the same command again")
        )
        print(f"stopped by {name}; {then}", file=sys.stderr)
        return 128 + stopped[0]
    if status:
        print(
            f"error: a training process failed (its error is above); torchrun exited {status}",
            file=sys.stderr,
        )
    return 1 if status else 0


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _check_before_launch(run: dict, args: argparse.Namespace) -> None:
    """What one process would refuse at once, refused before torchrun starts N of them (each would print it,
    with torchrun's traceback): the model and task named, the train settings, the batch (given or the task's
    default) split evenly over the processes, and as many GPUs as processes."""
    import torch

    from seqlab.run import run_names, train_config
    from seqlab.tasks import task_signature

    n, task, (_, task_name) = args.nproc, run.get("task") or {}, run_names(run)
    device = {} if args.device is None else {"device": args.device}
    config = train_config({"train": {**(run.get("train") or {}), **device}})
    default = task_signature(task_name).parameters.get("batch_size")
    batch = task.get("batch_size", None if default is None else default.default)
    if isinstance(batch, int) and batch % n:
        raise ValueError(
            f"task.batch_size={batch} cannot be split over --nproc {n} processes without overlap; "
            f"choose a batch size divisible by {n}"
        )
    device = config.resolved_device()
    if device.type == "cuda" and n > 1 and (device.index is not None or n > torch.cuda.device_count()):
        raise ValueError(
            f"--nproc {n} on CUDA takes one GPU per process: this machine has {torch.cuda.device_count()}"
            + (f", and train.device={config.device} names one for all" if device.index is not None else "")
            + "; train on the CPU with --device cpu"
        )


def _cmd_train(args: argparse.Namespace) -> int:
    if args.nproc is not None and "WORLD_SIZE" not in os.environ:
        # the run file, overrides and --out checked here, once, before torchrun starts N processes
        run, out = _load_train_run(args)
        _check_before_launch(run, args)
        return _launch(args, out)
    if args.device is not None:
        args.overrides = [*args.overrides, f"--train.device={args.device}"]
    main = int(os.environ.get("RANK", 0)) == 0
    if not main:  # one voice: rank 0 reports, the others only warn
        logging.getLogger("seqlab").setLevel(logging.WARNING)
    try:
        return _train(args, main)
    finally:
        from seqlab.training.distributed import teardown

        teardown()


def _train(args: argparse.Namespace, main: bool) -> int:
    from seqlab.models import count_parameters
    from seqlab.run import build_run
    from seqlab.training import Trainer
    from seqlab.training.checkpoint import load_config, resumable_checkpoint
    from seqlab.training.run_dir import check_same_data

    if not (args.run_file or args.overrides or args.defaults or args.resume):
        args.parser.print_help()
        print(
            "\nerror: nothing to train: give a run file, --model.name=... overrides, or --defaults",
            file=sys.stderr,
        )
        return 2
    run, out = _load_train_run(args)
    if (
        args.run_file
        and not (args.overrides or args.defaults or args.resume)
        and not _sets_anything(args.run_file)
    ):
        raise ValueError(
            f"{args.run_file} sets nothing to train (no model, task or train section); fill it in, or pass "
            "--defaults to train the defaults (lstm-lm-small on Shakespeare, about 17 minutes on 2 cores)"
        )
    where = resumable_checkpoint(out) if args.resume else None  # the newest complete, verified one
    if where is not None:  # the run's own settings win, so that the continuation is exact; steps may grow
        run = _resumed_run(run, where, out)
    described = None if where is None else load_config(where).get("task")
    model, task, train = build_run(  # built once: a task's data may take minutes to prepare
        run, saved=where is not None, described=described
    )
    if where is not None:
        check_same_data(task, where)
    trainer = Trainer(model, task, train, out, run)
    if main:
        world = f", {trainer.world.size} processes ({train.strategy})" if trainer.world.size > 1 else ""
        print(
            f"model {run['model']['name']} ({count_parameters(model):,} parameters), task {task.name}, "
            f"{train.steps} steps on {trainer.device}{world} -> {out}",
            flush=True,
        )
    summary = trainer.fit(resume=where or False)
    if main:
        print(
            # 4 significant digits: a series in units of 1e-5 keeps its MAE (4 decimals printed 0.0)
            json.dumps({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in summary.items()}),
            flush=True,
        )
    if not summary.get("interrupted") or "TORCHELASTIC_RUN_ID" in os.environ:
        return 0  # a rank's saved stop is not a failure for torchrun to report: `--nproc` says it was interrupted
    # as a shell reports a command a signal stopped
    return 128 + signal.Signals[summary.get("signal", "SIGINT")]


def add_train(sub) -> None:
    from seqlab.run import positive_int
    from seqlab.tasks import list_tasks

    t = sub.add_parser(
        "train",
        help="train a model on a task",
        description=TRAIN_HELP.format(tasks=textwrap.fill(", ".join(list_tasks()), 100)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("run_file", nargs="?", help="YAML run file (optional)")
    t.add_argument("--out", help="run directory (default: the run file's 'out', else runs/MODEL-TASK)")
    t.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    t.add_argument("--defaults", action="store_true", help="train the defaults when nothing else is given")
    t.add_argument(
        "--nproc",
        type=positive_int,
        help="train in N processes with DDP (train.strategy=fsdp shards instead), launched through torchrun",
    )
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), help="shorthand for --train.device")
    t.set_defaults(func=_cmd_train, takes_overrides=True, trains=True, parser=t)
