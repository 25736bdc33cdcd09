"""What the training loop carries between steps: the recurrent state (detached: truncated BPTT), the loss window
of the train records, and moving nested states between devices."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["Window", "detach_state", "move_to", "to_device"]


def detach_state(state: Any) -> Any:
    """Cut the graph behind a carried recurrent state (truncated BPTT), keeping its values."""
    if isinstance(state, Tensor):
        return state.detach()
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a NamedTuple such as a KV cache
        return type(state)(*(detach_state(s) for s in state))
    if isinstance(state, tuple | list):
        return type(state)(detach_state(s) for s in state)
    return state


def to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@dataclass
class Window:
    """Training loss summed over the ``n`` steps since the last multiple of ``log_every`` (saved with a
    checkpoint, so that a resumed run's records equal the uninterrupted run's), and the tokens since this
    process's last record with when that started (throughput, which a resume does not carry over)."""

    loss: float = 0.0
    n: int = 0
    tokens: int = 0
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def add(self, loss: float, tokens: int) -> None:
        self.loss, self.tokens, self.n = self.loss + loss, self.tokens + tokens, self.n + 1

    def reset(self, now: float, keep_loss: bool = False) -> None:
        """Start a new window; ``keep_loss`` (a record between two multiples of log_every) keeps the loss."""
        if not keep_loss:
            self.loss, self.n = 0.0, 0
        self.tokens, self.start = 0, now

    def restore(self, loss: float = 0.0, n: int = 0) -> None:
        """Take up the loss sums of a window saved with a checkpoint."""
        self.loss, self.n = float(loss), int(n)


def move_to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(move_to(o, device) for o in obj))
    if isinstance(obj, tuple | list):
        return type(obj)(move_to(o, device) for o in obj)
    return obj
