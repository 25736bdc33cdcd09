"""Subcommands for speech models that :mod:`seqlab.cli` registers: ``seqlab transcribe`` (WAV files through a
trained keyword or CTC checkpoint), ``seqlab viz speech`` (an utterance's spectrogram above the model's
per-frame CTC posteriors, or its keyword probabilities) and ``seqlab compare --suite speech``.

    seqlab transcribe --checkpoint runs/digits one.wav two.wav        # the transcripts (prefix beam search)
    seqlab transcribe --checkpoint runs/digits --greedy one.wav       # the best path instead
    seqlab transcribe --checkpoint runs/words one.wav                 # a keyword model: 'seven (p = 0.93)'
    seqlab viz speech --checkpoint runs/digits one.wav --out fig.png
    seqlab viz speech --checkpoint runs/digits --test-item 3 --out fig.png   # an utterance of the test voices

A WAV file is read at any sample rate and channel count (resampled, channels averaged) and turned into the
features saved with the checkpoint; no corpus is needed. ``--test-item`` rebuilds the checkpoint's task from
its saved settings (a generated corpus comes from the cache, built first if it is gone). An option the
checkpoint's model cannot use (--beam-size or --greedy with a keyword model, which has no decoding to
choose) is refused before the model loads, never ignored.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from seqlab.commands import beam_width
from seqlab.outfiles import add_out_file
from seqlab.run import non_negative_int

__all__ = ["add_transcribe", "add_viz_speech", "compare_speech_command"]

SPEECH_TASKS = ("keywords", "speech_ctc")


def _speech_model(path: str):
    """(model in eval mode, the task description saved with it, checkpoint dir) of a speech checkpoint."""
    from seqlab.training.checkpoint import load_model

    task, where = _speech_checkpoint(path)
    return load_model(where).eval(), task, where


def _speech_checkpoint(path: str) -> tuple[dict, Path]:
    """(the task description saved with it, checkpoint dir) of a speech checkpoint; any other is an error."""
    from seqlab.commands import announce
    from seqlab.training.checkpoint import load_config, resolve_checkpoint

    where = resolve_checkpoint(path)
    config = load_config(where)
    task = config.get("task") or {}
    if config.get("family") != "speech" or task.get("name") not in SPEECH_TASKS:
        raise ValueError(
            f"{where} holds a {config.get('family', '?')!r} model trained on {task.get('name', '?')!r}; this "
            "command needs a 'speech' model trained on keywords or speech_ctc, e.g. `seqlab train "
            "--model.name=speech-lstm --task.name=speech_ctc`"
        )
    announce(where)
    return task, where


def _wav_features(path: str, task: dict) -> torch.Tensor:
    """A WAV file -> the checkpoint's features (t, m)."""
    from seqlab.tasks.speech_data import Features, read_wav

    features = Features(**task["features"])
    return features(read_wav(path, features.sample_rate))


@torch.no_grad()
def _outputs(model, task: dict, feats: torch.Tensor, beam_size: int) -> tuple[str, torch.Tensor]:
    """(the answer: a transcript, or 'word (p = ...)', the probabilities: (t', v) per frame or (K,))."""
    from seqlab.tasks.speech import transcribe_batch

    x, mask = feats[None], torch.ones(1, feats.size(0), dtype=torch.bool)
    logits = model(x, mask=mask)[0].float()
    if task["name"] == "keywords":
        probs = logits.softmax(-1)  # (K,)
        k = int(probs.argmax())
        return f"{task['class_names'][k]} (p = {probs[k]:.2f})", probs
    greedy, beam = transcribe_batch(model, x, mask, task["vocabulary"], task["units"], beam_size)[0]
    return (greedy if beam_size <= 1 else beam), logits.softmax(-1)


