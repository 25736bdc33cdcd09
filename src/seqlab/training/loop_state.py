"""What the training loop carries between steps: the recurrent state (detached: truncated BPTT), the loss window
of the train records, what a step dropped half-way puts back, and moving nested states between devices."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger("seqlab.train")

__all__ = [
    "StepStart",
    "Window",
    "detach_state",
    "move_to",
    "progress_bar",
    "restored_carry",
    "to_device",
    "train_record",
]


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


class StepStart:
    """The random number generators' states and the carried recurrent state at a step's start: a step dropped
    between two of its ``grad_accum`` batches (a stop signal) puts them back, so that the checkpoint saved then
    is the one the previous step would have written and a resume redoes the step exactly."""

    def __init__(self, carry: Any, device: torch.device):
        self.carry, self.cpu = carry, torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device

    def restore(self) -> Any:
        """Put the generators back; returns the carried state to take up again."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)
        return self.carry


def restored_carry(state: dict[str, Any], world, device: torch.device) -> Any:
    """This rank's carried recurrent state of a checkpoint's trainer ``state``; a change of world size (``world``:
    its size and rank) starts the streams afresh (said)."""
    saved = state.get("carry_ranks") or [state["carry"]]
    if len(saved) == world.size:
        return move_to(saved[world.rank], device)
    if any(c is not None for c in saved):
        log.warning(
            "the recurrent state carried between batches was saved by %d process(es) and is resumed by %d: "
            "it starts afresh at the next batch (the loss is not exactly the uninterrupted run's)",
            len(saved),
            world.size,
        )
    return None


def train_record(step: int, window: Window, lr: float, grad_norm: float | None, elapsed: float, now: float):
    """The train record at ``step``: the mean loss of ``window``, the learning rate, the throughput since the
    window started, the gradient norm before clipping (when clipped), the training seconds so far."""
    return {
        "step": step,
        "split": "train",
        "loss": window.loss / window.n,
        "lr": lr,
        "tokens_per_s": window.tokens / max(now - window.start, 1e-9),
        **({} if grad_norm is None else {"grad_norm": grad_norm}),
        "elapsed_s": round(elapsed, 3),
    }


def progress_bar(show: bool, steps: int, initial: int):
    """The training loop's tqdm bar (``show`` false: None)."""
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=steps, initial=initial, desc="train", dynamic_ncols=True, leave=True)


def move_to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(move_to(o, device) for o in obj))
    if isinstance(obj, tuple | list):
        return type(obj)(move_to(o, device) for o in obj)
    return obj
