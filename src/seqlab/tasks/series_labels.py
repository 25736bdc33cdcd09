r"""The label column of a series classification: its classes, the rules a label column meets, the majority
baseline and macro F1 (``seqlab.tasks.series_data`` re-exports what the tasks use).

``series_classification`` makes one class per distinct value of ``task.label``, so a column that measures
something (a temperature, a price) or names each row (a date) would make hundreds of classes of a row or two
each. Such a column is refused, by rules stated in the refusal:

- its values are all numbers, and not all whole ones (``12.8``): a measurement, not a class code (``1`` and
  ``1.0`` are one class);
- more than ``MAX_CLASSES`` (1,000) distinct values, or more than one per two rows: most classes would occur
  once, which neither trains nor scores.

A label is never an input: a column named by ``task.label`` and in ``task.features`` is refused; one of a
built-in series' default features (``task.features`` not given) is left out of them, with a warning.

A run trained before these refusals is rebuilt as it was trained (``seqlab eval``, ``--resume``), with a
warning in place of each refusal (``seqlab.tasks.source_settings.refuse``).
"""

from __future__ import annotations

import contextlib
import logging
import math

import numpy as np

from seqlab.tasks.base import first_named
from seqlab.tasks.source_settings import refuse

log = logging.getLogger("seqlab.tasks")

__all__ = ["MAX_CLASSES", "label_not_an_input", "macro_f1", "majority_class", "read_labels"]

MAX_CLASSES = 1000
"""The most classes a label column may make (and at most one per two rows)."""

AS_TRAINED = "one class per distinct value, as in training"
"""What a saved run's refused label column becomes when the run is rebuilt (``source_settings.refuse``)."""


def read_labels(frame, label: str, source: str) -> tuple[np.ndarray, list[str]]:
    """(class ids (T,), class names sorted) of a label column; a missing label is an error naming its row,
    and a column that looks continuous or makes too many classes (the module docstring) is refused."""
    if label not in frame.columns:
        raise ValueError(f"{source} has no label column {label!r}; its columns: {list(frame.columns)}")
    text = frame[label].astype(str).str.strip().to_numpy()
    empty = np.flatnonzero(text == "")
    if len(empty):
        raise ValueError(f"{source}: the label column {label!r} is empty at data row {int(empty[0]) + 1}")
    text = _one_spelling_per_number(text, label, source)
    classes = sorted(set(text))
    check_classes(classes, len(text), label, source)
    lookup = {c: i for i, c in enumerate(classes)}
    return np.array([lookup[x] for x in text], dtype=np.int64), classes


def _number(text: str) -> float | None:
    with contextlib.suppress(ValueError):
        value = float(text)
        return value if math.isfinite(value) else None
    return None


def check_classes(classes: list[str], n_rows: int, label: str, source: str) -> None:
    """Refuse a label column whose distinct values ``classes`` (of ``n_rows`` rows) look continuous: all
    numbers and not all whole, or more than MAX_CLASSES of them, or more than one per two rows."""
    numbers = [_number(c) for c in classes]
    fractional = [c for c, v in zip(classes, numbers, strict=True) if v is not None and not v.is_integer()]
    setting = f"task.label={label!r}"
    if fractional and None not in numbers:
        refuse(
            f"{source}: {setting} looks continuous: its {len(classes):,} distinct values are numbers, not "
            f"all whole (e.g. {first_named([repr(c) for c in fractional[:3]])}), and series_classification "
            "makes one class per distinct value; give a column of class names or whole-number class codes "
            f"(to predict the number itself: --task.name=forecast --task.column={label})",
            saved=AS_TRAINED,
        )
    most = min(MAX_CLASSES, n_rows // 2)
    if len(classes) > most:
        refuse(
            f"{source}: {setting} holds {len(classes):,} distinct values in {n_rows:,} rows "
            f"({first_named([repr(c) for c in classes])}); series_classification makes one class per "
            f"distinct value and takes at most {MAX_CLASSES:,} classes and at most one per two rows "
            f"({most:,} here): is it a measurement or an identifier? Give a column of class names or codes",
            saved=AS_TRAINED,
        )


def label_not_an_input(label: str, names: list[str], source: str, defaults: bool) -> list[str]:
    """The input columns ``names`` without the label: a label is never an input. Named in ``task.features``
    it is refused; one of the series' default features (``defaults``) is left out of them, with a warning."""
    if label not in names:
        return names
    if not defaults:
        refuse(
            f"task.label={label!r} is also in task.features ({','.join(names)}): a label must never be an "
            "input (the model would read the answer); leave it out of task.features",
            saved="kept as an input, as in training: the run's scores come from reading its label",
        )
        return names
    kept = [n for n in names if n != label]
    log.warning(
        "%s: task.label=%r is one of the default features; left out of the inputs, which are %s",
        source,
        label,
        ",".join(kept),
    )
    return kept


def _one_spelling_per_number(text: np.ndarray, label: str, source: str) -> np.ndarray:
    """``text`` with labels that write one number several ways ('1', '1.0', '01') read as one class, named by
    the spelling that sorts first, and a warning naming them."""
    spellings: dict[float, list[str]] = {}
    for name in sorted(set(text)):
        with contextlib.suppress(ValueError):  # a name, not a number, stays as it is
            spellings.setdefault(float(name), []).append(name)
    same = {s: ways[0] for ways in spellings.values() if len(ways) > 1 for s in ways}
    if not same:
        return text
    groups = sorted({" = ".join(repr(s) for s in ways) for ways in spellings.values() if len(ways) > 1})
    log.warning(
        "%s: the label column %r writes a number more than one way; each read as one class: %s",
        source,
        label,
        "; ".join(groups[:5]),
    )
    return np.array([same.get(x, x) for x in text])


def majority_class(labels: np.ndarray, classes: list[str], span: tuple[int, int], where: str) -> int:
    """The most frequent class id in the training span [a, b), which must hold at least two classes (with one,
    every loss and score would be trivially perfect)."""
    a, b = span
    present = [classes[i] for i in np.unique(labels[a:b])]
    if len(present) < 2:
        raise ValueError(
            f"{where}: the training span (data rows {a + 1}-{b}) holds only the class(es) {present}; "
            f"classification needs at least 2 classes there (all classes: {classes})"
        )
    return int(np.bincount(labels[a:b], minlength=len(classes)).argmax())


def macro_f1(pred: np.ndarray, truth: np.ndarray, n_classes: int) -> float:
    """Mean F1 (scikit-learn's) over the classes that occur in the truth or the predictions: a class absent from
    both has no F1 (counting it as 0 would keep a perfect classifier below 1 on a split that lacks a class);
    one predicted but absent from the truth scores 0. ``n_classes`` bounds the labels."""
    from sklearn.metrics import f1_score

    labels = sorted(set(np.asarray(truth).tolist()) | set(np.asarray(pred).tolist()))
    if labels and not (labels[0] >= 0 and labels[-1] < n_classes):
        raise ValueError(f"class labels must be in [0, {n_classes}), got {labels[0]} .. {labels[-1]}")
    return float(f1_score(truth, pred, labels=labels, average="macro", zero_division=0))