def _beam(args: argparse.Namespace, task: dict, where: Path) -> int:
    """The prefix beam search's width for ``transcribe`` (1: the best path). Decoding options the checkpoint's
    kind of model cannot use are refused before it loads: a keyword model picks the most probable word of
    the whole utterance (no beam search, no path to choose); --greedy with --beam-size is two answers to one
    question."""
    given = [
        o for o, v in (("--greedy", args.greedy), (f"--beam-size {args.beam_size}", args.beam_size)) if v
    ]
    if task["name"] == "keywords" and given:
        them = "them" if len(given) > 1 else "it"
        raise ValueError(
            f"{' and '.join(given)}: {where} holds a keyword-spotting model (task 'keywords'), which "
            "answers the most probable word of the whole utterance: it has no beam search and no path to "
            "choose (--greedy and --beam-size decode the transcripts of CTC models, task 'speech_ctc'); "
            f"drop {them}"
        )
    if len(given) == 2:
        raise ValueError(
            f"--greedy and --beam-size {args.beam_size} contradict: --greedy reads the best path (a beam of "
            "1), --beam-size sets the width of the prefix beam search; give one of them"
        )
    return 1 if args.greedy else args.beam_size or task.get("beam_size", 8)


def _cmd_transcribe(args: argparse.Namespace) -> int:
    from seqlab.tasks.speech_data import check_audio_file
    from seqlab.training.checkpoint import load_model

    for path in args.files:  # every file, before the model loads and the first one is decoded
        check_audio_file(path)
    task, where = _speech_checkpoint(args.checkpoint)
    beam = _beam(args, task, where)
    model = load_model(where).eval()
    # every file read (and refused) before the first is decoded
    feats = [_wav_features(path, task) for path in args.files]
    for path, x in zip(args.files, feats, strict=True):
        answer, _ = _outputs(model, task, x, beam)
        print(f"{path}\t{answer}")
    return 0


def add_transcribe(sub) -> None:
    t = sub.add_parser(
        "transcribe", help="WAV files through a trained speech checkpoint: transcripts or keywords"
    )
    t.add_argument("files", nargs="+", metavar="FILE.wav", help="audio files (any sample rate; mono or not)")
    t.add_argument(
        "--checkpoint", required=True, help="run directory or checkpoint directory of a speech model"
    )
    t.add_argument(
        "--beam-size",
        type=beam_width(),
        default=None,
        help="a CTC model's prefix beam search width (default: the task's); a keyword model has none",
    )
    t.add_argument(
        "--greedy",
        action="store_true",
        help="a CTC model's best path (greedy decoding) instead of the beam; not with --beam-size",
    )
    t.set_defaults(func=_cmd_transcribe)


# ---- seqlab viz speech ------------------------------------------------------------------------------------


def _test_item(args: argparse.Namespace, where: Path) -> tuple[torch.Tensor, str]:
    """(features (t, m), true transcript) of item ``--test-item`` of ``--split``, from the rebuilt task."""
    from seqlab.run import build_task
    from seqlab.training.checkpoint import load_config

    task = build_task({"task": load_config(where)["run"]["task"]}, saved=True)
    split = args.split or "test"
    utts = task.data[task.check_split(split)]
    if args.test_item >= len(utts):
        raise ValueError(
            f"--test-item {args.test_item}: the {split} split has {len(utts)} utterances (0..{len(utts) - 1})"
        )
    return utts.get(args.test_item), utts.texts[args.test_item]


def _cmd_viz_speech(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.test_item is None):
        raise ValueError(
            "give a WAV file or --test-item N (an utterance of the checkpoint's own data), one of them"
        )
    if args.split is not None and args.test_item is None:
        raise ValueError(
            f"--split {args.split} picks the split of --test-item N; a WAV file is in no split: drop --split"
        )
    model, task, where = _speech_model(args.checkpoint)
    if args.file is not None:
        feats, truth = _wav_features(args.file, task), None
    else:
        feats, truth = _test_item(args, where)
    answer, probs = _outputs(
        model, task, feats, task.get("beam_size", 8) if task["name"] == "speech_ctc" else 1
    )
    title = f"predicted: {answer}" if truth is None else f"true: {truth}\npredicted: {answer}"
    labels = task["class_names"] if task["name"] == "keywords" else task["vocabulary"]
    path = plot_speech(feats, probs, labels, args.out, task["features"], model.config.subsample, title)
    print(f"{title}\nwrote {path}")
    return 0


