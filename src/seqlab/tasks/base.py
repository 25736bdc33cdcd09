"""The task interface: data, loss and metric for one task. Tasks never import models.

A task talks to any seqlab model through the model protocol:

    out = model(x)                                        # x: token ids (b, t) long, or features (b, t, d_input)
    out, state = model(x, state=state, return_state=True)  # out: (b, t, vocab_size) or (b, t, d_output)

and tells the model factory which sizes the data fixes through ``model_overrides()``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

Batch = dict[str, Tensor]


class Task:
    """Base class. Subclasses set ``name`` and implement the four methods below.

    ``get_batch(split, index)`` is a pure function of the task's seed, the split and the index, so a resumed
    run sees exactly the batches an uninterrupted run would have seen: the data position *is* the index.
    A ``stateful`` task (truncated BPTT over contiguous text) asks the trainer to carry the model state from
    batch ``index`` to ``index + 1``; its batches carry ``"reset"`` (a bool tensor) when the state must start
    afresh.
    """

    name: str = "task"
    stateful: bool = False

    def model_overrides(self) -> dict[str, Any]:
        """Config fields the data fixes, e.g. ``{"vocab_size": 81}`` or ``{"d_input": 2, "d_output": 1}``."""
        raise NotImplementedError

    def get_batch(self, split: str, index: int) -> Batch:
        raise NotImplementedError

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        """(scalar loss to minimise, metrics as floats, new model state or None)."""
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20) -> dict[str, float]:
        """Metrics on the validation split, averaged over ``max_batches`` fixed batches, prefixed ``val_``."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary of the task's settings (written beside checkpoints)."""
        return {"name": self.name}


def generator_for(seed: int, split: str, index: int) -> torch.Generator:
    """A torch.Generator seeded from (seed, split, index): batches are reproducible without saved RNG."""
    split_code = {"train": 0, "val": 1, "test": 2}.get(split)
    if split_code is None:
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    g = torch.Generator()
    g.manual_seed(((seed * 1_000_003 + split_code) * 1_000_000_007 + index) % (1 << 63))
    return g
