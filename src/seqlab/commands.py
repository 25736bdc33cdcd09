"""Subcommands that :mod:`seqlab.cli` registers: ``seqlab translate``, ``eval``, ``viz alignment`` and
the translation and captioning suites of ``seqlab compare`` (the suites timed in minutes).

Part of :mod:`seqlab.cli` (which builds the parser and dispatches): each ``add_*`` adds one subcommand,
each ``_cmd_*`` runs it from the parsed arguments.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

from seqlab.console import said_if_slow, say
from seqlab.outfiles import add_out_file, check_writable
from seqlab.run import int_at_least, positive_int

__all__ = [
    "add_eval",
    "add_translate",
    "add_viz_alignment",
    "announce",
    "compare_minutes_command",
]

MAX_BEAM = 1000
"""The widest beam the commands take: a search holds (sentences x beam) decoder states at once."""


def beam_width(minimum: int = 1):
    """A beam width from ``minimum`` (0: no decoding) to :data:`MAX_BEAM`, as an argparse type."""

    at_least = int_at_least(minimum)

    def parse(text: str) -> int:
        try:
            value = at_least(text)
        except argparse.ArgumentTypeError:
            value = None
        if value is None or value > MAX_BEAM:
            raise argparse.ArgumentTypeError(
                f"must be a beam width from {minimum} to {MAX_BEAM} (the search holds sentences x beam decoder "
                f"states), got {text!r}"
            )
        return value

    return parse


def announce(where: Path) -> None:
    """Say on stderr which checkpoint a command read (stdout stays the command's output)."""
    from seqlab.training.checkpoint import load_config

    config = load_config(where)
    print(f"{where} (step {config.get('step', '?')}, {config.get('family', '?')} model)", file=sys.stderr)


def _translator(checkpoint: str):
    """(model, translation tokenizer, checkpoint dir) of an encoder–decoder checkpoint; errors say what is off."""
    from seqlab.tasks.tokenizers import TranslationTokenizer
    from seqlab.training.checkpoint import load_model, load_tokenizer, resolve_checkpoint

    where = resolve_checkpoint(checkpoint)
    model = load_model(where)
    announce(where)
    if not hasattr(model, "generate") or getattr(model, "family", "") not in ("seq2seq", "transformer"):
        raise ValueError(
            f"{where} holds a {getattr(model, 'family', type(model).__name__)!r} model; translation needs an "
            f"encoder–decoder (family 'seq2seq' or 'transformer') trained on the translation task"
        )
    tok = load_tokenizer(where, "it was not trained on the translation task", model)
    if not isinstance(tok, TranslationTokenizer):
        raise ValueError(f"{where} was not trained on the translation task: its tokenizer is {tok!r}")
    return model.eval(), tok, where


def _file_name(args: argparse.Namespace) -> str:
    return "standard input" if args.file == "-" else args.file


def _texts(args: argparse.Namespace) -> list[str]:
    """The sentences to translate: ``--text``, or ``--file``'s lines ('-': standard input), one per line as read,
    blank ones kept (as "") so that the output lines match the input's."""
    if args.file is not None and args.text is not None:
        raise ValueError("give --text or --file, not both")
    if args.file is not None:
        name = _file_name(args)
        if args.file == "-":
            data = sys.stdin.buffer.read()
        elif not (path := Path(args.file)).is_file():
            raise ValueError(f"--file {path}: {'No such file' if not path.exists() else 'not a file'}")
        else:
            data = path.read_bytes()
        try:
            text = data.decode("utf-8-sig")  # a byte-order mark is not part of the first sentence
        except UnicodeDecodeError as e:
            raise ValueError(f"--file {name} is not UTF-8 text (byte {e.start}); convert it first") from None
        lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]  # newlines only
        if not any(line.strip() for line in lines):
            raise ValueError(f"{name} holds no text to translate")
        return [line if line.strip() else "" for line in lines]
    if not args.text or not args.text.strip():
        raise ValueError("give a sentence to translate: --text '...' (or --file FILE, one per line)")
    try:
        args.text.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
        raise ValueError("--text is not valid UTF-8; give it in UTF-8 (or as a UTF-8 --file)") from None
    return [args.text]


TRANSLATE_CHUNK = 256
"""Lines of a --file translated (batched by length) before they are printed; what a line becomes never depends
on the lines beside it."""


