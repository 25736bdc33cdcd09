"""Dotted overrides from the command line (``--task.column=2020``) as the values of a run dict.

A value is read as a YAML scalar (``true``, ``3e-4``, ``[null, 20]``), except for a task field annotated as text
(``str``, ``str | None``: a CSV column, a file name), which keeps the text as typed, so a column named ``2020`` or
``yes`` and a file named ``1984`` stay strings; ``null`` still sets an optional one to None, and a value in
matching quotes is read as YAML (``'"2020"'`` is the string 2020). A value that is not valid YAML is a ValueError
naming the override.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["is_text_hint", "override_value", "parse_overrides", "parse_value"]

SECTIONS = ("model", "task", "train")
_TEXT_TYPES = {"str", "Path", "pathlib.Path", "os.PathLike"}
_NULLS = ("null", "Null", "NULL", "~")


def parse_value(text: str) -> Any:
    """YAML scalar, with numbers like ``3e-4`` (which YAML 1.1 reads as strings) read as floats."""
    value = yaml.safe_load(text) if text != "" else ""
    if isinstance(value, str):
        for conv in (int, float):
            try:
                return conv(value)
            except ValueError:
                pass
    return value


def is_text_hint(hint: Any) -> bool:
    """Whether an annotation (a type or, under ``from __future__ import annotations``, its text) is text only:
    ``str``, ``str | None``, a path; not a number, a flag, a list or a Literal."""
    if hint is None:
        return False
    names = getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint)
    parts = {p.strip() for p in str(names).split("|")} - {"None", "NoneType"}
    return bool(parts) and parts <= _TEXT_TYPES


def override_value(text: str, hint: Any, arg: str) -> Any:
    """The value of the override ``arg`` (its text ``text``) for a field annotated ``hint`` (None: unknown)."""
    text_field = is_text_hint(hint)
    if text_field and not (len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'"):
        return None if text in _NULLS and "None" in str(hint) else text
    try:  # a quoted text: the text inside, as YAML reads it
        return yaml.safe_load(text) if text_field else parse_value(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{arg}: not a valid value ({problem})") from None


def _task_hints(name: Any) -> dict[str, Any]:
    """The annotations of the task ``name``'s arguments; {} for no or an unknown task (named later)."""
    from seqlab.tasks import task_signature

    try:
        return {k: p.annotation for k, p in task_signature(name).parameters.items()}
    except (ValueError, TypeError):
        return {}


def parse_overrides(args: list[str], task_name: str | None = None) -> dict[str, Any]:
    """``['--model.n_layers=2', '--train.lr', '3e-3']`` -> ``{'model': {'n_layers': 2}, 'train': {'lr': 0.003}}``.

    ``task_name``: the run's task when no override names one (a run file's), whose text fields keep their text.
    """
    items, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ValueError(f"unrecognised argument {arg!r}; overrides look like --model.n_layers=2")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ValueError(f"override {arg!r} has no value (write {arg}=VALUE)")
            value, i = args[i + 1], i + 1
        section, _, field = key.partition(".")
        if section not in SECTIONS or not field or "." in field:
            raise ValueError(
                f"override {arg!r} must name a field of one of {list(SECTIONS)}, e.g. --train.steps=100"
            )
        items.append((section, field, value, f"--{key}={value}"))
        i += 1
    named = [override_value(v, None, a) for s, f, v, a in items if (s, f) == ("task", "name")]
    hints = _task_hints(named[-1] if named else task_name)
    out: dict[str, Any] = {}
    for section, field, value, arg in items:
        hint = hints.get(field) if section == "task" else None
        out.setdefault(section, {})[field] = override_value(value, hint, arg)
    return out
