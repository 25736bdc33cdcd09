"""The ``seqlab`` command line: train, generate, translate, eval, compare, viz, params, list. The only module
that parses argv (the parsers and runners of translate, eval, params and viz alignment are in
:mod:`seqlab.commands`).

Each subcommand is a ``_cmd_*`` function registered on its parser with ``set_defaults(func=...)``. Errors:
a user's mistake (a ValueError from validation, a missing file or optional package, a diverging loss) is one
line ``error: ...`` and exit status 2; any other exception is a bug in seqlab (or a library it calls) and
shows its traceback with exit status 1. ``seqlab --debug ...`` shows the traceback of every error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from seqlab.commands import (
    add_eval,
    add_params,
    add_translate,
    add_viz_alignment,
    announce,
    compare_minutes_command,
)
from seqlab.commands_doctor import add_doctor
from seqlab.commands_export import add_export
from seqlab.commands_series import add_forecast
from seqlab.commands_speech import add_transcribe, add_viz_speech, compare_speech_command
from seqlab.commands_train import add_train
from seqlab.commands_video import add_viz_video, compare_video_command
from seqlab.commands_vision import add_caption, add_classify, add_viz_attention, add_viz_caption
from seqlab.console import escape_unencodable, escapes_note, out_of_memory, say
from seqlab.outfiles import add_out_file
from seqlab.run import (
    config_fields,
    int_at_least,
    names,
    non_negative_float,
    non_negative_int,
    one_of,
    positive_float,
    positive_int,
    probability,
    seed,
    split_overrides,
)

# ---- the commands -----------------------------------------------------------------------------------------


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from seqlab.training.checkpoint import load_model, load_tokenizer, resolve_checkpoint

    where = resolve_checkpoint(args.checkpoint)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this machine has no CUDA device; use --device cpu or auto")
    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    model = load_model(where, device=device)
    announce(where)
    tok = load_tokenizer(where, "it was not trained on text, nothing to sample", model)
    if getattr(model, "family", "") != "lm":
        hint = "; translate with `seqlab translate`" if model.family in ("seq2seq", "transformer") else ""
        raise ValueError(f"the model in {where} is a {model.family!r} model, not a language model{hint}")
    try:
        prompt = tok.encode(args.prompt)
    except ValueError as e:
        newline = args.prompt == "\n"
        given = " (the default prompt, a newline: this text has none; give --prompt)" if newline else ""
        raise ValueError(f"the prompt cannot be encoded{given}: {e}") from None
    if prompt.numel() == 0:
        raise ValueError("the prompt is empty; give at least one character, e.g. --prompt 'ROMEO:'")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    print(tok.decode(model.generate(prompt.to(device), args.max_new_tokens, **sampling, generator=gen)))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from seqlab.layers.mixer import mixer_table
    from seqlab.models import PRESETS, count_parameters, list_models
    from seqlab.tasks import list_tasks

    if not args.mixers:
        print(f"{'model':<26} {'family':<12} {'parameters':>16}   (vocab_size 256 unless the task sets it)")
        for name in list_models(args.pattern):
            print(f"{name:<26} {PRESETS[name][0]:<12} {count_parameters(name):>16,}")
        print("\ntasks: " + ", ".join(list_tasks()) + "\n")
    print("\n".join(mixer_table(config_fields)))
    return 0


def _cmd_viz_gradients(args: argparse.Namespace) -> int:
    import torch

    from seqlab.viz.gradients import gradient_flow_groups, plot_gradient_flow

    if args.threads:
        torch.set_num_threads(args.threads)
    groups = gradient_flow_groups(
        tuple(args.cells), args.length, args.d_model, args.train_steps, args.seed, progress=True
    )
    plot_gradient_flow(groups, args.out, title=f"gradient flow on the adding problem, T={args.length}")
    print("\n".join(r.summary() for group in groups for r in group))
    print(f"wrote {args.out}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import torch

    from seqlab.commands_doctor import require, suite_needs
    from seqlab.lab import OTHER_SUITES, SUITES, check_out_folder, compare, default_jobs

    require(suite_needs(args.suite, args.tasks), f"seqlab compare --suite {args.suite}")  # before any run
    check_out_folder(args.out)  # a folder of the user's files is refused, not written over
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.remeasure and args.suite in OTHER_SUITES:
        raise ValueError(
            f"--remeasure is for the {' and '.join(SUITES)} suites; the {args.suite} suite has no systems rows"
        )
    if args.suite in ("translation", "captioning"):
        return compare_minutes_command(args)
    if args.suite == "video":
        return compare_video_command(args)
    if args.suite == "speech":
        return compare_speech_command(args)
    if args.suite == "timeseries":
        from seqlab.commands_series import compare_timeseries_command

        return compare_timeseries_command(args)
    if args.minutes is not None:
        raise ValueError(
            "--minutes sets the translation and captioning suites' training time; the other suites count steps"
        )
    remeasure = tuple(args.remeasure or ())
    jobs = args.jobs or default_jobs()
    paths = compare(args.out, args.suite, args.mixers, args.tasks, args.seed, jobs=jobs, remeasure=remeasure)
    print("\n".join(paths["summary"]))
    return 0


def _cmd_viz_positions(args: argparse.Namespace) -> int:
    from seqlab.viz.positions import plot_positions

    out = plot_positions(args.out, args.positions, args.d_model, args.base, args.grid)
    print(f"wrote {out}")
    return 0


# ---- the parser -------------------------------------------------------------------------------------------


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a trained language model")
    g.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    g.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    g.add_argument(
        "--max-new-tokens", type=non_negative_int, default=500, help="tokens to sample (default 500)"
    )
    g.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy")
    g.add_argument(
        "--top-k", type=positive_int, default=None, help="sample only among the k most likely tokens"
    )
    g.add_argument(
        "--top-p",
        type=probability,
        default=None,
        help="nucleus sampling: only among the most likely tokens whose probabilities sum to p",
    )
    g.add_argument("--seed", type=seed, default=0, help="seed of the sampler (the same seed, the same text)")
    g.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when available"
    )
    g.set_defaults(func=_cmd_generate)


def _compare_epilog() -> str:
    """The suites, their tasks and the mixers, from the registries (``seqlab list`` reads the same ones)."""
    import textwrap

    from seqlab.lab.suite import OTHER_SUITES, SUITES
    from seqlab.layers.mixer import list_mixers

    def para(text: str) -> str:
        return textwrap.fill(text, 100, subsequent_indent="    ")

    lines = ["suites:"]
    for name, suite in SUITES.items():
        tasks = ", ".join(dict.fromkeys(e.task for e in suite.entries))
        lines.append(para(f"  {name}: {len(suite.entries)} task settings of every mixer; tasks: {tasks}"))
    lines += [para(f"  {name}: {about}") for name, about in OTHER_SUITES.items()]
    lines += ["", para(f"mixers (--mixers): {', '.join(list_mixers())}")]
    lines.append(
        para("`seqlab list --mixers` describes each; a second run in the same --out reuses finished runs.")
    )
    return "\n".join(lines)


def _add_compare(sub) -> None:
    from seqlab.lab.suite import suite_names

    c = sub.add_parser(
        "compare",
        help="the lab: RNN vs Transformer vs SSM, measured on this machine",
        description="Train every mixer on every task of a suite, measure speed and memory, write the table\n"
        "and plots. The first line says what will run (and for quick and full, how long it should take here).",
        epilog=_compare_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "--suite", default="quick", help=f"one of {', '.join(suite_names())}, described below (default quick)"
    )
    c.add_argument(
        "--minutes",
        type=positive_float,
        default=None,
        help="translation and captioning: minutes of training each (default 12)",
    )
    c.add_argument("--out", default="runs/compare", help="report directory; finished runs in it are reused")
    c.add_argument(
        "--mixers", type=names, help="comma-separated subset of the mixers listed below (default: all)"
    )
    c.add_argument("--tasks", type=names, help="comma-separated subset of the suite's tasks (listed below)")
    c.add_argument("--seed", type=seed, default=0, help="seed of the models and the data (default 0)")
    c.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads (default: PyTorch's choice)"
    )
    c.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="training runs at once, each in its own process with one thread (default: the usable CPU cores, "
        "at most 4; on 2 cores, 2 jobs take about half the wall time of 1); speed is still measured alone",
    )
    c.add_argument(
        "--remeasure",
        type=one_of(("systems",)),
        default=None,
        help="systems: measure the speed and memory rows again and train nothing, keeping the trained runs in "
        "--out (the replaced files stay as runs/*.json.prev); for a busy machine's noisy timings",
    )
    c.set_defaults(func=_cmd_compare, trains=True)


def _add_viz(sub) -> None:
    from seqlab.viz import GRADIENT_CELLS as CELLS

    viz = sub.add_parser("viz", help="pictures: gradient flow, positional encodings, attention maps")
    vsub = viz.add_subparsers(dest="viz_command", required=True)
    vg = vsub.add_parser(
        "gradients", help="plot |dL/dh_t| against t for RNN, LSTM and GRU (vanishing gradients)"
    )
    add_out_file(vg, "runs/viz/gradient-flow.png", "PNG file to write")
    vg.add_argument(
        "--length", type=int_at_least(2), default=100, help="sequence length T of the adding problem"
    )
    vg.add_argument("--train-steps", type=non_negative_int, default=0, help="also plot after this many steps")
    vg.add_argument(
        "--cells", type=one_of(CELLS), default=list(CELLS), help=f"comma-separated: {','.join(CELLS)}"
    )
    vg.add_argument("--d-model", type=positive_int, default=64, help="hidden size of each cell (default 64)")
    vg.add_argument("--seed", type=seed, default=0, help="seed of the weights and the data")
    vg.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    vg.set_defaults(func=_cmd_viz_gradients)

    add_viz_attention(vsub)

    vp = vsub.add_parser(
        "positions", help="the sinusoidal table and its similarities, RoPE's relative scores, 2-D patch codes"
    )
    add_out_file(vp, "runs/viz/positions.png", "PNG file to write")
    vp.add_argument("--positions", type=positive_int, default=128, help="positions to draw")
    vp.add_argument("--d-model", type=positive_int, default=64, help="channels (a multiple of 4)")
    vp.add_argument(
        "--base", type=positive_float, default=10000.0, help="the wavelength base (10000 in the papers)"
    )
    vp.add_argument(
        "--grid", type=positive_int, default=14, help="patch grid side for the 2-D codes (ViT-B/16: 14)"
    )
    vp.set_defaults(func=_cmd_viz_positions)
    add_viz_alignment(vsub)
    add_viz_caption(vsub)
    add_viz_video(vsub)
    add_viz_speech(vsub)


def _add_list(sub) -> None:
    ls = sub.add_parser("list", help="list model presets, tasks and token mixers")
    ls.add_argument("pattern", nargs="?", help="shell-style filter of the presets, e.g. 'lstm*'")
    ls.add_argument("--mixers", action="store_true", help="only the token mixers, with their config fields")
    ls.set_defaults(func=_cmd_list)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seqlab", description="Sequence models from RNNs to Transformers and SSMs."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    p.add_argument(
        "--debug", action="store_true", help="show the traceback of every error, user mistakes too"
    )
    p.set_defaults(takes_overrides=False, trains=False)
    from seqlab import __version__

    p.add_argument("--version", action="version", version=f"seqlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (add_train, _add_generate, add_translate, add_caption, add_classify, add_forecast, add_transcribe,
                add_eval, _add_compare, _add_viz, add_params, add_export, _add_list, add_doctor):  # fmt: skip
        add(sub)
    return p


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is the whole story for the user: validation, files, installs, divergence."""
    from seqlab.tasks.base import MissingDependencyError

    return (ValueError, OSError, MissingDependencyError, FloatingPointError)


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command; a user's mistake becomes one ``error:`` line and status 2, a bug its traceback."""
    try:
        from seqlab.kernels.build import disabled_reason

        disabled_reason("scan")  # a misspelt SEQLAB_DISABLE_KERNELS refused now, not at a kernel's first use
        if hasattr(args, "out_file_default"):  # a command that writes one file: never an existing one
            from seqlab.outfiles import fresh_file

            args.out = fresh_file(args.out, args.out_file_default)
        return args.func(args)
    except KeyboardInterrupt:  # outside the training loop (which saves and returns 130 itself)
        if args.debug:
            raise
        say("stopped by Ctrl-C")
        return 130
    except user_errors() as e:
        if args.debug:
            raise
        say(f"error: {e}")
        return 2
    except Exception as e:
        if args.debug:
            raise
        if (line := out_of_memory(e)) is None:  # else a bug: its traceback, then the line
            traceback.print_exc()
            line = (
                f"error: unexpected {type(e).__name__} (a bug in seqlab or a library it calls; the traceback "
            )
            line += "is above, and `seqlab --debug ...` raises it for a debugger)"
        say(line)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    rest, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    if not rest and not overrides:  # `seqlab` alone: the overview, not an error
        parser.print_help()
        return 0
    args = parser.parse_args(rest)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    if overrides and not args.takes_overrides:
        parser.error(f"unrecognized arguments: {' '.join(overrides)}")
    args.overrides = overrides
    args.argv = sys.argv[1:] if argv is None else list(argv)  # `train --nproc` hands it to torchrun
    if args.trains:  # a training process: keep freed memory for the next step
        from seqlab.training.allocator import keep_freed_memory

        keep_freed_memory()
    escape_unencodable()  # a sample in characters the terminal lacks is printed escaped, not lost
    status = _dispatch(args)
    if note := escapes_note():
        print(note, file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
