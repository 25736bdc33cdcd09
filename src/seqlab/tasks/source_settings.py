"""Settings that shape one data source only, refused by name when given for another (``refuse_unused``).

A task that reads either generated data or a user's files takes the settings of both in one constructor; a
setting of the other source would change nothing, and a user who sets it believes it did. So a value other
than the constructor's default is refused before any data is read or generated, with what the setting does
and what the chosen source reads instead. The default itself passes: a run's saved settings
(``Task.describe``) hold every setting, the other source's at their defaults, and rebuild the same task.

A run saved before such a setting was refused may hold one at another value. Its settings are rebuilt
inside :func:`rebuilding_saved` (``seqlab eval``, ``--resume``, the ``viz`` of a checkpoint, ``seqlab
forecast``): there the refusal is a warning and the setting stays as saved, changing nothing now as it changed
nothing then, so the run and its description load as they were trained. Other refusals of settings that once
trained (a series' feature named twice, say) take the same way with :func:`refuse`, each saying what the
rebuilt task does, as training did.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("seqlab.tasks")

__all__ = ["is_given", "rebuilding_saved", "refuse", "refuse_unused", "saved_description"]

_SAVED = contextvars.ContextVar("seqlab_rebuilding_saved", default=False)
_DESCRIBED: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "seqlab_saved_description", default=None
)


@contextlib.contextmanager
def rebuilding_saved(saved: bool = True, described: dict[str, Any] | None = None) -> Iterator[None]:
    """Within it (``saved``), a task is rebuilt from a run's saved settings: :func:`refuse` warns instead, and
    ``described``, the run's saved task description (``Task.describe``, where the caller has it), tells the
    task what training read (:func:`saved_description`)."""
    tokens = _SAVED.set(saved), _DESCRIBED.set(described if saved else None)
    try:
        yield
    finally:
        _SAVED.reset(tokens[0])
        _DESCRIBED.reset(tokens[1])


def saved_description() -> dict[str, Any] | None:
    """The saved task description of the run being rebuilt (:func:`rebuilding_saved`), or None: a task whose
    settings came to mean more since (captioned files' ``n_train``) reads from it what the run trained on."""
    return _DESCRIBED.get()


def refuse(message: str, saved: str = "kept as saved: they changed nothing in training either") -> None:
    """A ValueError saying ``message`` (a setting refused now), or, while :func:`rebuilding_saved` a run trained
    with it, a warning followed by ``saved``: what the rebuilt task does with it, as training did (by default:
    a setting of another source, ignored then too)."""
    if not _SAVED.get():
        raise ValueError(message)
    log.warning("the run's saved settings: %s (%s)", message, saved)


def is_given(value: Any, default: Any) -> bool:
    """Whether ``value`` differs from the constructor's ``default`` (True for a bool against a number, and for
    a value that cannot be compared with it)."""
    if isinstance(value, bool) != isinstance(default, bool):
        return True
    try:
        return bool(value != default)
    except (TypeError, ValueError, RuntimeError):  # an array's elementwise comparison: no single truth value
        return True


def refuse_unused(
    owner: type,
    source: str,
    values: dict[str, Any],
    reasons: dict[str, str],
    data: str,
    field: str = "source",
    prefix: str = "task.",
) -> None:
    """A ValueError naming every setting of ``values`` (name -> value) given other than its default in
    ``owner``'s constructor, in its order, as ``{prefix}{name}={value}``: each with ``reasons[name]`` (what it
    sets, "sets ..."), then ``data`` (what ``{field}={source}`` reads instead); nothing when all are at their
    defaults."""
    params = inspect.signature(owner.__init__).parameters
    given = {k: values[k] for k in params if k in values and is_given(values[k], params[k].default)}
    if not given:
        return
    named = [f"{prefix}{k}={v!r}" for k, v in given.items()]
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    why = "; ".join(f"{prefix}{k} {reasons[k]}" for k in given)
    if len(given) == 1:
        (name,) = given
        leave = (
            f"it would change nothing; leave {prefix}{name} unset (its default is {params[name].default!r})"
        )
    else:
        leave = "they would change nothing; leave them unset"
    verb = "does" if len(given) == 1 else "do"
    refuse(f"{listed} {verb} not apply to {field}={source!r}: {why}; {data}, so {leave}")
