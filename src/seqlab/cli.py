"""The ``seqlab`` command line: train, generate, translate, eval, compare, viz, params, list. The only module
that parses argv (the parsers and runners of translate, eval, params and viz alignment are in
:mod:`seqlab.commands`, generate's and list's in their own ``commands_*`` modules).

Each subcommand is a ``_cmd_*`` function registered on its parser with ``set_defaults(func=...)``. Errors:
a user's mistake (a ValueError from validation, a missing file or optional package, a diverging loss) is one
line ``error: ...`` and exit status 2; any other exception is a bug in seqlab (or a library it calls) and
shows its traceback with exit status 1. ``seqlab --debug ...`` shows the traceback of every error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from seqlab.cli_values import int_in
from seqlab.commands import (
    add_eval,
    add_translate,
    add_viz_alignment,
    compare_minutes_command,
)
from seqlab.commands_attention import add_viz_attention
from seqlab.commands_doctor import add_doctor
from seqlab.commands_export import add_export
from seqlab.commands_generate import add_generate
from seqlab.commands_list import add_list
from seqlab.commands_params import add_params
from seqlab.commands_series import add_forecast
from seqlab.commands_speech import add_transcribe, add_viz_speech, compare_speech_command
from seqlab.commands_train import add_train
from seqlab.commands_video import add_viz_video, compare_video_command
from seqlab.commands_vision import add_caption, add_classify, add_viz_caption
from seqlab.console import escape_unencodable, escapes_note, out_of_memory, say
from seqlab.outfiles import add_out_file
from seqlab.run import (
    names,
    non_negative_int,
    one_of,
    positive_float,
    positive_int,
    seed,
    split_overrides,
)

# ---- the commands -----------------------------------------------------------------------------------------


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
        help="translation and captioning: minutes of training each, at most 1440 (default 12); every model "
        "trains at least 50 steps (the log says when that is more than the minutes)",
    )
    c.add_argument("--out", default="runs/compare", help="report directory; finished runs in it are reused")
    c.add_argument(
        "--mixers", type=names, help="comma-separated subset of the mixers listed below (default: all)"
    )
    c.add_argument("--tasks", type=names, help="comma-separated subset of the suite's tasks (listed below)")
    c.add_argument("--seed", type=seed, default=0, help="seed of the models and the data (default 0)")
    c.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads of the compare process (default: PyTorch's choice; the quick and full suites' runs "
        "too at --jobs 1); translation and captioning: each run's (default 1); speech, video and timeseries "
        "runs train on one thread each",
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
    from seqlab.viz.gradients import MAX_GRADIENT_CELLS, MAX_GRADIENT_D_MODEL, MAX_GRADIENT_LENGTH

    viz = sub.add_parser("viz", help="pictures: gradient flow, positional encodings, attention maps")
    vsub = viz.add_subparsers(dest="viz_command", required=True)
    vg = vsub.add_parser(
        "gradients", help="plot |dL/dh_t| against t for RNN, LSTM and GRU (vanishing gradients)"
    )
    add_out_file(vg, "runs/viz/gradient-flow.png", "PNG file to write")
    vg.add_argument(
        "--length",
        type=int_in(2, MAX_GRADIENT_LENGTH),
        default=100,
        help=f"sequence length T of the adding problem (2 ... {MAX_GRADIENT_LENGTH:,}; length x d-model at most "
        f"{MAX_GRADIENT_CELLS:,}, about 2.5 GB: every step is kept for its gradient)",
    )
    vg.add_argument("--train-steps", type=non_negative_int, default=0, help="also plot after this many steps")
    vg.add_argument(
        "--cells", type=one_of(CELLS), default=list(CELLS), help=f"comma-separated: {','.join(CELLS)}"
    )
    vg.add_argument(
        "--d-model",
        type=int_in(1, MAX_GRADIENT_D_MODEL),
        default=64,
        help=f"hidden size of each cell (default 64, at most {MAX_GRADIENT_D_MODEL:,})",
    )
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
    for add in (add_train, add_generate, add_translate, add_caption, add_classify, add_forecast, add_transcribe,
                add_eval, _add_compare, _add_viz, add_params, add_export, add_list, add_doctor):  # fmt: skip
        add(sub)
    return p


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is the whole story for the user: validation, files, installs, divergence."""
    from seqlab.tasks.base import MissingDependencyError

    return (ValueError, OSError, MissingDependencyError, FloatingPointError)


def _stdout_closed() -> bool:
    """Whether standard output's reader has gone; if so, it is pointed at /dev/null so that the interpreter's
    last flush on the way out does not fail again."""
    import select

    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if not any(ev & select.POLLERR for _, ev in poll.poll(0)):  # a pipe without a reader: POLLERR
            return False
    except (AttributeError, OSError, ValueError):  # no file behind it (captured), or no poll here
        return False
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return True


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command; a user's mistake becomes one ``error:`` line and status 2, a bug its traceback."""
    try:
        from seqlab.kernels.build import disabled_reason
        from seqlab.kernels.gemm import choice

        disabled_reason("scan")  # a misspelt SEQLAB_DISABLE_KERNELS refused now, not at a kernel's first use
        choice()  # and a SEQLAB_GEMM that is not one of its values
        if hasattr(args, "out_file_default"):  # a command that writes one file: never an existing one
            from seqlab.outfiles import fresh_file

            args.out = fresh_file(args.out, args.out_file_default)
        return args.func(args)
    except KeyboardInterrupt as e:  # outside the training loop (which saves and returns 130 itself)
        if args.debug:
            raise
        say(f"stopped by {getattr(e, 'signal_name', 'Ctrl-C')}")  # a compare's stop names its signal
        return getattr(e, "exit_status", 130)
    except BrokenPipeError as e:  # `seqlab list | head`: the reader stopped reading, not an error
        if args.debug or not _stdout_closed():
            say(f"error: {e}")
            return 2
        return 128 + 13  # as a shell reports a command stopped by SIGPIPE
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
