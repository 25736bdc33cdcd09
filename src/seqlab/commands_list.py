"""``seqlab list``: the model presets, the tasks and the token mixers, optionally filtered by a pattern.

The pattern is shell-style (``'lstm*'``, ``'*-tiny'``) and matched without regard to case; a plain word with no
wildcard matches names that contain it (``lstm`` is ``*lstm*``). It filters every section it prints: the presets,
the tasks and the mixers (with ``--mixers``, the mixers alone). A pattern that matches nothing is a mistake, most
likely a typo: exit status 2 and one ``error:`` line naming what exists, rather than an empty table with status
0 that a script cannot tell from success.
"""

from __future__ import annotations

import argparse
import fnmatch

__all__ = ["add_list", "matching"]


def matching(names: list[str], pattern: str | None) -> list[str]:
    """The ``names`` that ``pattern`` matches, case-insensitively; a pattern without ``*?[`` is a substring."""
    if pattern is None:
        return names
    wanted = pattern.lower()
    if not any(c in wanted for c in "*?["):
        wanted = f"*{wanted}*"
    return [n for n in names if fnmatch.fnmatchcase(n.lower(), wanted)]


def _mixer_lines(names: list[str]) -> list[str]:
    """The mixer table (``seqlab.layers.mixer.mixer_table``) cut to ``names``: a header, then two lines each."""
    from seqlab.layers.mixer import mixer_table
    from seqlab.run import config_fields

    table = mixer_table(config_fields)
    rows = {table[i].split()[0]: table[i : i + 2] for i in range(1, len(table), 2)}
    return [table[0]] + [line for name in names for line in rows[name]]


def _nothing_matches(pattern: str, mixers_only: bool, presets, tasks, mixers) -> ValueError:
    if mixers_only:
        return ValueError(f"no mixer matches {pattern!r}; the mixers: {', '.join(mixers)}")
    return ValueError(
        f"no preset, task or mixer matches {pattern!r} (matched without regard to case); the tasks: "
        f"{', '.join(tasks)}; the mixers: {', '.join(mixers)}; {len(presets)} presets: `seqlab list` shows them"
    )


def _cmd_list(args: argparse.Namespace) -> int:
    from seqlab.layers.mixer import list_mixers
    from seqlab.models import PRESETS, count_parameters
    from seqlab.tasks import list_tasks

    all_presets, all_tasks, all_mixers = sorted(PRESETS), list_tasks(), list_mixers()
    presets = [] if args.mixers else matching(all_presets, args.pattern)
    tasks = [] if args.mixers else matching(all_tasks, args.pattern)
    mixers = matching(all_mixers, args.pattern)
    if not (presets or tasks or mixers):
        raise _nothing_matches(args.pattern, args.mixers, all_presets, all_tasks, all_mixers)
    sections = []
    if presets:
        lines = [
            f"{'model':<26} {'family':<12} {'parameters':>16}   (vocab_size 256 unless the task sets it)"
        ]
        lines += [f"{n:<26} {PRESETS[n][0]:<12} {count_parameters(n):>16,}" for n in presets]
        sections.append("\n".join(lines))
    if tasks:
        sections.append("tasks: " + ", ".join(tasks))
    if mixers:
        sections.append("\n".join(_mixer_lines(mixers)))
    print("\n\n".join(sections))
    return 0


def add_list(sub) -> None:
    ls = sub.add_parser("list", help="list model presets, tasks and token mixers")
    ls.add_argument(
        "pattern",
        nargs="?",
        help="shell-style filter of every list, case-insensitive, e.g. 'lstm*'; a word without * ? [ matches "
        "the names containing it; nothing matched is an error (status 2)",
    )
    ls.add_argument(
        "--mixers",
        action="store_true",
        help="only the token mixers (the pattern filters them), with their fields",
    )
    ls.set_defaults(func=_cmd_list)