def _cmd_translate(args: argparse.Namespace) -> int:
    from seqlab.tasks.translation import translate

    texts = _texts(args)  # read before the model loads
    model, tok, _ = _translator(args.checkpoint)
    if args.file is not None:
        _check_line_lengths(model, tok, texts, _file_name(args))
    empty = 0  # sentences translated to nothing
    for start in range(0, len(texts), TRANSLATE_CHUNK):  # a long file's lines print as each chunk is done
        part = texts[start : start + TRANSLATE_CHUNK]
        given = [t for t in part if t]
        done = iter(
            translate(model, tok, given, beam_size=args.beam, max_new_tokens=args.max_new_tokens)
            if given
            else ()
        )
        for text in part:
            out = next(done) if text else ""  # a blank line stays a blank line
            empty += bool(text) and not out.strip()
            print(out, flush=True)
    if empty:
        say(
            f"note: {empty} of {sum(map(bool, texts))} sentence(s) translated to nothing: the model scores "
            "ending at once above every translation the search found (an undertrained model often does, and a "
            f"wider beam finds that ending more often; --beam {args.beam}): train longer or try --beam 1"
        )
    return 0


def _check_line_lengths(model, tok, texts: list[str], name: str) -> None:
    """A line longer than the model accepts, named by its number before any line is translated."""
    from seqlab.tasks.parallel import source_limit

    field, limit = source_limit(model)
    for i, text in enumerate(texts, 1):
        if text and limit and (n := len(tok.source.encode(text)) + 1) > limit:
            raise ValueError(
                f"line {i} of {name} has {n} tokens (</s> included); this model accepts at most {field}={limit}: "
                "split it, or leave it out"
            )


def _cmd_viz_alignment(args: argparse.Namespace) -> int:
    from seqlab.tasks.translation import translate
    from seqlab.viz.attention import plot_alignment

    if not args.text.strip():
        raise ValueError("--text is empty: give the sentence whose alignment to draw")
    model, tok, where = _translator(args.checkpoint)
    if getattr(model.config, "attention", "") == "none":
        raise ValueError(
            f"the model in {where} has no attention (attention='none'): there is nothing to draw"
        )
    (line,), ((source, target, weights),) = translate(
        model, tok, [args.text], beam_size=args.beam, return_attention=True
    )
    path = plot_alignment(weights, source, target, args.out, title=f"{args.text}\n→ {line}")
    print(line)
    print(f"wrote {path}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from seqlab.run import build_task
    from seqlab.tasks.translation import TranslationTask
    from seqlab.training.checkpoint import load_config, load_model, resolve_checkpoint
    from seqlab.training.manifest import finite_or_none
    from seqlab.training.run_dir import check_same_data, saved_run

    _check_hypotheses_file(args.hypotheses)  # refused before the decoding
    where = resolve_checkpoint(args.checkpoint)
    run = saved_run(where, ("task",), "evaluate it from Python with task.evaluate(model)")
    _check_eval_options(args, run["task"].get("name"), where)
    model = load_model(where).eval()
    announce(where)
    task = build_task(run, saved=True, described=load_config(where).get("task"))
    check_same_data(task, where)
    if args.hypotheses is not None and not isinstance(task, TranslationTask):
        raise ValueError(
            f"--hypotheses is for translation checkpoints; {where} holds a {run['task']['name']!r} run"
        )
    split = args.split or ("test" if hasattr(task, "score") else "val")
    beam = 5 if args.beam is None else args.beam
    # an evaluation that decodes (captioning's) leaves its scores to task.score, below
    decodes = {"decode": False} if "decode" in inspect.signature(task.evaluate).parameters else {}
    with said_if_slow(f"evaluating on the {split} split"):
        metrics = task.evaluate(model, args.batches, split=split, **decodes)
    if hasattr(task, "score") and beam > 0:
        with said_if_slow(f"decoding the {split} split (beam {beam}) for its scores"):
            scored = task.score(model, split, beam_size=beam, limit=args.limit)
        metrics.update({f"{split}_{k}": v for k, v in scored.items() if isinstance(v, float)})
        others = {k: v for k, v in scored.items() if not isinstance(v, float) and k != "hypotheses"}
        if args.hypotheses is not None and "hypotheses" in scored:  # one decoded sentence per line
            Path(args.hypotheses).parent.mkdir(parents=True, exist_ok=True)
            with open(args.hypotheses, "x", encoding="utf-8") as f:  # "x": a file made meanwhile is kept
                f.write("".join(f"{h}\n" for h in scored["hypotheses"]))
        metrics.update({("sacrebleu" if k == "signature" else k): v for k, v in others.items()})
    rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}
    print(json.dumps(finite_or_none(rounded)))  # strict JSON: a metric with nothing to measure is null
    return 0


