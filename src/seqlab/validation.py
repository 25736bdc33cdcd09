"""Shared validators for config dataclasses: one check and one message per kind of field.

Every config's ``__post_init__`` calls these instead of writing its own copies, so a mistake reads the same
wherever it is made: the field, what was expected, what came.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal, get_args, get_origin, get_type_hints

__all__ = [
    "check_choices",
    "check_divisible",
    "check_dropout",
    "check_nonnegative",
    "check_positive_floats",
    "check_positive_ints",
    "check_special_ids",
]


@functools.cache
def _choices(cls: type) -> dict[str, tuple[Any, ...]]:
    hints = get_type_hints(cls)
    return {name: get_args(h) for name, h in hints.items() if get_origin(h) is Literal}


def check_choices(obj: Any, prefix: str = "") -> None:
    """Every ``Literal[...]`` field of a dataclass instance holds one of its choices."""
    for name, choices in _choices(type(obj)).items():
        if getattr(obj, name) not in choices:
            raise ValueError(f"{prefix}{name} must be one of {choices}, got {getattr(obj, name)!r}")


def check_positive_ints(obj: Any, names: tuple[str, ...], prefix: str = "", allow_none: bool = False) -> None:
    """Each field is an integer >= 1 (None passes when ``allow_none``)."""
    for name in names:
        v = getattr(obj, name)
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{prefix}{name} must be a positive integer, got {v!r}")


def check_positive_floats(
    obj: Any, names: tuple[str, ...], prefix: str = "", allow_none: bool = False
) -> None:
    """Each field is a finite number > 0 (None passes when ``allow_none``)."""
    for name in names:
        v = getattr(obj, name)
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{prefix}{name} must be a positive finite number, got {v!r}")


def check_nonnegative(
    obj: Any, names: tuple[str, ...], prefix: str = "", numbers: bool = False, hint: str = ""
) -> None:
    """Each field is None, or an integer >= 0 (with ``numbers``, a finite number >= 0); ``hint`` follows
    the expectation in the message, e.g. what 0 means."""
    for name in names:
        v = getattr(obj, name)
        if v is None:
            continue
        kinds = int | float if numbers else int
        if isinstance(v, bool) or not isinstance(v, kinds) or not math.isfinite(v) or v < 0:
            what = "a number" if numbers else "an integer"
            raise ValueError(f"{prefix}{name} must be {what} >= 0{hint}, got {v!r}")


def check_dropout(obj: Any, name: str = "dropout", prefix: str = "") -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < 1.0:
        raise ValueError(f"{prefix}{name} must be a probability in [0, 1), got {v!r}")


def check_divisible(d_model: int, n_heads: int, hint: str = "") -> None:
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}{hint}")


def check_special_ids(obj: Any, vocab_size: int, what: str = "the vocabulary") -> None:
    """``obj.pad_id``, ``bos_id`` and ``eos_id`` are three distinct ids in [0, vocab_size)."""
    ids = (obj.pad_id, obj.bos_id, obj.eos_id)
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"pad_id, bos_id and eos_id must be distinct ids of {what}, got {ids}")


def check_bool_fields(cls: type, fields: dict[str, Any], owner: str) -> None:
    """The fields of dataclass ``cls`` annotated ``bool`` get True or False (from YAML: true/false), not a
    string or a number that Python would read as true (``--model.bias=maybe`` was stored as given)."""
    for f in dataclasses.fields(cls):
        optional = f.type in ("bool | None", "Optional[bool]")
        if (f.type not in ("bool", bool) and not optional) or f.name not in fields:
            continue
        v = fields[f.name]
        if not isinstance(v, bool) and not (optional and v is None):
            either = "true, false or null" if optional else "true or false"
            raise ValueError(f"{owner}.{f.name} must be {either}, got {v!r}")
