"""Subcommands for frame-sequence models that :mod:`seqlab.cli` registers: ``seqlab viz video`` (a clip as a
strip of frames with true and predicted labels, and a caption model's attention over the frames) and
``seqlab compare --suite video``.

The clip comes from the checkpoint's own task, rebuilt from the run settings saved with it (generated clips
are a pure function of their seed; a folder is read again): ``--split`` and ``--clip N`` choose it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from seqlab.outfiles import add_out_file
from seqlab.run import non_negative_int

__all__ = ["add_viz_video", "classify_clips", "compare_video_command"]


def _video_run(path: str):
    """(model, task) of a video checkpoint: the model in eval mode, the task rebuilt from the saved run."""
    from seqlab.commands import announce
    from seqlab.run import build_task
    from seqlab.training.checkpoint import load_config, load_model, resolve_checkpoint
    from seqlab.training.run_dir import check_same_description

    where = resolve_checkpoint(path)
    model = load_model(where).eval()
    if getattr(model, "family", None) != "video":
        raise ValueError(
            f"{where} holds a {getattr(model, 'family', '?')!r} model; viz video needs a 'video' model"
        )
    announce(where)
    config = load_config(where)
    task = build_task({"task": config["run"]["task"]}, saved=True)
    # the folder, read again, must be the one it trained on
    check_same_description(
        task, config.get("task", {}), ("class_names", "mean", "std"), f"the data of {where}"
    )
    return model, task


def classify_clips(args: argparse.Namespace, model, task: dict) -> int:
    """``seqlab classify`` for a video checkpoint: the ``--top`` actions of each clip, or, for a model of
    ``label='frames'``, an event per frame. Clips are fitted to the model's frame size and channels; every
    clip is read (and refused) before the first answer."""
    from seqlab.commands_vision import check_top, standardize, top_classes
    from seqlab.tasks.clip_files import read_clip

    label, c, names = task.get("label"), model.config, task["class_names"]
    if label not in ("action", "frames"):
        raise ValueError(
            f"{args.checkpoint} captions clips (label={label!r}); classify answers action and frames models"
        )
    if label == "frames" and args.top > 1:
        raise ValueError("--top applies to an action model; a frames model names one event per frame")
    check_top(args.top, names, args.checkpoint)
    for f in args.files:
        _check_npy(f)
    # each (t, c, s, s) uint8
    clips = [read_clip(f, frame_size=c.frame_size, channels=c.in_channels) for f in args.files]
    for f, clip in zip(args.files, clips, strict=True):
        if clip.size(0) != c.n_frames:
            raise ValueError(
                f"{f} has {clip.size(0)} frames; the model was trained on {c.n_frames}: trim or pad it"
            )
    for f, clip in zip(args.files, clips, strict=True):
        with torch.no_grad():
            probs = model(standardize(clip, task)[None])[0].softmax(-1)  # (K,) or (t, K)
        answer = " ".join(names[i] for i in probs.argmax(-1).tolist()) if label == "frames" else None
        print(f"{f}\t{answer or top_classes(probs, names, args.top)}")
    return 0


NPY_MAGIC = b"\x93NUMPY"


def _check_npy(name: str) -> None:
    """A ``.npy`` clip that is not one (a text file renamed) is refused by name; numpy took it for a pickle and
    advised ``allow_pickle``, which would run whatever the file holds."""
    path = Path(name)
    if path.suffix.lower() == ".npy" and path.is_file():
        with path.open("rb") as f:
            if f.read(len(NPY_MAGIC)) != NPY_MAGIC:
                raise ValueError(
                    f"{name} is not a .npy array file (it does not start with numpy's header); save a clip "
                    "with numpy.save, or give a folder of frame images"
                )


def _cmd_viz_video(args: argparse.Namespace) -> int:
    from seqlab.viz.video import plot_clip

    model, task = _video_run(args.checkpoint)
    clips = task.clips[task.check_split(args.split)]
    if args.clip >= len(clips):
        raise ValueError(
            f"--clip {args.clip}: the {args.split} split has {len(clips)} clips (0..{len(clips) - 1})"
        )
    frames = clips.frames[args.clip]  # (t, c, S, S) uint8

    def name(i: int) -> str:  # -1: a clip (or frame) the labels file left unlabelled
        return task.class_names[i] if i >= 0 else "(none)"

    kw: dict = {}
    if task.label == "frames":
        kw["true_labels"] = [name(i) for i in clips.events[args.clip].tolist()]
        kw["predicted"] = [name(i) for i in task.predict(model, frames[None])[0].tolist()]
        title = "frame events, true over predicted"
    elif task.label == "action":
        guess = name(int(task.predict(model, frames[None])[0]))
        title = f"action: true {name(int(clips.actions[args.clip]))}, predicted {guess}"
    else:
        title = _caption_title(model, task, frames, clips.captions[args.clip], kw)
    path = plot_clip(frames, args.out, title=title, **kw)
    print(f"{title}\nwrote {path}")
    return 0


def _caption_title(model, task, frames, truth: str, kw: dict) -> str:
    """The caption line of the figure; with an attentive decoder, the words and their attention into ``kw``."""
    x = task.prepare(frames[None])
    if model.config.attention == "soft":
        ids, alpha = model.generate(x, max_new_tokens=task.max_caption_len + 4, return_attention=True)
        from seqlab.tasks.captioning import generated_words

        kw["words"] = generated_words(ids[0], task.word_tokenizer.id_to_token)
        kw["attention"] = alpha[0, : len(kw["words"])]
    else:
        ids = model.generate(x, max_new_tokens=task.max_caption_len + 4)
    return f"true: {truth}\npredicted: {task.decode(ids[0])}"


def add_viz_video(vsub) -> None:
    v = vsub.add_parser(
        "video", help="a clip's frames with true and predicted labels (and a caption model's attention)"
    )
    v.add_argument(
        "--checkpoint", required=True, help="run directory or checkpoint directory of a video model"
    )
    v.add_argument(
        "--split", choices=("train", "val", "test"), default="test", help="the clip's split (default: test)"
    )
    v.add_argument("--clip", type=non_negative_int, default=0, help="the clip's index in the split")
    add_out_file(v, "runs/viz/video.png", "PNG file to write")
    v.set_defaults(func=_cmd_viz_video)


def compare_video_command(args: argparse.Namespace) -> int:
    """``seqlab compare --suite video``: every mixer (or ``--mixers``) on every task (or ``--tasks``)."""
    from seqlab.lab.video import compare_video

    if args.minutes is not None:
        raise ValueError(
            "--minutes sets the translation and captioning suites' time; the video suite counts steps"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out if args.out != "runs/compare" else "runs/compare-video"
    paths = compare_video(out, args.mixers, args.tasks, jobs=args.jobs or 2, seed=args.seed)
    print(Path(paths["table"]).read_text(encoding="utf-8"))
    print(f"wrote {paths['results']}, {paths['table']} and {paths['plot']} in {paths['minutes']:.1f} min")
    return 0
