"""The task interface: data, loss and metric for one task. Tasks never import models.

A task talks to any seqlab model through the model protocol:

    out = model(x)                                        # x: token ids (b, t) long, or features (b, t, d_input)
    out, state = model(x, state=state, return_state=True)  # out: (b, t, vocab_size) or (b, t, d_output)

and tells the model factory which sizes the data fixes through ``model_overrides()``.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import typing
from typing import Any

import numpy as np
import torch
from torch import Tensor

Batch = dict[str, Tensor]


class MissingDependencyError(RuntimeError):
    """An optional package or data set a task needs is not installed; the message says how to install it."""


class Task:
    """Base class. Subclasses set ``name`` and implement ``model_overrides``, ``get_batch`` and ``loss``.

    ``get_batch(split, index)`` is a pure function of the task's seed, the split and the index, so a resumed
    run sees exactly the batches an uninterrupted run would have seen: the data position *is* the index.
    A ``stateful`` task (truncated BPTT over contiguous text) asks the trainer to carry the model state from
    batch ``index`` to ``index + 1``; its batches carry ``"reset"`` (a bool tensor) when the state must start
    afresh. ``evaluate`` averages the metrics of ``loss`` over validation batches unless a task overrides it;
    ``describe`` reports the task's settings (its constructor's arguments, kept as attributes of the same
    names) and the attributes named in ``derived``.
    """

    name: str = "task"
    stateful: bool = False
    derived: tuple[str, ...] = ()
    """Numbers that follow from the settings (a vocabulary size, the chance baseline), reported by ``describe``."""
    model_families: tuple[str, ...] = ("lm",)
    """The model families (``seqlab.models.FAMILIES``) whose calling convention ``loss`` speaks."""

    def model_overrides(self) -> dict[str, Any]:
        """Config fields the data fixes, e.g. ``{"vocab_size": 81}`` or ``{"d_input": 2, "d_output": 1}``."""
        raise NotImplementedError

    def get_batch(self, split: str, index: int) -> Batch:
        raise NotImplementedError

    def tokens_in(self, batch: Batch) -> int:
        """Tokens a batch counts in throughput figures: every input position unless a task says otherwise."""
        return batch["x"].shape[0] * batch["x"].shape[1]

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        """(scalar loss to minimise, metrics as floats, new model state or None)."""
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        """Mean of ``loss``'s metrics over batches 0..max_batches-1 of ``split`` in eval mode, keys ``{split}_*``.

        All batches have the same size, so the mean of the per-batch means is the mean over all examples.
        """
        check_int("max_batches", max_batches, 1)
        check_split(split)
        was_training = getattr(model, "training", False)
        if hasattr(model, "eval"):
            model.eval()
        try:
            totals: dict[str, float] = {}
            for index in range(max_batches):
                _, metrics, _ = self.loss(model, self.get_batch(split, index))
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
        finally:
            if was_training:
                model.train()
        return {f"{split}_{key}": value / max_batches for key, value in totals.items()}

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary of the task's settings and derived numbers (written beside checkpoints)."""
        params = inspect.signature(type(self).__init__).parameters.values()
        settings = [
            p.name for p in params if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        return {"name": self.name, **{k: getattr(self, k) for k in (*settings, *self.derived)}}


# ---- checks every task shares: one message per kind of mistake -------------------------------------------


def ids_to_decode(ids: Any, vocab_size: int, owner: str) -> list[int]:
    """Token ids (a tensor or a sequence) as a list of ints in [0, vocab_size); a ValueError naming the first
    other one (a negative id read the vocabulary from its end, one past it raised or decoded to nothing)."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    bad = next(  # numpy's integers count (numbers.Integral), booleans do not
        (
            i
            for i in ids
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < vocab_size
        ),
        None,
    )
    if bad is not None:
        raise ValueError(f"{owner}.decode: ids must be integers in [0, {vocab_size}), got {bad!r}")
    return [int(i) for i in ids]


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """True or False (what YAML and the overrides read from true/false); a string like 'nope' is refused,
    not taken as True."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_fraction(name: str, value: Any) -> float:
    """A number strictly between 0 and 1 (a split's share)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def check_index(index: Any) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"batch index must be a non-negative integer, got {index!r}")
    return index


def literal_choices(hint: Any) -> tuple:
    """The choices of a ``Literal[...]`` annotation, None included for ``Literal[...] | None``; () otherwise."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    args = typing.get_args(hint)
    inner = tuple(c for arg in args for c in literal_choices(arg))
    return inner + ((None,) if inner and type(None) in args else ())


def check_choice(name: str, value: Any, hint: Any) -> Any:
    """``value`` is one of the choices of the ``Literal[...]`` annotation ``hint`` (None too where it allows)."""
    choices = literal_choices(hint)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_output(task: str, out: Any, expected: tuple[int, ...], what: str) -> Tensor:
    """The model's output has the shape the task's loss reads; otherwise say how to build the model."""
    if not isinstance(out, Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"{task} expects the model to map its input to {what} of shape {expected}, got {got}; "
            f"build the model with the task's model_overrides()"
        )
    return out


def model_device(model) -> torch.device:
    """Where the model's parameters live (CPU for a parameterless model)."""
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


SPLITS = ("train", "val", "test")
# The seed that splits a user's files (captioned images, clips, speech, translation pairs) into train/val/test,
# whatever the run's own seed: runs of different seeds are scored on the same test items, and no run trains on
# another's. 0, so that the default seed's runs keep the split they always had. (The image folders of
# seqlab.tasks.vision keep their own fixed 12345.)
SPLIT_SEED = 0


def check_split(split: Any) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    return split


def generator_for(seed: int, split: str, index: int) -> torch.Generator:
    """A torch.Generator seeded from (seed, split, index): batches are reproducible without saved RNG."""
    split_code = SPLITS.index(check_split(split))
    g = torch.Generator()
    g.manual_seed(((seed * 1_000_003 + split_code) * 1_000_000_007 + index) % (1 << 63))
    return g


def epoch_rows(seed: int, n: int, index: int, batch_size: int) -> Tensor:
    """(batch_size,) the examples of training batch ``index``: positions ``index * batch_size ...`` of an endless
    sequence of epochs over ``n`` examples, each epoch a permutation seeded by (seed, 'train', epoch), so every
    example is seen once per epoch and a batch is a pure function of its index."""
    positions = torch.arange(index * batch_size, (index + 1) * batch_size)  # (b,) positions in the stream
    epochs, within = positions // n, positions % n
    rows = torch.empty(batch_size, dtype=torch.long)
    for epoch in epochs.unique().tolist():
        order = torch.randperm(n, generator=generator_for(seed, "train", epoch))  # (n,)
        here = epochs == epoch
        rows[here] = order[within[here]]
    return rows


def channel_stats(images: Tensor, channel_dim: int, chunk: int = 256) -> tuple[Tensor, Tensor]:
    """(c,) float32 mean and standard deviation (n - 1) of the uint8 ``images``' values / 255 in each channel
    (``channel_dim``; dim 0 counts the examples), from sums of x and x² kept exactly in integers, ``chunk``
    examples at a time: no float copy of the whole set (50,000 RGB images of 64 px would take 4.9 GB)."""
    if not isinstance(images, Tensor) or images.dtype != torch.uint8 or not 0 < channel_dim < images.dim():
        raise ValueError(
            "channel_stats takes uint8 images (N, ...) with channel_dim past dim 0, got "
            f"{getattr(images, 'dtype', type(images).__name__)} of shape {tuple(getattr(images, 'shape', ()))} "
            f"and channel_dim={channel_dim}"
        )
    dims = tuple(d for d in range(images.dim()) if d != channel_dim)
    s1 = s2 = torch.zeros(images.size(channel_dim), dtype=torch.int64)
    for part in images.split(chunk):
        v = part.to(torch.int64)
        s1, s2 = s1 + v.sum(dims), s2 + (v * v).sum(dims)
    n = images.numel() // max(1, images.size(channel_dim))
    mean = [a / (255 * n) for a in s1.tolist()]  # Python ints: exact until this one rounding
    var = [
        (n * b - a * a) / (255**2 * n * max(1, n - 1)) for a, b in zip(s1.tolist(), s2.tolist(), strict=True)
    ]
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(var, dtype=torch.float64).sqrt().float()


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Within it, torch runs on ``n`` intra-op threads (None: as many as before); the count is restored after."""
    if n is not None:
        check_int("threads", n, 1)
    saved = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


MAX_NAMED = 5
"""Items an error names one by one (missing files, recordings too long); the rest are counted."""


def first_named(items: list[str], sep: str = ", ", last: str = " and") -> str:
    """The first ``MAX_NAMED`` of ``items`` joined by ``sep``, then how many more there are: 'a, b and 3 more'."""
    more = f"{last} {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else ""
    return sep.join(items[:MAX_NAMED]) + more


def spread(rows: np.ndarray, n: int) -> np.ndarray:
    """``rows``, or ``n`` of them spread evenly (the first and last included) when there are more."""
    check_int("n", n, 1)
    return rows if len(rows) <= n else rows[np.linspace(0, len(rows) - 1, n).round().astype(int)]


def stratified_order(labels: Tensor, seed: int) -> Tensor:
    """(N,) a permutation of the N examples with ``labels`` (N,): first one example of each of the K classes,
    then the others with each class spread evenly, so that every stretch of them (from the K-th entry to
    any point, or from any point to the end) holds each class in its share to within one example. A split
    that cuts its evaluation parts from the end (or, flipped, from the front) keeps every class in training
    and gives each evaluation part the classes in proportion: a rare class is not left to a random cut.

    Each class's examples are shuffled; after the leaders, position m takes the next example of the class
    furthest behind its share, argmax_c (m + 1) r_c / R - taken_c (r_c of the class's R remaining examples),
    which keeps every class within one example of its share at every m.
    """
    g = torch.Generator().manual_seed(seed)
    classes = torch.unique(labels)
    members = [
        torch.nonzero(labels == c).flatten() for c in classes[torch.randperm(len(classes), generator=g)]
    ]
    members = [rows[torch.randperm(len(rows), generator=g)] for rows in members]  # each class shuffled
    rest = np.array([len(rows) - 1 for rows in members], dtype=np.float64)
    share, taken = rest / max(rest.sum(), 1.0), np.zeros(len(members))
    order = [int(rows[0]) for rows in members]  # one of each class first
    for m in range(int(rest.sum())):
        c = int(np.argmax((m + 1) * share - taken))  # ties: the first of the shuffled classes
        taken[c] += 1
        order.append(int(members[c][int(taken[c])]))
    return torch.tensor(order, dtype=torch.long)