def _token_label(token: str) -> str:
    return {"<blank>": "∅ (blank)", " ": "␣ (space)"}.get(token, token)


def plot_speech(feats, probs, labels, out, features: dict, subsample: int, title: str) -> Path:
    """The spectrogram (t, m) above the per-frame posteriors (t', v) on one time axis in seconds, or above
    the class probabilities (K,) of a keyword model."""
    from seqlab.viz.figures import pyplot, save_figure

    plt = pyplot()
    hop = features["hop_length"] / features["sample_rate"]  # seconds per feature frame
    seconds = feats.size(0) * hop
    ctc = probs.dim() == 2
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        # 3 inches a second up to a minute (a 10-minute file made a PNG 198,003 pixels wide); longer audio is drawn
        # at that width, its frames narrower
        figsize=(min(max(7.0, 3.0 * seconds), 180.0), 6.5 if ctc else 5.5),
        height_ratios=[1.0, 1.3 if ctc else 1.0],
    )
    top.imshow(
        feats.T.numpy(), origin="lower", aspect="auto", cmap="magma", extent=(0, seconds, 0, feats.size(1))
    )
    top.set_ylabel("mel band")
    top.set_title(title, fontsize=9)
    if ctc:
        shown = [k for k in range(probs.size(1)) if k == 0 or float(probs[:, k].max()) > 0.05]
        width = probs.size(0) * subsample * hop
        bottom.imshow(
            probs[:, shown].T.numpy(),
            origin="lower",
            aspect="auto",
            cmap="Blues",
            vmin=0,
            vmax=1,
            extent=(0, width, -0.5, len(shown) - 0.5),
            interpolation="nearest",
        )
        bottom.set_yticks(range(len(shown)), [_token_label(labels[k]) for k in shown], fontsize=7)
        bottom.set_xlim(0, seconds)
        bottom.set_xlabel("time (s)")
        bottom.set_title("per-frame CTC posteriors p(token | x) (tokens above 0.05 somewhere)", fontsize=9)
    else:
        bottom.bar(range(len(labels)), probs.numpy(), color="tab:blue")
        bottom.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
        bottom.set_ylim(0, 1)
        bottom.set_ylabel("p(word | x)")
        top.set_xlabel("time (s)")
    return save_figure(fig, out)


def add_viz_speech(vsub) -> None:
    v = vsub.add_parser(
        "speech",
        help="an utterance's spectrogram above the per-frame CTC posteriors (or keyword probabilities)",
    )
    v.add_argument("file", nargs="?", metavar="FILE.wav", help="a WAV file (or --test-item N)")
    v.add_argument(
        "--checkpoint", required=True, help="run directory or checkpoint directory of a speech model"
    )
    v.add_argument(
        "--test-item", type=non_negative_int, default=None, help="an utterance of the checkpoint's data"
    )
    v.add_argument(
        "--split",
        choices=("train", "val", "test"),
        default=None,
        help="with --test-item: train, val or test (default: test)",
    )
    add_out_file(v, "runs/viz/speech.png", "PNG file to write")
    v.set_defaults(func=_cmd_viz_speech)


def compare_speech_command(args: argparse.Namespace) -> int:
    """``seqlab compare --suite speech``: every mixer (or ``--mixers``) on keywords and digit strings."""
    from seqlab.lab.speech import compare_speech

    if args.minutes is not None:
        raise ValueError(
            "--minutes sets the translation and captioning suites' time; the speech suite counts steps"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out if args.out != "runs/compare" else "runs/compare-speech"
    paths = compare_speech(out, args.mixers, args.tasks, jobs=args.jobs or 2, seed=args.seed)
    print(Path(paths["table"]).read_text(encoding="utf-8"))
    print(f"wrote {paths['results']}, {paths['table']} and {paths['plot']} in {paths['minutes']:.1f} min")
    return 0