def _check_eval_options(args: argparse.Namespace, task: str | None, where: Path) -> None:
    """Options the run's task cannot use, refused before the model and the data are loaded (from its class)."""
    from seqlab.tasks import task_class
    from seqlab.tasks.text import CharLMTask

    cls = task_class(task)
    text = cls is CharLMTask  # one held-out part, val
    held_out = "--split val" if text else "--split val or --split test"
    if args.split == "heldout" and task != "captioning":
        raise ValueError(
            f"--split heldout is the captioning scenes' split of unseen pairs; {where} holds a {task!r} run: "
            f"use {held_out}"
        )
    if args.split == "test" and text:
        raise ValueError(
            f"a text run has one held-out part, val (the last task.val_fraction of the text), no test split; "
            f"{where} holds a {task!r} run: use --split val"
        )
    if args.hypotheses is not None and args.beam == 0:
        raise ValueError("--hypotheses writes the decoded sentences, and --beam 0 decodes none: drop one")
    given = [o for o, v in (("--beam", args.beam), ("--limit", args.limit)) if v is not None]
    if not hasattr(cls, "score") and given:  # the tasks eval decodes for scores have one
        raise ValueError(
            f"{' and '.join(given)} set{'s' if len(given) == 1 else ''} the decoding of translation and "
            f"captioning runs; {where} holds a {task!r} run, scored by its loss (--batches) only"
        )


def _check_hypotheses_file(name: str | None) -> None:
    """``eval --hypotheses``: a new file in a folder that exists or can be made, found before minutes of decoding."""
    if name is None:
        return
    path = Path(name)
    if path.exists():
        raise ValueError(f"--hypotheses {name} exists; seqlab does not overwrite files")
    check_writable(path, "--hypotheses")  # its folder exists or can be made, and takes a file


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    p.add_argument("--beam", type=beam_width(), default=5, help="beam size (1: greedy)")


def add_translate(sub) -> None:
    t = sub.add_parser("translate", help="translate sentences with a trained encoder–decoder")
    _add_decoding(t)
    t.add_argument("--text", help="the sentence to translate")
    t.add_argument(
        "--file",
        help="a UTF-8 text file, one sentence per line, '-' for standard input (instead of --text); one line "
        "out per line in, blank for blank",
    )
    t.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help="default, per sentence: 2 x (its source tokens + 1) + 10, rounded up to a multiple of 16",
    )
    t.set_defaults(func=_cmd_translate)


def add_eval(sub) -> None:
    e = sub.add_parser(
        "eval", help="score a checkpoint on its task's held-out data (BLEU and chrF for translation)"
    )
    e.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    e.add_argument(
        "--split",
        choices=("val", "test", "heldout"),
        default=None,
        help="default: test for translation and captioning, else val; heldout: the scenes' unseen pairs",
    )
    e.add_argument(
        "--batches",
        type=positive_int,
        default=1000,
        help="batches for the loss: a split of fixed examples (images, pairs, clips, series windows) stops at "
        "its end; text and generated tasks draw this many",
    )
    e.add_argument(
        "--beam",
        type=beam_width(0),
        default=None,
        help="translation, captioning: beam size (default 5; 1: greedy); 0 skips the beam search's scores",
    )
    e.add_argument(
        "--limit", type=positive_int, default=None, help="translation, captioning: score the first N only"
    )
    e.add_argument(
        "--hypotheses",
        default=None,
        metavar="FILE",
        help="translation: write the decoded sentences there, one per line (never overwritten)",
    )
    e.set_defaults(func=_cmd_eval)


def add_viz_alignment(vsub) -> None:
    va = vsub.add_parser(
        "alignment", help="source x target attention of a translation (Bahdanau et al. 2015, Figure 3)"
    )
    _add_decoding(va)
    va.add_argument("--text", required=True, help="the sentence to translate")
    add_out_file(va, "runs/viz/alignment.png", "PNG file to write")
    va.set_defaults(func=_cmd_viz_alignment)


def compare_minutes_command(args: argparse.Namespace) -> int:
    """The suites that give each contender the same minutes: translation and captioning."""
    if args.mixers or args.tasks:
        raise ValueError(
            f"--mixers and --tasks choose runs of the quick and full suites; the {args.suite} suite has none"
        )
    if args.suite == "translation":
        from seqlab.lab.translation import compare_translation as run_suite
    else:
        from seqlab.lab.captioning import compare_captioning as run_suite
    out = args.out if args.out != "runs/compare" else f"runs/compare-{args.suite}"
    paths = run_suite(out, args.minutes or 12.0, args.jobs or 2, args.seed, threads=args.threads)
    print(Path(paths["table"]).read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
